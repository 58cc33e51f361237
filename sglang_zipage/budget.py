"""Budget accounting: what a request may hold and reserve, and when it must compress.

Plain Python over ints (no torch, no sglang), so the policy is testable on its own.

A request's KV columns in ``req_to_token`` are laid out as
    [0, c0)          prompt pages: owned by the radix tree, shared, never compressed
    [c0, kv_len)     its decode suffix (plus the prompt's partial last page): compressible
With --zipage-compress-prompt, c0 drops below the prompt pages no other running request
holds, once the request copied them into pages of its own (own_prompt.py).

Invariants (checked where they are established; tests call the checkers):
  I1  req_to_token[r, j] % page == j % page   (SGLang's paged allocator invariant)
  I2  c0, the kept count k and every freed column range start on a page boundary
  I3  columns below c0 are never moved or freed by compaction
  I4  a compressed request's KV never enters the radix tree (skip_radix_cache_insert), nor
      does the output KV a retracted request re-prefills (it must stay compressible)
  I5  logical position = physical length + pos_offset
  I6  suffix length <= kv_budget + buffer at every decode step (fixed mode; in elastic mode
      a suffix grows past it while the pool has room, and is compacted on demand; a suffix
      that starts past it with its own prompt holds until its first compaction, W1)

Query-window slots (query_window.py; as many as memory.py fits):
  W1  a request holds a slot from W decode steps before its trigger until its compaction
      is planned (or it leaves), so the slots serve the requests near a compaction; where
      the next window starts within W tokens of a compaction (``keeps_window``) it keeps it;
      one whose own prompt starts its suffix past that step takes a slot at its first decode
      step and is compacted once the window is full
  W2  a request that reaches its trigger without a slot is compacted without a window (its
      most recent tokens kept): a missing slot never lets a suffix outgrow its limit

Admission books what the running requests will hold, not each one's worst case:
  A1  a compressing request i may still add g_i = min(remaining_i, limit_i - suffix_i)
      tokens; its KV is back in the pool within r_i = remaining_i + 2 decode steps (the
      overlap scheduler frees it a step after its last one), at least d_i = min(suffix_i,
      limit_i) of it. t steps from now the running requests hold
      F(t) = sum_{r_i > t} min(t, g_i) - sum_{r_i <= t} d_i more than now, and admission
      sets aside peak(F) = max_t F(t) >= 0 (``peak_growth``) rather than sum g_i; a new
      request is charged its prompt, a page and what it adds to the peak (g = its limit,
      d = 0). limit_i is that of the budget it is booked at: with a budget range its floor
      (A3), the least it can be made to hold, so admission overbooks the budgets and the
      pool squeezes them (A2, A3). Exact where outputs run to max_new_tokens and budgets
      hold; where outputs stop earlier, the peak only overstates.
  A1c a request that already holds at least its budget compacts at its limit: it rises a
      token a step and gives back P = buffer - lag tokens every P steps, the first time
      f_i = limit_i - suffix_i + END_LAG steps from now (admission.py; the overlap
      scheduler frees pages a step late). It is booked apart from A1's (g = 0, d = its
      budget, the least it holds between drops), and admission sets aside the peak of
      C(t) = n t - P D(t) (``cycle_peak``; D(t): the drops by t) beside A1's: one bound on
      the sum of their futures, since max(F + C) <= max F + max C. Where their drops are
      spread over a period (a long run) C stays within about a drop of 0, where each
      request's own peak (its limit) would set aside half a buffer a request.
  A2  when a step or a waiting request finds the pool short, running requests give tokens
      back before SGLang retracts any (``Budget.give_back``): first those past their limit,
      then those over their budget, down to their budget; then, with a budget range
      (--zipage-min-kv-budget), the largest are squeezed down to their floor. At a decode
      step, a request whose budget the loop guard raised (repetition.py) has the floor of its
      own budget, not the raised one. A request is retracted only when every running request
      sits at its floor.
  A3  under pressure with requests waiting, running requests are squeezed, the largest
      first (planner.py; one within W tokens of its floor's limit once it has a window
      slot, W1); a squeezed request's budget is its floor (so its limit, reserve and growth
      shrink) until the pool leaves pressure, the loop guard's raise included; floor >= W +
      sink, page aligned, <= its budget.

Elastic mode has two states (``Pressure``): *room*, where requests keep their full KV, and
*pressure*, entered when the pool ran short, where every request compresses at its limit as in
fixed mode. It leaves pressure only once nothing waits and the free pool could take what every
running request may still write: the hysteresis that keeps a busy pool from thrashing between
growing and compacting (growing past the limits would fill it and read more KV every step).
"""

