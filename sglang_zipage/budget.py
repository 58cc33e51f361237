"""Budget accounting: what a request may hold and reserve, and when it must compress.

Plain Python over ints (no torch, no sglang), so the policy is testable on its own.

A request's KV columns in ``req_to_token`` are laid out as
    [0, c0)          prompt pages: owned by the radix tree, shared, never compressed
    [c0, kv_len)     its decode suffix (plus the prompt's partial last page): compressible

Invariants (checked where they are established; tests call the checkers):
  I1  req_to_token[r, j] % page == j % page   (SGLang's paged allocator invariant)
  I2  c0, the kept count k and every freed column range start on a page boundary
  I3  columns below c0 are never moved or freed by compaction
  I4  a compressed request's KV never enters the radix tree (skip_radix_cache_insert), nor
      does the output KV a retracted request re-prefills (it must stay compressible)
  I5  logical position = physical length + pos_offset
  I6  suffix length <= kv_budget + buffer at every decode step (fixed mode; in elastic mode
      a suffix grows past it while the pool has room, and is compacted on demand)

Query-window slots (query_window.py; as many as memory.py fits):
  W1  a request holds a slot from W decode steps before its trigger until its compaction
      is planned (or it leaves), so the slots serve the requests near a compaction; where
      the next window starts within W tokens of a compaction (``keeps_window``) it keeps it
  W2  a request that reaches its trigger without a slot is compacted without a window (its
      most recent tokens kept): a missing slot never lets a suffix outgrow its limit

Elastic mode has two states (``Pressure``): *room*, where requests keep their full KV, and
*pressure*, entered when the pool ran short, where every request compresses at its limit as in
fixed mode. It leaves pressure only once nothing waits and the free pool could take what every
running request may still write: the hysteresis that keeps a busy pool from thrashing between
growing and compacting (growing past the limits would fill it and read more KV every step).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Dict, Optional

from sglang_zipage.config import ZipageConfig, async_lag
from sglang_zipage.request_state import ReqState



def floor_page(n: int, page: int) -> int:
    return n // page * page


@dataclass(frozen=True)
class Budget:
    kv_budget: int
    buffer: int
    window: int
    page_size: int = 1
    lag: int = 0  # asynchronous mode: compactions start this many tokens before the limit
    elastic: bool = False  # compact only on demand (pressure), not at the limit

    @classmethod
    def from_config(cls, config: ZipageConfig, page_size: int = 1) -> "Budget":
        """The server's budget: the config's budget, buffer and window on this page size."""
        lag = async_lag(page_size) if config.async_compaction else 0
        return cls(config.kv_budget, config.buffer, config.window, page_size, lag,
                   elastic=config.mode == "elastic")

    def __post_init__(self):
        assert self.kv_budget % self.page_size == 0, "I2: kv_budget must be page aligned"
        assert self.buffer % self.page_size == 0, "I2: buffer must be page aligned"
        assert self.lag % self.page_size == 0 and self.lag < self.buffer, "lag"

    @property
    def limit(self) -> int:
        """Most decode-suffix tokens a request ever holds (I6)."""
        return self.kv_budget + self.buffer

    @property
    def trigger(self) -> int:
        """Suffix length at which a compaction starts: the limit, or ``lag`` tokens
        before it when compactions run asynchronously (they finish by the limit)."""
        return self.limit - self.lag

    def compress_start(self, cache_protected_len: int, prompt_len: int) -> int:
        """c0: the prompt's full pages (and whatever the radix tree protects) stay."""
        return max(cache_protected_len, floor_page(prompt_len, self.page_size))

    def wants_window(self, state: ReqState, suffix: int) -> bool:
        """Ask for a window slot W decode steps before the trigger. Fixed mode asks at that
        step only: a slot taken later could not fill before the limit (W1). Elastic mode
        asks at every step from then on (its requests grow past the limit while there is room)."""
        if state.window_since >= 0:
            return False
        start = self.trigger - self.window
        return suffix >= start if self.elastic else suffix == start

    @property
    def keeps_window(self) -> bool:
        """The next window starts within W tokens of a compaction (buffer - lag <= W): a
        request keeps its slot across compactions rather than miss its next start (W1)."""
        return self.buffer - self.lag <= self.window

    def window_ready(self, state: ReqState, decode_idx: int) -> bool:
        return state.window_since >= 0 and decode_idx - state.window_since >= self.window

    def can_score(self, state: ReqState, decode_idx: int) -> bool:
        """A compaction may run now: with a full window, or windowless when the request
        holds no slot (W2); a slot still filling is waited for."""
        return state.window_since < 0 or self.window_ready(state, decode_idx)

    def needs_compaction(self, state: ReqState, suffix: int, decode_idx: int,
                         pressed: bool = False) -> bool:
        """At the trigger: in fixed mode, and in elastic mode while the pool is under
        pressure (else never on its own: see can_yield)."""
        return ((not self.elastic or pressed) and suffix >= self.trigger
                and self.can_score(state, decode_idx))

    def can_yield(self, state: ReqState, suffix: int, decode_idx: int) -> int:
        """Elastic mode: tokens a compaction down to kv_budget would free now, or 0. Only a
        suffix at the limit or past it yields, so after a compaction a request decodes at
        least ``buffer`` tokens before it yields again (no thrashing)."""
        if suffix < self.limit or not self.can_score(state, decode_idx):
            return 0
        return suffix - self.kv_budget

    def reserve(self, suffix: int, remaining_new_tokens: int) -> int:
        """Tokens a running request may still add before its footprint stops growing."""
        return max(0, min(remaining_new_tokens, self.limit - suffix))

    def admission_reserve(self) -> int:
        """Per-request decode reservation for a new request (plus its last prompt page)."""
        return self.limit + self.page_size


class Budgets:
    """The server's budget and the per-request ones (``zipage_kv_budget``), one Budget per
    kept count. A request's own budget below the model's sliding window is raised to it (page
    aligned): the sliding-window layers need that many tokens kept."""

    def __init__(self, server: Budget, min_kv_budget: int = 1):
        self.server = server
        page = server.page_size
        self.floor = -(-min_kv_budget // page) * page
        self._own: Dict[int, Budget] = {}

    def of(self, own: Optional[int], boost: int = 1) -> Optional[Budget]:
        """own: the request's zipage_kv_budget, or None (the server's); 0: no compression.
        boost: the loop guard's multiplier (repetition.py)."""
        if own == 0:
            return None
        kv = (self.server.kv_budget if own is None else max(own, self.floor)) * boost
        if kv == self.server.kv_budget:
            return self.server
        if kv not in self._own:
            self._own[kv] = dataclasses.replace(self.server, kv_budget=kv)
        return self._own[kv]


@dataclass
class Pressure:
    """Elastic mode's state: under pressure or not, and how often it was entered."""

    on: bool = False
    episodes: int = 0

    def ran_short(self) -> None:
        """The pool could not give a decode step its pages, or the first waiting request."""
        if not self.on:
            self.on = True
            self.episodes += 1

    def settle(self, room: int, demand: int, waiting: int) -> bool:
        """Leave pressure once nothing waits and ``room`` (free + evictable slots) covers
        ``demand`` (what the running requests may still write). Returns the state."""
        if self.on and waiting == 0 and room >= demand:
            self.on = False
        return self.on


def check_i2(c0: int, k: int, page: int) -> None:
    assert c0 % page == 0 and k % page == 0, f"I2: c0={c0} k={k} page={page}"


def check_i6(state: ReqState, budget: Budget) -> None:
    assert state.max_suffix <= budget.limit, f"I6: suffix {state.max_suffix} > {budget.limit}"
