"""What to compact, and when: one scheduler's compaction decisions, from CPU state only.

Each decode step (``step``, before SGLang's decode memory check, so the freed pages count):
  - a request takes a query-window slot W tokens before its limit (budget W1);
  - fixed mode, and elastic mode under pressure: a request at its limit is compacted, with its
    window or windowless (W2); with --zipage-async a few tokens earlier, into fresh slots
    (shadows.py), committed at the limit;
  - a compacted request that repeats itself gets a larger budget (the loop guard); one whose
    answer started compresses its thinking segment once more, never its answer (segments.py);
  - elastic mode: when the step would run short of pages, running requests give tokens back
    (room.py), as they do before admission when the first waiting request does not fit;
    with a budget range, while requests wait under pressure running ones take their floor as
    their budget, and keep it until the pressure ends (budget A3); admission books them there.
Plans are queued for the executor (executor.py), which runs them before the next forward.
Every tensor-parallel rank takes the same decisions (decisions.py). Duck-types SGLang's
ScheduleBatch and Req; never imports sglang.
"""

from __future__ import annotations

from typing import List, Optional

from sglang_zipage import request_options, request_state
from sglang_zipage.request_state import set_lengths
from sglang_zipage.admission import Admission
from sglang_zipage.budget import Budget, Budgets, Pressure
from sglang_zipage.compaction import (CompactionItem, plan_compaction,
                                     shift_tail)
from sglang_zipage.own_prompt import OwnPrompt
from sglang_zipage.repetition import LoopGuard
from sglang_zipage.room import Room
from sglang_zipage.segments import Segments

MAX_REQS_PER_LAUNCH = 32  # bounds the scoring scratch ([L, R, Hkv, S] fp32) ...
QUERY_SCRATCH_BYTES = 512 << 20  # ... the window rows a launch gathers ...
SCRATCH_LIMITS = 32  # ... and R * S <= this many budget limits (elastic suffixes are long)