from __future__ import annotations

import bisect
import dataclasses
from dataclasses import dataclass
from typing import Dict, Iterable, Optional, Tuple

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
    window_scored: bool = True  # scored by the query window (W1, W2); False: calibrated

    @classmethod
    def from_config(cls, config: ZipageConfig, page_size: int = 1) -> "Budget":
        """The server's budget: the config's budget, buffer and window on this page size."""
        lag = async_lag(page_size) if config.async_compaction else 0
        return cls(config.kv_budget, config.buffer, config.window, page_size, lag,
                   elastic=config.mode == "elastic", window_scored=config.scorer != "calibrated")

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
        asks at every step from then on (its requests grow past the limit while there is room).
        Never with the calibrated scorer."""
        if state.window_since >= 0 or not self.window_scored:
            return False
        start = self.trigger - self.window
        return suffix >= start if self.elastic else suffix == start

    @property
    def keeps_window(self) -> bool:
        """The next window starts within W tokens of a compaction (buffer - lag <= W): a
        request keeps its slot across compactions rather than miss its next start (W1)."""
        return self.window_scored and self.buffer - self.lag <= self.window

    def window_ready(self, state: ReqState, decode_idx: int) -> bool:
        return state.window_since >= 0 and decode_idx - state.window_since >= self.window

    def can_score(self, state: ReqState, decode_idx: int) -> bool:
        """A compaction may run now: with a full window, or windowless when the request
        holds no slot (W2); a slot still filling is waited for."""
        return state.window_since < 0 or self.window_ready(state, decode_idx)

    def needs_compaction(self, state: ReqState, suffix: int, decode_idx: int,
                         pressed: bool = False) -> bool:
        """At the trigger: in fixed mode, and in elastic mode while the pool is under
        pressure (else only on demand: room.py)."""
        return ((not self.elastic or pressed) and suffix >= self.trigger
                and self.can_score(state, decode_idx))

    def give_back(self, suffix: int) -> Optional[int]:
        """A2: the kept count of a compaction that gives tokens back now (the budget, for a
        suffix at least a page over it: past the limit first, as those give the most), or
        None when it sits at its budget."""
        return self.kv_budget if suffix - self.kv_budget >= self.page_size else None

    def squeeze_to(self, suffix: int, floor: int) -> Optional[int]:
        """A2/A3: the kept count of a squeeze down to ``floor`` (below the budget), or None
        when the request sits at its floor."""
        if floor < self.kv_budget and suffix - floor >= self.page_size:
            return floor
        return None

    def reserve(self, suffix: int, remaining_new_tokens: int) -> int:
        """Tokens a running request may still add before its footprint stops growing."""
        return max(0, min(remaining_new_tokens, self.limit - suffix))

    def steps_to_cycle(self, suffix: int, remaining_new_tokens: int) -> Optional[int]:
        """A1c: the steps until a request that holds at least its budget reaches its limit
        and gives back its first cycle, or None when it holds less, is past its limit or
        ends before."""
        if self.kv_budget <= suffix <= self.limit and remaining_new_tokens > self.limit - suffix:
            return self.limit - suffix
        return None

    @property
    def cycle(self) -> int:
        """A1c: the tokens a compaction at the trigger gives back, and the steps until the
        next one."""
        return self.buffer - self.lag

    def admission_reserve(self) -> int:
        """Per-request decode reservation for a new request (plus its last prompt page)."""
        return self.limit + self.page_size


class Budgets:
    """The server's budget and the per-request ones (``zipage_kv_budget``), one Budget per
    kept count. A budget or floor below the model's sliding window (``least``: its
    sliding-window layers need that many tokens kept) is refused: the server's at startup
    (kv_layout.detect), a request's when it arrives (``problem``: HTTP 400)."""

    def __init__(self, server: Budget, least_kv_budget: int = 1, min_kv_budget: int = 0):
        self.server = server
        self.least = least_kv_budget
        self.min_kv_budget = min_kv_budget or server.kv_budget  # the server's floor (A3)
        assert min(server.kv_budget, self.min_kv_budget) >= self.least, "refused at startup"
        self._own: Dict[int, Budget] = {}

    def problem(self, own: Optional[int], own_min: Optional[int]) -> Optional[Tuple[str, int]]:
        """(field, value) of a request's own budget or floor below the sliding window, or None."""
        for field, value in (("zipage_kv_budget", own), ("zipage_min_kv_budget", own_min)):
            if value and value < self.least:
                return field, value
        return None

    def floor(self, own: Optional[int], own_min: Optional[int] = None) -> int:
        """A3: the kept count a request may be squeezed to: its zipage_min_kv_budget or the
        server's floor, never above its own budget."""
        budget = self.server.kv_budget if own is None else own
        return min(budget, own_min or self.min_kv_budget)

    def of(self, own: Optional[int], boost: int = 1,
           squeezed_to: Optional[int] = None) -> Optional[Budget]:
        """own: the request's zipage_kv_budget, or None (the server's); 0, or a budget below
        the sliding window (the request is refused: ``problem``): no compression.
        boost: the loop guard's multiplier (repetition.py); squeezed_to: its budget while
        it is squeezed (A3), whatever the boost."""
        if own == 0 or (own is not None and own < self.least):
            return None
        kv = self.server.kv_budget if own is None else own
        kv = kv * boost if squeezed_to is None else squeezed_to
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


