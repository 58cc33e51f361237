"""What to compact, and when: one scheduler's compaction plans, from CPU state only.

A decode step (``step``, before SGLang's decode memory check, so the freed pages count)
reads as one descent:
  1. the pool's state (elastic mode): room or pressure (budget.Pressure); with requests
     waiting under pressure, running ones take their floor as their budget (budget A3);
  2. each running request's decision, computed once from its state (policy.StepPolicy:
     keep, compact, shadow, commit, cut its thinking; the loop guard's raise on the way);
  3. the plans built from those decisions (compaction.py, shadows.py), their pages freed and
     the batch's lengths set; the executor (executor.py) runs them before the next forward;
  4. elastic mode: when the step would run short of pages, room.py chooses who gives tokens
     back, and their plans follow the same way (``make_room``; also before admission,
     ``admit``, when the first waiting request does not fit).
Every tensor-parallel rank takes the same decisions (decisions.py). Duck-types SGLang's
ScheduleBatch and Req; never imports sglang.
"""

from __future__ import annotations

from typing import List

from sglang_zipage import request_state, room
from sglang_zipage.budget import Pressure
from sglang_zipage.compaction import CompactionItem, plan_compaction, shift_tail
from sglang_zipage.policy import RequestBudgets, StepPolicy, running
from sglang_zipage.request_state import set_lengths

MAX_REQS_PER_LAUNCH = 32  # bounds the scoring scratch ([L, R, Hkv, S] fp32) ...
QUERY_SCRATCH_BYTES = 512 << 20  # ... the window rows a launch gathers ...
SCRATCH_LIMITS = 32  # ... and R * S <= this many budget limits (elastic suffixes are long)


