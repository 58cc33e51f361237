"""Elastic mode's room on demand: running requests give tokens back when the pool is short.

Two callers, both under pressure (budget.Pressure): a decode step that would not get its
pages (planner.Planner.step), and the first waiting request that does not fit beside what
the running requests are booked for (``admit``, before SGLang's admission). Requests give
back in budget.py's A2 order: past their limit, then over their budget (down to it), largest
first; only if that is not enough, with a budget range, the largest are squeezed to their
floor and keep it as their budget until the pressure ends (A3); at a decode step (where SGLang
would retract next) so are requests whose budget the loop guard raised, down to the floor of
their own budget, range or not. What is still short is SGLang's to retract. Works on the
planner's state; duck-types SGLang's ScheduleBatch and Req.
"""

from __future__ import annotations

from sglang_zipage import request_options


class Room:
    def __init__(self, planner):
        self.p = planner

    def free(self, batch) -> int:
        """Slots free now, or free once the radix tree evicts unused pages."""
        return self.p.allocator.available_size() + batch.tree_cache.evictable_size()

    @staticmethod
    def demand(batch) -> int:
        """Tokens the running requests may still write at full KV."""
        return sum(max(0, r.sampling_params.max_new_tokens - len(r.output_ids))
                   for r in batch.reqs if not r.finished())

    def make(self, batch, tokens: int, headroom: int = 0, early: bool = True) -> int:
        """Compact running requests of ``batch`` until ``tokens`` slots are freed or none
        can give more (A2): those past their limit, largest first (up to ``headroom`` more,
        so the next steps do not run short again); then, with ``early`` (a decode step,
        where SGLang would retract next), those over their budget, and those whose window
        still fills without it; then the squeeze.
        Returns the slots freed."""
        p = self.p
        back, squeeze = {}, {}  # row -> (tokens freed, kept): down to the budget, the floor
        windowless = set()  # rows compacted without their window (recent tokens kept)
        past = set()  # rows past their limit
        for i, req in enumerate(batch.reqs):
            budget = p.budget_of(req) if not req.finished() else None
            if budget is None or req.req_pool_idx is None:
                continue
            st = p.state(req)
            if st.answer_col is not None:  # its answer is never evicted (segments.py)
                continue
            if not budget.can_score(st, req.decode_batch_idx):  # its window still fills:
                if not early:  # it waits for it, unless SGLang would retract instead
                    continue
                windowless.add(i)
            suffix = req.kv_committed_len - st.c0
            kept = budget.give_back(suffix)
            if kept is not None and (early or suffix >= budget.limit):
                back[i] = (suffix - kept, kept)
                if suffix >= budget.limit:
                    past.add(i)
            floor = p.budgets.floor(request_options.of(req), request_options.min_of(req))
            # where SGLang would retract next (early), the loop guard's raise goes back too
            kept = budget.squeeze_to(suffix, floor if early else floor * st.loop_boost)
            if kept is not None:
                squeeze[i] = (suffix - kept, kept)
        chosen, freed = {}, 0
        # largest first: those past their limit give the most
        for i, (gain, kept) in sorted(back.items(), key=lambda o: -o[1][0]):
            if freed >= tokens + (headroom if i in past else 0):
                continue
            chosen[i], freed = kept, freed + gain
        squeezed = []
        if freed < tokens:  # every request gave back down to its budget, and not enough:
            # squeeze, the largest extra first (A2)
            extra = {i: gain - back.get(i, (0, 0))[0] for i, (gain, _) in squeeze.items()}
            for i in sorted(squeeze, key=lambda i: -extra[i]):
                if freed >= tokens:
                    break
                chosen[i], freed = squeeze[i][1], freed + extra[i]
                squeezed.append(i)
        if not chosen:
            return 0
        rows = sorted(chosen)
        before_limit = 0  # compactions before the limit, not squeezes
        for i in rows:
            req = batch.reqs[i]
            st = req.zipage
            before_limit += i not in squeezed and i not in past
            if i in squeezed:
                st.squeezed_to = chosen[i]  # A3: its budget until the pressure ends
        p.stats.squeezed(len(squeezed))
        p.stats.add("early_compactions", before_limit)
        items = [p.item(batch.reqs[i], batch.reqs[i].zipage,
                        batch.reqs[i].kv_committed_len - batch.reqs[i].zipage.c0, chosen[i],
                        windowless=i in windowless) for i in rows]
        for i in rows:
            if i in windowless:
                p.stats.windowless()
        self.count(batch, rows)
        p.apply(batch, items, rows)
        return freed

    def count(self, batch, rows) -> None:
        """These compactions were the pool's pressure (meta_info, counters)."""
        for i in rows:
            batch.reqs[i].zipage.pressure_compactions += 1
        self.p.stats.pressure(len(rows))

    def admit(self, waiting, running, max_running: int, ratio: float) -> None:
        """Before admission: if the first waiting request does not fit beside what the
        running requests are booked for (admission.py), they give the difference back (not
        when the running-request cap, not memory, keeps it waiting)."""
        p = self.p
        capped = running is not None and len(running.reqs) >= max_running
        p.waiting = 0 if capped else len(waiting)
        if not waiting or running is None or not running.reqs or capped:
            return
        growths = p.admission.growths(running.reqs)
        short = (p.admission.need(waiting[0], growths, p.page_size)
                 + p.admission.reserved(running.reqs, growths, ratio) - self.free(running))
        if short > 0:
            p.pressure.ran_short()
            self.make(running, int(short), p.headroom, early=False)
