"""Reasoning segments: a request's thinking segment compresses, its answer never does.

Reasoning models write a long thinking segment, closed by a marker (``</think>``; the marker
of SGLang's --reasoning-parser, or --zipage-think-end, or the request's zipage_think_end),
then a short answer. While a request thinks it compresses as any output. Once its output
holds the marker (``scan``, on the token ids the scheduler already has), the columns from the
marker on are its answer: never evicted, growing freely (admission counts them as SGLang does
an uncompressed request's). Its thinking segment, [c0, answer) rounded down to whole pages,
is compacted once more (``answer_cut``): down to the answer budget if there is one, scored
with the first W queries of the answer (what the answer attends to), else down to the budget
only if it grew past its limit; the answer's columns then move right behind the kept tokens
(compaction.shift_tail). After that the request is never compacted again. Not on hybrid
sliding-window pools (gpt-oss without --disable-hybrid-swa-memory), whose window remap
assumes the compressed span ends the request.
"""

from __future__ import annotations

from typing import List, Optional, Sequence, Tuple

from sglang_zipage import request_options
from sglang_zipage.budget import floor_page


def find(tokens: Sequence[int], marker: List[int], start: int = 0) -> int:
    """Index of the first occurrence of ``marker`` in ``tokens`` at or after ``start``, or -1."""
    n = len(marker)
    for i in range(max(0, start), len(tokens) - n + 1):
        if tokens[i] == marker[0] and list(tokens[i:i + n]) == marker:
            return i
    return -1


class Segments:
    def __init__(self, answer_budget: int = 0):
        self.answer_budget = answer_budget  # the server's --zipage-answer-budget (0: none)

    def answering(self, req, st, window, stats) -> bool:
        """The request writes its answer (its marker found now or before). When it starts,
        its window refills with the answer's queries, which score the thinking segment's
        last compaction."""
        if st.answer_col is not None:
            return True
        if not self.scan(req, st):
            return False
        stats.add("answers_started")
        if st.has_window or window.assign(req.req_pool_idx):
            st.took_window(req.decode_batch_idx)
        return True

    def scan(self, req, st) -> bool:
        """Look for the request's think-end marker in the output it added since the last scan;
        True when its answer starts (st.answer_col set: the marker's column, I5)."""
        marker = request_options.think_end_of(req)
        out = req.output_ids
        if not marker or len(out) < len(marker):
            return False
        j = find(out, marker, st.think_scanned - len(marker) + 1)
        st.scanned(len(out))
        if j < 0:
            return False
        st.answer_starts(len(req.origin_input_ids) + j - st.pos_offset)
        return True

    def answer_cut(self, req, st, budget, page: int, stats) -> Optional[Tuple[int, int, int]]:
        """The thinking segment's last compaction when it is due (its window is full, or it
        has no slot): (thinking columns, tokens kept, answer columns after them), which the
        planner makes its compaction item of; None while it waits or once nothing is left
        to do (st.answer_done)."""
        if st.answer_done:
            return None
        thinking = floor_page(max(0, st.answer_col - st.c0), page)
        own = request_options.answer_budget_of(req, self.answer_budget)
        k = own if own else (budget.kv_budget if thinking > budget.limit else 0)
        k = min(k, thinking) if k else 0
        if not k or thinking <= k or thinking - k < page:
            st.answer_finished()
            return None
        if not budget.can_score(st, req.decode_batch_idx):
            return None
        st.answer_finished()
        stats.add("answer_compactions")
        return thinking, k, req.kv_committed_len - st.c0 - thinking
