"""Asynchronous compaction (``--zipage-async``): the lifecycle of shadow compactions.

A request whose suffix nears its limit is compacted into fresh slots, its shadow, on a side
CUDA stream while it keeps decoding into its old columns. Lifecycle:
  plan    (scheduler step) snapshot its suffix, take k fresh slots from a reserve that
          admission leaves free (``reserve``); the launch waits for the next flush
  launch  (executor.flush, before the next forward) kernels on the side stream
  commit  (the step its suffix reaches the limit) its columns switch to the fresh slots and
          the old snapshot is freed; a launch not done yet makes the next forward wait
  drop    (the request leaves first) its fresh slots go back
Committing only at the limit, never on a GPU-timing probe, keeps every tensor-parallel rank
on the same step. What a compaction does to a request's bookkeeping is the planner's
(planner.py); the kernels a plan runs, the executor's (executor.py).
"""

from __future__ import annotations

import dataclasses
import time
from typing import List, Optional

import torch

from sglang_zipage.compaction import CompactionPlan, commit_shadow, plan_compaction


@dataclasses.dataclass(eq=False)  # identity: compared in lists
class ShadowLaunch:
    """Asynchronous compactions planned in one scheduler step (same k): one plan whose
    dst_slots are fresh slots, launched on the side stream at the next flush."""

    plan: CompactionPlan
    done: Optional[torch.cuda.Event] = None  # recorded on the side stream at launch
    launched: bool = False

    def finished(self) -> bool:
        return self.launched and (self.done is None or self.done.query())


@dataclasses.dataclass(eq=False)
class Shadow:
    """One request's part of a ShadowLaunch (``req.zipage.shadow``)."""

    launch: ShadowLaunch
    row: int
    snapshot: int  # S: the suffix columns it compacts, [c0, c0 + S)
    old: torch.Tensor  # [S] their slots, freed at commit
    fresh: torch.Tensor  # [k] where the kept tokens go


class ShadowCompactions:
    """The shadows of one scheduler process: fresh-slot reserve, launches, commits, drops."""

    def __init__(self, capacity: int, device: torch.device):
        self.capacity = capacity  # tokens of fresh slots shadows may hold at once
        self.held = 0
        self.launches: List[ShadowLaunch] = []  # planned, launched at the next flush
        self.waits: List[ShadowLaunch] = []  # committed before done: the next forward waits
        self.side_stream = (torch.cuda.Stream(device=device)
                            if capacity and device.type == "cuda" else None)

    def reserve(self) -> int:
        """Tokens admission leaves free for shadows not yet in flight."""
        return max(0, self.capacity - self.held)

    @property
    def busy(self) -> bool:
        return bool(self.launches or self.waits)

    def plan_step(self, req_to_token, shadows, page_size: int, launch_cap: int, alloc):
        """Plan one step's asynchronous compactions, one launch per kept count (windowless
        ones apart), each suffix cut to whole pages (I2); yields each planned group of
        (req, item). A group that finds no fresh slots (``alloc`` None) retries next step."""
        for k, windowless in sorted({(it.kv_budget, it.windowless) for _, it in shadows}):
            group = [(req, dataclasses.replace(it, suffix=it.suffix // page_size * page_size))
                     for req, it in shadows if it.kv_budget == k and it.windowless == windowless]
            group = [(req, it) for req, it in group if it.suffix > k][:launch_cap]
            fresh = alloc(k * len(group)) if group else None
            if fresh is None:
                continue
            self.plan(req_to_token, group, k, page_size, fresh.view(len(group), k))
            yield group

    def plan(self, req_to_token, group, k: int, page_size: int, fresh: torch.Tensor) -> None:
        """group: [(req, CompactionItem)] with whole-page suffixes; fresh: [R, k] slots."""
        plan, old = plan_compaction(req_to_token, [it for _, it in group], k, page_size, fresh=fresh)
        launch = ShadowLaunch(plan)
        self.launches.append(launch)
        for row, (req, it) in enumerate(group):
            req.zipage.started_shadow(Shadow(launch, row, it.suffix, old[row, :it.suffix],
                                             fresh[row].clone()))  # dst rows may be zeroed
        self.held += k * len(group)

    def commit(self, req, req_to_token, suffix: int, allocator):
        """Swap the request onto its fresh slots, free its old snapshot. Returns
        (k kept, tokens evicted, whether the next forward must wait for the launch)."""
        st = req.zipage
        sh = st.ended_shadow()
        awaited = not sh.launch.finished()
        if awaited and sh.launch not in self.waits:
            self.waits.append(sh.launch)
        k = sh.fresh.numel()
        commit_shadow(req_to_token, req.req_pool_idx, st.c0, sh.snapshot, suffix, sh.fresh)
        allocator.free(sh.old)
        self.held -= k
        return k, sh.snapshot - k, awaited

    def drop(self, sh: Shadow, allocator) -> None:
        """Its request leaves before the commit; SGLang frees the old columns. Not launched
        yet: its row now writes to slot 0 (SGLang's padding slot, ordered before the launch
        by the forward stream's wait on the scheduler stream) and the fresh slots are free
        at once. Launched: a short host wait until the side stream is done with them
        (only when a request leaves with its compaction in flight)."""
        launch = sh.launch
        if not launch.launched:
            launch.plan.dst_slots[sh.row].zero_()
        elif launch.done is not None:
            launch.done.synchronize()
        allocator.free(sh.fresh)
        self.held -= sh.fresh.numel()

    def launch_all(self, run, queries, stats, forward_stream) -> None:
        """Start the planned launches. The side stream waits for the forwards issued so far
        (they wrote the snapshots' last tokens and queries) and reads a copy of the window
        rows taken now (the next forwards overwrite the ring). ``run(plan, queries, stream)``
        executes a plan (executor.py); on the CPU it runs now, in order."""
        launches, self.launches = self.launches, []
        for launch in launches:
            plan = launch.plan
            q = queries(plan)  # window rows: a copy, on the forward stream
            if forward_stream is None:
                t0 = time.perf_counter()
                run(plan, q, None)
                stats.span_end(None, None, t0)
            else:
                side = self.side_stream
                side.wait_stream(forward_stream)
                with torch.cuda.stream(side):
                    span = stats.span_start(side)
                    run(plan, q, side)
                    stats.span_end(span, side, 0.0)
                    launch.done = torch.cuda.Event()
                    launch.done.record(side)
            launch.launched = True

    def wait_committed(self, stream) -> None:
        """The forward about to run waits (on the GPU) for launches committed early."""
        for launch in self.waits:
            if launch.done is not None:
                stream.wait_event(launch.done)
        self.waits.clear()