class Planner:
    def __init__(self, budgets: RequestBudgets, policy: StepPolicy, *, layout, window,
                 shadows, allocator, stats, decisions, pending: List, admission=None,
                 alloc=None, headroom: int = 1, launch_cap: int = MAX_REQS_PER_LAUNCH):
        self.budgets = budgets
        self.policy = policy
        self.layout = layout  # remap_window after a plan (hybrid SWA)
        self.window = window  # the query window's slots (query_window.py)
        self.shadows = shadows
        self.allocator = allocator
        self.stats = stats
        self.decisions = decisions
        self.pending = pending  # compaction plans and prompt copies, for the executor
        self.admission = admission  # what admission books for the running requests
        self.alloc = alloc  # alloc(batch, n): n slots, evicting unused tree pages first
        self.headroom = headroom  # elastic mode: compact this much more than the shortfall
        self.launch_cap = launch_cap
        self.page_size = budgets.server.page_size
        self.pressure = Pressure()  # elastic mode: room or pressure (budget.py)
        self.waiting = 0  # requests the pool, not the running cap, keeps waiting (elastic)
        self.compressed_running = 0
        self.steps = 0  # decode steps planned

    # ------------------------------------------------------- decode step
    def step(self, batch) -> None:
        """Plan this decode step's compactions and commits; free their pages."""
        self.steps += 1
        elastic = self.budgets.server.elastic
        reserve = self.shadows.reserve()  # fresh slots for shadows, before this step's commits
        pressed = elastic and self._pressed(batch)
        decided, compressed = [], 0
        for i, req, st, budget in running(batch.reqs, self.budgets):
            compressed += st.compactions > 0
            decided.append((i, req, st, self.policy.decide(req, st, budget, pressed, batch)))
        self.compressed_running = compressed
        self.stats.step(len(batch.reqs), compressed)
        self._carry_out(batch, decided, reserve, pressed)
        if elastic:  # the slots this step may allocate
            need = (self.admission.step_slots(batch.reqs, self.page_size) if self.admission
                    else len(batch.reqs) * self.page_size)
            short = need - self.free(batch)
            if short > 0:
                self.pressure.ran_short()
                self.make_room(batch, short, self.headroom)

    def _pressed(self, batch) -> bool:
        """Elastic mode: whether the pool is under pressure this step. When it leaves,
        budgets return (A3); while requests wait under it, running ones are squeezed."""
        pressed = self.pressure.on and self.pressure.settle(
            self.free(batch), demand(batch), self.waiting)
        if not pressed:
            for req in batch.reqs:
                if getattr(req, "zipage", None) is not None:
                    req.zipage.unsqueeze()
        elif self.waiting:
            self._squeeze(batch)
        return pressed

    def _carry_out(self, batch, decided, reserve: int, pressed: bool) -> None:
        """The decisions as plans: commits, asynchronous compactions (while their fresh-slot
        reserve lasts; the others retry at their next step) and compactions."""
        updates = [self._commit(batch, i, d.suffix) for i, _, _, d in decided
                   if d.action == "commit"]
        shadows, items, rows = [], [], []
        for i, req, st, d in decided:
            if d.action == "shadow" and reserve >= d.kept:
                shadows.append((req, self.item(req, st, d.suffix, d.kept)))
                reserve -= d.kept
            elif d.action in ("compact", "cut"):
                items.append(self.item(req, st, d.suffix, d.kept, tail=d.tail))
                rows.append(i)
        if shadows:
            self._plan_shadows(batch, shadows)
        if items:  # compressing at the limit is what pressure means in elastic mode
            updates += self._plan(batch, items, rows, pressure=pressed)
        if updates:
            set_lengths(batch, updates)

    def _squeeze(self, batch) -> None:
        """Pressure with requests waiting (budget A3): running requests take their floor as
        their budget, the largest first, and compact at its limit as under pressure. One
        already within W tokens of that limit is squeezed only with a window slot (taken
        now: its compaction waits for the window, W1), else at a later step, once one is
        free; a step short of pages does not wait (``make_room``)."""
        candidates = []  # (kv length, request, its state, its budget once squeezed)
        for req in batch.reqs:
            st = getattr(req, "zipage", None)
            if (st is None or st.squeezed_to is not None or st.shadow is not None
                    or st.answer_col is not None or req.finished() or req.req_pool_idx is None):
                continue
            floor = self.budgets.floor_of(req)
            if floor is not None:
                candidates.append((req.kv_committed_len, req, st, floor))
        squeezed = 0
        for _, req, st, floor in sorted(candidates, key=lambda c: -c[0]):
            suffix = request_state.suffix_len(req, floor)
            if (floor.window_scored and not st.has_window
                    and suffix >= floor.trigger - floor.window
                    and not self.policy.take_window(req, st)):
                continue
            st.squeeze(floor.kv_budget)
            squeezed += 1
        self.stats.squeezed(squeezed)

    # ------------------------------------------------------- room on demand
    def free(self, batch) -> int:
        """Slots free now, or free once the radix tree evicts unused pages."""
        return self.allocator.available_size() + batch.tree_cache.evictable_size()

    def make_room(self, batch, tokens: int, headroom: int = 0, early: bool = True) -> int:
        """Compact running requests of ``batch`` until ``tokens`` slots are freed or none
        can give more (room.py: ``early`` at a decode step, where SGLang would retract next;
        else before admission). Returns the slots freed."""
        offers = [room.offer(i, req.kv_committed_len - st.c0, budget,
                             self.budgets.floor(req, boosted=not early),
                             not budget.can_score(st, req.decode_batch_idx), early)
                  for i, req, st, budget in running(batch.reqs, self.budgets)
                  if st.answer_col is None]  # an answer is never evicted (segments.py)
        choices, freed = room.choose([o for o in offers if o is not None], tokens, headroom)
        if not choices:
            return 0
        items = []
        for c in choices:
            req = batch.reqs[c.row]
            if c.squeezed:
                req.zipage.squeeze(c.kept)  # A3: its budget until the pressure ends
            items.append(self.item(req, req.zipage, req.kv_committed_len - req.zipage.c0,
                                   c.kept, windowless=c.windowless))
        self.stats.squeezed(sum(c.squeezed for c in choices))
        self.stats.add("early_compactions", sum(c.early for c in choices))
        for c in choices:
            if c.windowless:
                self.stats.windowless()
        set_lengths(batch, self._plan(batch, items, [c.row for c in choices], pressure=True))
        return freed

    def admit(self, waiting, running_batch, max_running: int, ratio: float,
              reserve: int = 0) -> int:
        """Before SGLang's admission (elastic mode): if the first waiting request does not
        fit beside what the running requests are booked for (admission.py), they give the
        difference back (not when the running-request cap, not memory, keeps it waiting).
        ``reserve``: what SGLang keeps free for the newcomer besides (a PD decode server's
        reserved decode tokens). Returns the slots freed."""
        capped = running_batch is not None and len(running_batch.reqs) >= max_running
        self.waiting = 0 if capped else len(waiting)
        if not waiting or running_batch is None or not running_batch.reqs or capped:
            return 0
        adm = self.admission
        growths = adm.growths(running_batch.reqs)
        short = (adm.need(waiting[0], growths, self.page_size) + reserve
                 + adm.reserved(running_batch.reqs, growths, ratio) - self.free(running_batch))
        if short <= 0:
            return 0
        self.pressure.ran_short()
        return self.make_room(running_batch, int(short), self.headroom, early=False)

    # ------------------------------------------------------------ planning
    def item(self, req, st, suffix: int, kept: int, windowless: bool = False,
             tail: int = 0) -> CompactionItem:
        """A compaction of the request's suffix down to ``kept`` (``tail``: answer columns
        after it, segments.py): scored with its window, or windowless when it holds no slot
        (budget W2) or cannot wait for it (room.py)."""
        windowless = self.budgets.server.window_scored and (windowless or not st.has_window)
        slot = 0 if windowless or not st.has_window else self.window.slot_of(req.req_pool_idx)
        # speculative decoding: the columns past the committed ones are the step in flight's
        # (its draft and verify tokens, accepted or not): never scored, they follow the kept
        # tokens as a tail (only the table moves)
        tail += request_state.in_flight(req)
        return CompactionItem(req.req_pool_idx, st.c0, suffix, st.n_stored,
                              st.n_stored == 0,  # first since (re)prefill
                              slot, kept, tail=tail, windowless=windowless,
                              position=req.kv_committed_len + st.pos_offset)

    def _window_done(self, req) -> None:
        """Its compaction is planned (it read the window at plan time): the slot goes back for
        the requests nearing their limits, or, where its next window starts within W tokens,
        it keeps one and refills it from now (budget W1). A windowless one is counted."""
        st = req.zipage
        if not st.has_window and self.budgets.server.window_scored:
            self.stats.windowless()
        budget = self.budgets.budget_of(req)
        if budget is not None and budget.keeps_window and st.answer_col is None:
            if not self.policy.take_window(req, st):
                st.left_window()
            return
        self.window.release(req.req_pool_idx)
        st.left_window()

    def _plan_shadows(self, batch, shadows) -> None:
        """Asynchronous compactions into fresh slots (shadows.py); their bookkeeping here."""
        r2t = batch.req_to_token_pool.req_to_token
        for group in self.shadows.plan_step(r2t, shadows, self.page_size, self.launch_cap,
                                            lambda n: self.alloc(batch, n)):
            free = self.allocator.available_size()
            for req, it in group:
                self.decisions.record(self.steps, req.rid, it.c0, it.suffix, it.kv_budget, free)
                req.skip_radix_cache_insert = True  # I4 from now on
                self._window_done(req)
            self.stats.add("async_compactions", len(group))
            self.stats.add("compaction_batches")

    def _commit(self, batch, i: int, suffix: int):
        """Swap a request onto its compacted fresh slots; free its old snapshot."""
        req = batch.reqs[i]
        k, evicted, awaited = self.shadows.commit(req, batch.req_to_token_pool.req_to_token,
                                                  suffix, self.allocator)
        self.stats.add("async_awaited", awaited)
        return self._compacted(req, i, k, evicted, pressure=False)

    def _plan(self, batch, items, rows, pressure: bool):
        r2t = batch.req_to_token_pool.req_to_token
        allocator = batch.token_to_kv_pool_allocator
        req_of = {it.req_pool_idx: batch.reqs[i] for it, i in zip(items, rows)}
        # one launch group per kept count, windowless ones apart (executor.execute)
        for k, windowless in sorted({(it.kv_budget, it.windowless) for it in items}):
            for chunk in self._launch_groups([it for it in items if it.kv_budget == k
                                              and it.windowless == windowless]):
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
        if pressure:
            self.stats.pressure(len(rows))
        return [self._compacted(batch.reqs[i], i, it.kv_budget, it.suffix - it.kv_budget,
                                pressure) for it, i in zip(items, rows)]

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

    def _compacted(self, req, i: int, k: int, evicted: int, pressure: bool):
        """Book a finished compaction of ``evicted`` suffix tokens down to k kept."""
        st = req.zipage
        self.decisions.record(self.steps, req.rid, st.c0, k + evicted, k, self.allocator.available_size())
        st.compacted(k, evicted, pressure)
        req.kv_committed_len -= evicted
        req.kv.kv_allocated_len -= evicted
        req.skip_radix_cache_insert = True  # I4
        self.stats.compacted(evicted, self.page_size)
        return i, req.kv_committed_len


def demand(batch) -> int:
    """Tokens the running requests may still write at full KV."""
    return sum(request_state.remaining_tokens(r) for r in batch.reqs if not r.finished())