class Planner:
    def __init__(self, budgets: Budgets, *, layout, window, shadows, allocator, stats, decisions,
                 evict=None, stock_clip: int = 4096, headroom: int = 1,
                 launch_cap: int = MAX_REQS_PER_LAUNCH, loop_guard: Optional[LoopGuard] = None,
                 segments: Optional[Segments] = None, compress_prompt: bool = False):
        self.budgets = budgets
        self.layout = layout  # remap_window after a plan (hybrid SWA)
        self.window = window  # the query window's slots (query_window.py)
        self.shadows = shadows
        self.allocator = allocator
        self.stats = stats
        self.decisions = decisions
        self.evict = evict  # evict(batch, n): make n slots free from the radix tree (hooks)
        self.admission = Admission(self.booked_budget, stock_clip)
        self.room = Room(self)  # elastic mode: tokens given back on demand
        self.headroom = headroom  # elastic mode: compact this much more than the shortfall
        self.launch_cap = launch_cap
        self.loop_guard = loop_guard  # repetition.py, or None (--zipage-no-loop-guard)
        self.segments = segments  # thinking and answer (segments.py), or None
        self.page_size = budgets.server.page_size
        self.pending: List = []  # compaction plans and prompt copies, for the executor
        # --zipage-compress-prompt: unshared prompt pages join the suffix (own_prompt.py)
        self.own_prompt = OwnPrompt(self._alloc, self.pending, stats) if compress_prompt else None
        self.pressure = Pressure()  # elastic mode: room or pressure (budget.py)
        self.waiting = 0  # requests the pool, not the running cap, keeps waiting (elastic)
        self.compressed_running = 0
        self.steps = 0  # decode steps planned

    # ------------------------------------------------------ per request
    def budget_of(self, req) -> Optional[Budget]:
        """The request's budget: its own zipage_kv_budget, the server's, or None (off),
        times what the loop guard gave it; or its floor while it is squeezed (budget A3)."""
        st = getattr(req, "zipage", None)
        if st is None:
            return self.budgets.of(request_options.of(req))
        return self.budgets.of(request_options.of(req), st.loop_boost, st.squeezed_to)

    def floor_of(self, req) -> Optional[Budget]:
        """The budget a squeeze leaves the request (budget A3): its floor times what the loop
        guard gave it; None when that is not below its budget (no budget range)."""
        budget = self.budget_of(req)
        if budget is None or not budget.elastic:
            return None
        st = getattr(req, "zipage", None)
        floor = (self.budgets.floor(request_options.of(req), request_options.min_of(req))
                 * (st.loop_boost if st is not None else 1))
        if floor >= budget.kv_budget:
            return None
        return self.budgets.of(request_options.of(req), squeezed_to=floor)

    def booked_budget(self, req) -> Optional[Budget]:
        """What admission books a request at (budget A1): with a budget range its floor, the
        least that requests waiting or a step short of pages make it hold (A2, A3); else its
        budget."""
        return self.floor_of(req) or self.budget_of(req)

    def state(self, req):
        return request_state.state_of(req, self.budgets.server)

    # ------------------------------------------------------- decode step
    def step(self, batch) -> None:
        """Plan this decode step's compactions and commits; free their pages."""
        self.steps += 1
        elastic = self.budgets.server.elastic
        items, rows, compressed, commits, shadows = [], [], 0, [], []
        room = self.shadows.reserve()
        pressed = elastic and self.pressure.on and self.pressure.settle(
            self.room.free(batch), self.room.demand(batch), self.waiting)
        if not pressed:  # (or the pressure ended:) budgets return (A3)
            for req in batch.reqs:
                if getattr(req, "zipage", None) is not None:
                    req.zipage.squeezed_to = None
        elif self.waiting:  # requests wait: running ones take their floor (A3)
            self._squeeze(batch)
        for i, req in enumerate(batch.reqs):
            budget = self.budget_of(req) if not req.finished() else None
            if budget is None or req.req_pool_idx is None:
                continue
            st = self.state(req)
            moved = False
            if self.own_prompt is not None and st.prompt_asks and st.n_stored == 0:
                # None: its prompt reaches the tree after this step (overlap), asked once more
                moved = self.own_prompt.take(req, st, batch)
                st.prompt_asks = st.prompt_asks - 1 if moved is None else 0
                if (moved and st.window_since < 0
                        and budget.trigger - budget.window <= req.kv_committed_len - st.c0
                        and self.window.assign(req.req_pool_idx)):
                    # its own prompt put it past its window's start: the window fills from
                    # here, and its compaction waits for it (else W2, windowless)
                    st.window_since = req.decode_batch_idx
            compressed += st.compactions > 0
            if self.loop_guard and st.compactions and self.loop_guard.watch(st, req.output_ids):
                self.stats.loop_guard()
                budget = self.budget_of(req)
            suffix = req.kv_committed_len - st.c0
            if st.shadow is not None:  # in flight: commit at the limit. Never earlier on a
                # GPU-timing probe: tensor-parallel ranks must take the same step everywhere.
                if suffix >= budget.limit:
                    commits.append((i, suffix))
                continue
            if self.segments is not None and self.segments.answering(req, st, self.window, self.stats):
                cut = self.segments.answer_cut(req, st, budget, self.page_size, self.stats)
                if cut is not None:
                    thinking, kept, tail = cut
                    items.append(self.item(req, st, thinking, kept, tail=tail))
                    rows.append(i)
                continue  # its answer grows, never compacted (segments.py)
            st.max_suffix = max(st.max_suffix, suffix)
            self.stats.suffix(suffix)
            if budget.wants_window(st, suffix):
                if self.window.assign(req.req_pool_idx):
                    st.window_since = req.decode_batch_idx
                else:
                    self.stats.add("window_slot_misses")
            # one whose prompt reaches the tree after this step compacts once it took it
            if moved is not None and budget.needs_compaction(st, suffix, req.decode_batch_idx,
                                                             pressed):
                item = self.item(req, st, suffix, budget.kv_budget)
                if budget.lag and suffix < budget.limit:
                    if room >= item.kv_budget:  # else it retries at its next step
                        shadows.append((req, item))
                        room -= item.kv_budget
                else:
                    self.stats.add("async_fallbacks", budget.lag > 0)
                    items.append(item)
                    rows.append(i)
        self.compressed_running = compressed
        self.stats.step(len(batch.reqs), compressed)
        updates = [self._commit(batch, i, suffix) for i, suffix in commits]
        if shadows:
            self._plan_shadows(batch, shadows)
        if items:
            updates += self._plan(batch, items, rows)
            if pressed:  # compressing at the limit is what pressure means in elastic mode
                self.room.count(batch, rows)
        if updates:
            set_lengths(batch, updates)
        if elastic:  # this step writes up to one page per request
            short = len(batch.reqs) * self.page_size - self.room.free(batch)
            if short > 0:
                self.pressure.ran_short()
                self.room.make(batch, short, self.headroom)

    def _squeeze(self, batch) -> None:
        """Pressure with requests waiting (budget A3): running requests take their floor as
        their budget, the largest first, and compact at its limit as under pressure. One
        already within W tokens of that limit is squeezed only with a window slot (taken
        now: its compaction waits for the window, W1), else at a later step, once one is
        free; a step short of pages does not wait (room.py)."""
        candidates = []  # (kv length, request, its state, its budget once squeezed)
        for req in batch.reqs:
            st = getattr(req, "zipage", None)
            if (st is None or st.squeezed_to is not None or st.shadow is not None
                    or st.answer_col is not None or req.finished() or req.req_pool_idx is None):
                continue
            floor = self.floor_of(req)
            if floor is not None:
                candidates.append((req.kv_committed_len, req, st, floor))
        squeezed = 0
        for _, req, st, floor in sorted(candidates, key=lambda c: -c[0]):
            suffix = request_state.suffix_len(req, floor)
            if st.window_since < 0 and suffix >= floor.trigger - floor.window:
                if not self.window.assign(req.req_pool_idx):
                    continue
                st.window_since = req.decode_batch_idx
            st.squeezed_to = floor.kv_budget
            squeezed += 1
        self.stats.squeezed(squeezed)

    def item(self, req, st, suffix: int, kept: int, windowless: bool = False,
             tail: int = 0) -> CompactionItem:
        """A compaction of the request's suffix down to ``kept`` (``tail``: answer columns
        after it, segments.py): scored with its window, or windowless when it holds no slot
        (budget W2) or cannot wait for it (room.py)."""
        slot = (self.window.slot_of(req.req_pool_idx)
                if st.window_since >= 0 and not windowless else 0)
        return CompactionItem(req.req_pool_idx, st.c0, suffix, st.n_stored,
                              st.n_stored == 0,  # first since (re)prefill
                              slot, kept, tail=tail)

    def admit(self, waiting, running, max_running: int, ratio: float) -> None:
        """Elastic mode, before SGLang's admission (room.py)."""
        self.room.admit(waiting, running, max_running, ratio)

    def _window_done(self, req) -> None:
        """Its compaction is planned (it read the window at plan time): the slot goes back for
        the requests nearing their limits, or, where its next window starts within W tokens,
        it keeps one and refills it from now (budget W1). A windowless one is counted."""
        st = req.zipage
        if st.window_since < 0:
            self.stats.windowless()
        budget = self.budget_of(req)
        if budget is not None and budget.keeps_window and st.answer_col is None:
            st.window_since = (req.decode_batch_idx if self.window.assign(req.req_pool_idx)
                               else -1)
            return
        self.window.release(req.req_pool_idx)
        st.window_since = -1

    # ------------------------------------------------------------ planning
    def _plan_shadows(self, batch, shadows) -> None:
        """Asynchronous compactions into fresh slots (shadows.py); their bookkeeping here."""
        r2t = batch.req_to_token_pool.req_to_token
        for group in self.shadows.plan_step(r2t, shadows, self.page_size, self.launch_cap,
                                            lambda n: self._alloc(batch, n)):
            free = self.allocator.available_size()
            for req, it in group:
                self.decisions.record(self.steps, req.rid, it.c0, it.suffix, it.kv_budget, free)
                req.skip_radix_cache_insert = True  # I4 from now on
                self._window_done(req)
            self.stats.add("async_compactions", len(group))
            self.stats.add("compaction_batches")

    def _alloc(self, batch, n: int):
        """n slots from the pool, evicting unused radix-tree pages first as SGLang does."""
        if self.evict is not None:
            self.evict(batch, n)
        return self.allocator.alloc(n)

    def _commit(self, batch, i: int, suffix: int):
        """Swap a request onto its compacted fresh slots; free its old snapshot."""
        req = batch.reqs[i]
        k, evicted, awaited = self.shadows.commit(req, batch.req_to_token_pool.req_to_token,
                                                  suffix, self.allocator)
        self.stats.add("async_awaited", awaited)
        return self._compacted(req, i, k, evicted)

    def apply(self, batch, items, rows) -> None:
        """Plan these compactions of ``batch``'s rows now and set the batch's lengths."""
        set_lengths(batch, self._plan(batch, items, rows))

    def _plan(self, batch, items, rows):
        r2t = batch.req_to_token_pool.req_to_token
        allocator = batch.token_to_kv_pool_allocator
        req_of = {it.req_pool_idx: batch.reqs[i] for it, i in zip(items, rows)}
        # one launch group per kept count, windowless ones apart (executor.execute)
        for k, windowless in sorted({(it.kv_budget, it.window_slot == 0) for it in items}):
            for chunk in self._launch_groups([it for it in items if it.kv_budget == k
                                              and (it.window_slot == 0) == windowless]):
                plan, surplus = plan_compaction(r2t, chunk, k, self.page_size)
                self.layout.remap_window(r2t, chunk, k, allocator,
                                         [req_of[it.req_pool_idx] for it in chunk])
                allocator.free(surplus)
                for it in chunk:
                    shift_tail(r2t, it)
                self.pending.append(plan)
                self.stats.add("compaction_batches")
        for i in rows:
            self._window_done(batch.reqs[i])
        return [self._compacted(batch.reqs[i], i, it.kv_budget, it.suffix - it.kv_budget)
                for it, i in zip(items, rows)]

    def _launch_groups(self, items):
        """Split into launches of at most ``launch_cap`` requests whose padded scratch
        (requests x longest suffix) stays within SCRATCH_LIMITS budget limits."""
        cap = SCRATCH_LIMITS * self.budgets.server.limit
        group = []
        for it in sorted(items, key=lambda it: -it.suffix):
            if group and (len(group) == self.launch_cap or (len(group) + 1) * group[0].suffix > cap):
                yield group
                group = []
            group.append(it)
        if group:
            yield group

    def _compacted(self, req, i: int, k: int, evicted: int):
        """Book a finished compaction of ``evicted`` suffix tokens down to k kept."""
        st = req.zipage
        self.decisions.record(self.steps, req.rid, st.c0, k + evicted, k, self.allocator.available_size())
        st.pos_offset += evicted
        if st.answer_col is not None:  # every evicted column lay before its answer
            st.answer_col -= evicted
        st.n_stored = k
        st.compactions += 1
        req.kv_committed_len -= evicted
        req.kv.kv_allocated_len -= evicted
        req.skip_radix_cache_insert = True  # I4
        self.stats.compacted(evicted, self.page_size)
        return i, req.kv_committed_len
