"""What SGLang's admission sets aside for the running requests, under zipage.

A compressing request's growth is bounded and its end is known at the latest, so the
running requests' growth is booked together, at its peak (budget.py A1, ``growths``), not as
each one's worst case: SGLang's per-request estimate is 0 for them (``compresses``). A new
one is charged its prompt, a page and what it adds to that peak (``marginal``): while the
running ones are about to end, a new one is admitted before they have ended (the hooks give
SGLang's CLIP_MAX_NEW_TOKENS that value while SGLang considers it; elsewhere, e.g. a chunked
prefill's last chunk, it stays budget + buffer + a page). A request that never compresses
(zipage_kv_budget 0), or whose answer grows (segments.py), keeps SGLang's own estimate: its
remaining tokens, clipped at SGLang's CLIP_MAX_NEW_TOKENS, times SGLang's new-token ratio.
Duck-types SGLang's Req.
"""

from __future__ import annotations

from typing import List, Optional, Tuple

from sglang_zipage import request_state
from sglang_zipage.budget import Budget, peak_growth


END_LAG = 2  # decode steps between a request's last token and its KV back in the pool
# (the overlap scheduler frees it when it processes that step's results)


class Admission:
    def __init__(self, budget_of, stock_clip: int = 4096):
        self.budget_of = budget_of  # req -> its Budget, or None (planner.Planner.budget_of)
        self.stock_clip = stock_clip  # SGLang's output estimate (CLIP_MAX_NEW_TOKENS)

    def compresses(self, req) -> Optional[Budget]:
        """The request's budget when its growth is bounded by it, else None."""
        budget = self.budget_of(req)
        st = getattr(req, "zipage", None)
        if budget is None or (st is not None and st.answer_col is not None):
            return None
        return budget

    def growth(self, req, budget: Budget) -> Tuple[int, int, int]:
        """A1's (g, r, d) of a running compressing request."""
        remaining = max(0, req.sampling_params.max_new_tokens - len(req.output_ids))
        suffix = request_state.suffix_len(req, budget)
        return (budget.reserve(suffix, remaining), remaining + END_LAG,
                min(suffix, budget.limit))

    def growths(self, reqs) -> List[Tuple[int, int, int]]:
        """A1's (g, r, d) of the running compressing requests of ``reqs``."""
        out = []
        for r in reqs:
            budget = None if r.finished() else self.compresses(r)
            if budget is not None:
                out.append(self.growth(r, budget))
        return out

    def newcomer(self, req) -> Optional[Tuple[int, int, int]]:
        """A1's (g, r, d) of a waiting request once admitted (its suffix starts with the
        output it already has, a retracted request's), or None if it does not compress."""
        budget = self.budget_of(req)
        if budget is None:
            return None
        remaining = max(0, req.sampling_params.max_new_tokens - len(req.output_ids))
        return budget.reserve(len(req.output_ids), remaining), remaining + END_LAG, 0

    def marginal(self, growths, req) -> Optional[int]:
        """What admitting ``req`` adds to the peak of ``growths`` (the running requests and
        those admitted before it in this pass), or None if it does not compress."""
        mine = self.newcomer(req)
        if mine is None:
            return None
        return peak_growth([*growths, mine]) - peak_growth(growths)

    def stock_reserve(self, req) -> int:
        """SGLang's own estimate of what a request that never compresses may still add."""
        return min(req.sampling_params.max_new_tokens - len(req.output_ids), self.stock_clip)

    def reserved(self, reqs, growths, ratio: float) -> float:
        """All that admission sets aside for the running ``reqs``: the peak of the
        compressing ones' ``growths``, SGLang's estimate (times its new-token ratio) for the
        others."""
        others = sum(self.stock_reserve(r) for r in reqs
                     if not r.finished() and self.compresses(r) is None)
        return peak_growth(growths) + others * ratio

    def need(self, req, growths, page: int) -> int:
        """What a waiting request needs to be admitted beside the running requests of
        ``growths``: its prompt, a page and what it adds to their peak (or SGLang's estimate)."""
        extra = self.marginal(growths, req)
        return len(req.origin_input_ids) + page + (self.stock_reserve(req) if extra is None
                                                   else extra)
