"""One decode step's decision for each running request, computed once from its state.

``RequestBudgets`` says what budget a request has now (its own or the server's, times the
loop guard's raise, or its floor while squeezed) and what admission books it at.
``StepPolicy.decide`` takes a request's state at a decode step to one ``Decision``:

  keep     nothing this step (below its trigger, its window still filling, its answer growing)
  compact  down to its budget now: at its trigger in fixed mode, or in elastic mode under
           pressure (budget W1/W2: with its window, or windowless when it holds no slot)
  shadow   the same into fresh slots, a few tokens before its limit (--zipage-async)
  commit   its asynchronous compaction's columns switch over at its limit (shadows.py)
  cut      its answer started: its thinking segment is compacted once more (segments.py)

Deciding records the events it meets in the request's state: its unshared prompt taken
(own_prompt.py), its budget raised by the loop guard (repetition.py), a window slot taken
(query_window.py). What room the pool needs beyond this (elastic mode) is room.py's; the
plans are the planner's (planner.py). Duck-types SGLang's Req; imports no sglang.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from sglang_zipage import request_options, request_state
from sglang_zipage.budget import Budget, Budgets


@dataclass(frozen=True)
class Decision:
    action: str  # keep | compact | shadow | commit | cut
    suffix: int = 0  # columns compacted (cut: the thinking segment's; commit: the suffix now)
    kept: int = 0  # tokens kept per (layer, KV head)
    tail: int = 0  # cut: the answer's columns after the thinking segment


KEEP = Decision("keep")


class RequestBudgets:
    """What budget each request has, from the server's Budgets and the request's options."""

    def __init__(self, budgets: Budgets):
        self.budgets = budgets

    @property
    def server(self) -> Budget:
        return self.budgets.server

    def budget_of(self, req) -> Optional[Budget]:
        """Its own zipage_kv_budget, the server's, or None (off), times what the loop guard
        gave it; or its floor while it is squeezed (budget A3)."""
        st = getattr(req, "zipage", None)
        if st is None:
            return self.budgets.of(request_options.of(req))
        return self.budgets.of(request_options.of(req), st.loop_boost, st.squeezed_to)

    def floor(self, req, boosted: bool = True) -> int:
        """The kept count a squeeze leaves it (A3), times the loop guard's raise if
        ``boosted`` (at a decode step short of pages the raise goes back too: A2)."""
        st = getattr(req, "zipage", None)
        floor = self.budgets.floor(request_options.of(req), request_options.min_of(req))
        return floor * (st.loop_boost if boosted and st is not None else 1)

    def floor_of(self, req) -> Optional[Budget]:
        """The budget a squeeze leaves it; None when that is not below its budget."""
        budget = self.budget_of(req)
        if budget is None or not budget.elastic:
            return None
        floor = self.floor(req)
        if floor >= budget.kv_budget:
            return None
        return self.budgets.of(request_options.of(req), squeezed_to=floor)

    def booked(self, req) -> Optional[Budget]:
        """What admission books it at (A1): with a budget range its floor, the least that
        requests waiting or a step short of pages make it hold (A2, A3); else its budget."""
        return self.floor_of(req) or self.budget_of(req)

    def problem(self, req) -> Optional[str]:
        """Why the request's own budget or floor cannot be served (below the model's sliding
        window), or None: it is refused when it arrives (HTTP 400)."""
        bad = self.budgets.problem(request_options.of(req), request_options.min_of(req))
        if bad is None:
            return None
        field, value = bad
        return (f"{field} {value} is below this model's sliding window ({self.budgets.least} "
                f"tokens), which its sliding-window layers must keep; use "
                f"{self.budgets.least} or more (page aligned)")


class StepPolicy:
    def __init__(self, budgets: RequestBudgets, window, stats, *, own_prompt=None,
                 loop_guard=None, segments=None, page_size: int = 1):
        self.budgets = budgets
        self.window = window  # the query window's slots (query_window.py)
        self.stats = stats
        self.own_prompt = own_prompt  # --zipage-compress-prompt (own_prompt.py), or None
        self.loop_guard = loop_guard  # repetition.py, or None (--zipage-no-loop-guard)
        self.segments = segments  # thinking and answer (segments.py), or None
        self.page_size = page_size

    def decide(self, req, st, budget: Budget, pressed: bool, batch) -> Decision:
        """This step's decision for a running request with a budget (``st``: its state)."""
        ready = self._take_prompt(req, st, budget, batch)
        if self.loop_guard and st.compactions and self.loop_guard.watch(st, req.output_ids):
            self.stats.loop_guard()
            budget = self.budgets.budget_of(req)
        suffix = req.kv_committed_len - st.c0
        if st.shadow is not None:  # in flight: commit at the limit. Never earlier on a
            # GPU-timing probe: tensor-parallel ranks must take the same step everywhere.
            return Decision("commit", suffix) if suffix >= budget.limit else KEEP
        if self.segments is not None and self.segments.answering(req, st, self.window, self.stats):
            cut = self.segments.answer_cut(req, st, budget, self.page_size, self.stats)
            return KEEP if cut is None else Decision("cut", cut[0], cut[1], cut[2])
        st.saw_suffix(suffix)
        self.stats.suffix(suffix)
        if budget.wants_window(st, suffix) and not self.take_window(req, st):
            self.stats.add("window_slot_misses")
        # one whose prompt reaches the tree after this step compacts once it took it
        if not ready or not budget.needs_compaction(st, suffix, req.decode_batch_idx, pressed):
            return KEEP
        if budget.lag and suffix < budget.limit:
            return Decision("shadow", suffix, budget.kv_budget)
        self.stats.add("async_fallbacks", budget.lag > 0)
        return Decision("compact", suffix, budget.kv_budget)

    def take_window(self, req, st) -> bool:
        """A query-window slot for the request from this step on, if one is free (W1)."""
        if not self.window.assign(req.req_pool_idx):
            return False
        st.took_window(req.decode_batch_idx)
        return True

    def _take_prompt(self, req, st, budget: Budget, batch) -> bool:
        """--zipage-compress-prompt: its unshared prompt pages join its suffix before its
        first compaction. False while its prompt is not in the tree yet (asked again)."""
        if self.own_prompt is None or not st.prompt_asks or st.n_stored:
            return True
        moved = self.own_prompt.take(req, st, batch)
        st.asked_for_prompt(later=moved is None)
        if (moved and budget.window_scored and not st.has_window
                and budget.trigger - budget.window <= req.kv_committed_len - st.c0):
            # its own prompt put it past its window's start: the window fills from here,
            # and its compaction waits for it (else W2, windowless)
            self.take_window(req, st)
        return moved is not None


def running(reqs, budgets: RequestBudgets):
    """(row, request, its state, its budget) of the running requests that compress."""
    for i, req in enumerate(reqs):
        budget = budgets.budget_of(req) if not req.finished() else None
        if budget is not None and req.req_pool_idx is not None:
            yield i, req, request_state.state_of(req, budgets.server), budget
