"""What SGLang's admission sets aside for a request, under zipage.

A request that compresses may still add, before its footprint stops growing, what is left
to its budget's limit (budget.Budget.reserve); a new one reserves its prompt plus budget +
buffer + a page (hooks set SGLang's CLIP_MAX_NEW_TOKENS to that). A request that never
compresses (zipage_kv_budget 0), or whose answer grows (segments.py), keeps SGLang's own
estimate: its remaining tokens, clipped at CLIP_MAX_NEW_TOKENS. Duck-types SGLang's Req.
"""

from __future__ import annotations

from typing import Optional

from sglang_zipage import request_state


class Admission:
    def __init__(self, budget_of, stock_clip: int = 4096):
        self.budget_of = budget_of  # req -> its Budget, or None (planner.Planner.budget_of)
        self.stock_clip = stock_clip  # SGLang's output estimate (CLIP_MAX_NEW_TOKENS)

    def running_reserve(self, req) -> Optional[int]:
        """Tokens a running request may still add; None when SGLang's estimate applies."""
        budget = self.budget_of(req)
        st = getattr(req, "zipage", None)
        if budget is None or (st is not None and st.answer_col is not None):
            return None
        remaining = req.sampling_params.max_new_tokens - len(req.output_ids)
        return budget.reserve(request_state.suffix_len(req, budget), remaining)

    def stock_reserve(self, req) -> int:
        """SGLang's own estimate of what a request that never compresses may still add."""
        return min(req.sampling_params.max_new_tokens - len(req.output_ids), self.stock_clip)

    def view(self, req) -> int:
        """What admission sets aside for a running request (before SGLang's new-token ratio)."""
        own = self.running_reserve(req)
        return self.stock_reserve(req) if own is None else own

    def need(self, req) -> int:
        """What a waiting request needs to be admitted: its prompt and its reserve."""
        budget = self.budget_of(req)
        return len(req.origin_input_ids) + (budget.admission_reserve() if budget
                                            else self.stock_reserve(req))
