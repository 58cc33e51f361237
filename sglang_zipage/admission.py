"""What SGLang's admission sets aside for the running requests, under zipage.

A compressing request's growth is bounded and its end is known at the latest, so the
running requests' growth is booked together, at its peak (budget.py A1, ``growths``), not as
each one's worst case: SGLang's per-request estimate is 0 for them (``compresses``). Those
that already hold their budget give back a buffer every buffer steps (A1c), so theirs is
booked as that cycle's peak, not as their rise to the limit (``Booking``). A new
one is charged its prompt, a page and what it adds to that peak (``marginal``): while the
running ones are about to end, a new one is admitted before they have ended (the hooks give
SGLang's CLIP_MAX_NEW_TOKENS that value while SGLang considers it; elsewhere, e.g. a chunked
prefill's last chunk, it stays budget + buffer + a page). A request that never compresses
(zipage_kv_budget 0), or whose answer grows (segments.py), keeps SGLang's own estimate: its
remaining tokens, clipped at SGLang's CLIP_MAX_NEW_TOKENS, times SGLang's new-token ratio.
Duck-types SGLang's Req.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import List, Optional, Tuple

from sglang_zipage import request_state
from sglang_zipage.budget import Budget, cycle_peak, peak_growth


END_LAG = 2  # decode steps between a request's last token and its KV back in the pool
# (the overlap scheduler frees it when it processes that step's results); a compaction's
# freed pages are counted as late


@dataclass
class Booking:
    """The running requests' growth for one admission pass: A1's (g, r, d) and A1c's first
    drops (all budgets share the buffer and lag, so one period)."""

    rising: List[Tuple[int, int, int]] = field(default_factory=list)
    drops: List[int] = field(default_factory=list)
    period: int = 1
    fixed: int = 0  # speculative reserve columns they will hold from their next step on

    def peak(self) -> int:
        """What admission sets aside for them: A1's peak plus A1c's, and the speculative
        reserve they do not hold yet."""
        return peak_growth(self.rising) + cycle_peak(self.drops, self.period) + self.fixed

    def add(self, newcomer: Tuple[int, int, int]) -> None:
        """A request admitted in this pass (it starts below its budget: A1)."""
        self.rising.append(newcomer)


class Admission:
    """Speculative decoding (``tokens_per_step`` > 1: a step commits 1 .. tokens_per_step
    tokens, and ``speculative_reserve`` columns past the committed ones are held from a
    request's first decode step on): A1's time runs in tokens, so a request grows as fast as
    a step can commit and ends as late as one token a step would end it; it may pass its
    limit by tokens_per_step - 1 before its compaction; A1c is not used (its phases drift
    when steps commit varying counts); the reserve is charged at once."""

    def __init__(self, budget_of, stock_clip: int = 4096, speculative_reserve: int = 0,
                 tokens_per_step: int = 1):
        self.budget_of = budget_of  # req -> its Budget, or None (planner.Planner.budget_of)
        self.stock_clip = stock_clip  # SGLang's output estimate (CLIP_MAX_NEW_TOKENS)
        self.speculative_reserve = speculative_reserve  # (server_args.speculative_reserve)
        self.tokens_per_step = tokens_per_step

    def _rise(self, budget: Budget, suffix: int, remaining: int, held: int):
        """A1's (g, r, d) of a request that holds ``suffix`` tokens, ``held`` of them
        released at its end, in token time."""
        k = self.tokens_per_step
        return budget.reserve(suffix, remaining) + k - 1, (remaining + END_LAG) * k, held

    def compresses(self, req) -> Optional[Budget]:
        """The request's budget when its growth is bounded by it, else None."""
        budget = self.budget_of(req)
        st = getattr(req, "zipage", None)
        if budget is None or (st is not None and st.answer_col is not None):
            return None
        return budget

    def book(self, req, budget: Budget, booking: Booking) -> None:
        """A running compressing request into ``booking``: A1's (g, r, d), or, holding at
        least its budget and at most its limit, A1c's first drop beside (0, r, budget)."""
        remaining = request_state.remaining_tokens(req)
        suffix = request_state.suffix_len(req, budget)
        if self.speculative_reserve:
            booking.fixed += max(0, self.speculative_reserve - request_state.in_flight(req))
        to_cycle = (budget.steps_to_cycle(suffix, remaining) if self.tokens_per_step == 1
                    else None)
        if to_cycle is not None:
            booking.rising.append((0, remaining + END_LAG, budget.kv_budget))
            booking.drops.append(to_cycle + END_LAG)
            booking.period = budget.cycle
        else:
            booking.rising.append(self._rise(budget, suffix, remaining,
                                             min(suffix, budget.limit)))

    def growths(self, reqs) -> Booking:
        """The growth of the running compressing requests of ``reqs`` (A1, A1c)."""
        booking = Booking()
        for r in reqs:
            budget = None if r.finished() else self.compresses(r)
            if budget is not None:
                self.book(r, budget, booking)
        return booking

    def single_request_room(self, reqs) -> int:
        """What a PD decode server keeps free so that the largest running request could end
        alone were all the others retracted (SGLang: max over them of prompt +
        min(max_new_tokens, CLIP_MAX_NEW_TOKENS), less the tokens they all hold). A
        compressing request ends within its limit: its own need is the columns it holds plus
        what it may still add before its footprint stops growing; each holds its columns, not
        its logical length. One that does not compress keeps SGLang's need."""
        needs = []
        for r in reqs:
            budget = self.compresses(r)
            if budget is None:
                needs.append(len(r.origin_input_ids)
                             + min(r.sampling_params.max_new_tokens, self.stock_clip))
                continue
            remaining = request_state.remaining_tokens(r)
            rise = budget.reserve(request_state.suffix_len(r, budget), remaining)
            needs.append(r.kv_committed_len + rise + self.tokens_per_step - 1
                         + self.speculative_reserve)
        return max(needs, default=0) - sum(r.kv_committed_len for r in reqs)

    def newcomer(self, req) -> Optional[Tuple[int, int, int]]:
        """A1's (g, r, d) of a waiting request once admitted (its suffix starts with the
        output it already has, a retracted request's), or None if it does not compress."""
        budget = self.budget_of(req)
        if budget is None:
            return None
        remaining = request_state.remaining_tokens(req)
        return self._rise(budget, len(req.output_ids), remaining, 0)

    def marginal(self, growths: Booking, req) -> Optional[int]:
        """What admitting ``req`` adds to the peak of ``growths`` (the running requests and
        those admitted before it in this pass), or None if it does not compress. (A1c's
        peak is the same either way.)"""
        mine = self.newcomer(req)
        if mine is None:
            return None
        return (peak_growth([*growths.rising, mine]) - peak_growth(growths.rising)
                + self.speculative_reserve)

    def step_slots(self, reqs, page: int) -> int:
        """The slots the next decode step of ``reqs`` may allocate: a page per request, or
        with speculative decoding what tops each one's reserve up again (SGLang's
        new_tokens_required_next_decode at page size 1)."""
        if not self.speculative_reserve:
            return len(reqs) * page
        return sum(max(0, self.speculative_reserve - request_state.in_flight(r)) for r in reqs)

    def stock_reserve(self, req) -> int:
        """SGLang's own estimate of what a request that never compresses may still add."""
        return min(req.sampling_params.max_new_tokens - len(req.output_ids), self.stock_clip)

    def reserved(self, reqs, growths: Booking, ratio: float) -> float:
        """All that admission sets aside for the running ``reqs``: the peak of the
        compressing ones' ``growths``, SGLang's estimate (times its new-token ratio) for the
        others."""
        others = sum(self.stock_reserve(r) for r in reqs
                     if not r.finished() and self.compresses(r) is None)
        return growths.peak() + others * ratio

    def need(self, req, growths, page: int) -> int:
        """What a waiting request needs to be admitted beside the running requests of
        ``growths``: its prompt, a page and what it adds to their peak (or SGLang's estimate)."""
        extra = self.marginal(growths, req)
        return len(req.origin_input_ids) + page + (self.stock_reserve(req) if extra is None
                                                   else extra)