def peak_growth(requests: Iterable[Tuple[int, int, int]]) -> int:
    """A1: max over t >= 0 of F(t), for requests given as (g, r, d). F rises between two
    ends and drops at each, so its peak lies at t = 0 or just before an end (t = r_j - 1);
    for r_i <= t, min(t, g_i) = g_i, so F(t) = sum_i min(t, g_i) - sum_{r_i <= t} (g_i + d_i).
    O(n log n) over plain ints."""
    reqs = sorted((r, min(g, r), d) for g, r, d in requests)
    grows = sorted(g for _, g, _ in reqs)
    below = [0]  # below[k]: the sum of the k smallest growths
    for g in grows:
        below.append(below[-1] + g)
    peak, ended, j = 0, 0, 0
    while j < len(reqs):
        end = reqs[j][0]
        t = end - 1
        k = bisect.bisect_right(grows, t)
        peak = max(peak, below[k] + t * (len(grows) - k) - ended)
        while j < len(reqs) and reqs[j][0] == end:
            ended += reqs[j][1] + reqs[j][2]
            j += 1
    return peak


def cycle_peak(first_drops: Iterable[int], period: int) -> int:
    """A1c: max over t >= 0 of C(t) = n t - period D(t) for n requests that rise a token a
    step and give back ``period`` tokens at f_i, f_i + period, ... (f_i >= 1; D(t): the
    drops at or before t). C rises between drops, so its peak lies at t = 0 or just before
    a drop; once t >= max f_i, C repeats every ``period`` steps, so the drops up to
    max f_i + period are all it needs. O(n log n) over plain ints."""
    first = list(first_drops)
    if not first:
        return 0
    assert period > 0 and min(first) >= 1, (period, min(first))
    last = max(first) + period
    drops = sorted(f + k * period for f in first for k in range((last - f) // period + 1))
    n, peak = len(first), 0
    for done, e in enumerate(drops):  # done: the drops before e
        peak = max(peak, n * (e - 1) - period * done)
    return peak


def check_i2(c0: int, k: int, page: int) -> None:
    assert c0 % page == 0 and k % page == 0, f"I2: c0={c0} k={k} page={page}"


def check_i6(state: ReqState, budget: Budget) -> None:
    assert state.max_suffix <= budget.limit, f"I6: suffix {state.max_suffix} > {budget.limit}"
