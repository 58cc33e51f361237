"""Runs planned compactions: scoring, selection and compaction kernels, and nothing else.

In place (the planner's queue): on the stream of the next forward, right before it (C2 of
compaction.py): after the previous forward, which may still write the last suffix token and
query, and before any forward that writes into the freed slots. Asynchronous (shadows.py):
on the side stream, from a copy of the window rows. A plan never re-reads req_to_token (C1).
The device time of every launch is counted (counters.py).
"""

from __future__ import annotations

import dataclasses
import functools
import time
from typing import Optional

import torch

from sglang_zipage.compaction import S_MAX_ALIGN, CompactionPlan
from sglang_zipage.kernels import compact_kv
from sglang_zipage.own_prompt import SlotCopy
from sglang_zipage.scoring import Queries, ScoringParams, select_and_compact


def execute(plan: CompactionPlan, params: ScoringParams, queries: Optional[Queries], kv,
            score_buffers, sm_scale: float, followers=()) -> None:
    """Score, select and compact on the current stream; launches kernels only (C1).

    queries: the plan's (``Executor.queries``); kv: the buffers of the pool's layout
    (kv_layout); followers: the buffers of pools at the same slots that follow it (a
    speculative draft's). A windowless plan keeps each request's most recent tokens (the
    ``recent`` selection) and ignores the queries."""
    if plan.windowless:
        params, queries = windowless(params), None
    select_and_compact(params, queries, kv, score_buffers, plan.src_slots, plan.src_lens,
                       plan.n_stored, plan.first, sm_scale, plan.dst_slots, plan.k, followers)


def copy_slots(copy: SlotCopy, kv, followers=()) -> None:
    """Every layer's and head's KV of copy.src into copy.dst (disjoint slots), in the pool
    and its followers."""
    n = copy.src.numel()
    for pool in (kv, *followers):
        for keys, values in ((pool.keys, pool.values), (pool.recent_keys, pool.recent_values)):
            if keys:
                keep = torch.arange(n, device=copy.src.device).expand(len(keys), 1,
                                                                     keys[0].shape[1], n)
                compact_kv(keys, values, None, copy.src[None], keep, copy.dst[None], None)


@functools.lru_cache(maxsize=8)
def windowless(params: ScoringParams) -> ScoringParams:
    """The selection of a compaction without a window slot: the most recent tokens."""
    return dataclasses.replace(params, selection="recent")


class Executor:
    def __init__(self, params: ScoringParams, kv, window, score_buffer, sm_scale: float,
                 queue, shadows, stats, device: torch.device, calibrated=None):
        self.params = params
        self.kv = kv  # the pool's buffers, as the layout hands them over
        self.window = window
        self.score_buffer = score_buffer  # [L, slots, Hkv] fp32, or None (decay 0)
        self._score_buffers = list(score_buffer) if score_buffer is not None else None
        self.sm_scale = sm_scale
        self.queue = queue  # the planner's pending plans (a list it appends to)
        self.shadows = shadows
        self.stats = stats
        self.device = device
        self.calibrated = calibrated  # query_stats.DeviceQueries, or None (the window scores)
        self.followers = ()  # LayerKV of pools at the same slots (a draft's: ``follow``)
        self.landed = None  # a CUDA event after the last flushed moves (await_landed)

    def follow(self, kv) -> None:
        """Compact ``kv`` (a pool at the same slots: a speculative draft's) with every plan."""
        self.followers += (kv,)

    def flush(self) -> None:
        """Before a forward, on its stream: window-table updates, in-place compactions
        (C2), shadow launches on the side stream, then waits for shadows committed early."""
        self.window.flush()
        if not (self.queue or self.shadows.busy):
            return
        t0 = time.perf_counter()
        stream = torch.cuda.current_stream() if self.device.type == "cuda" else None
        if self.queue:
            span = self.stats.span_start(stream)
            for plan in self.queue:
                self.run(plan, self.queries(plan), stream)
            self.queue.clear()
            self.stats.span_end(span, stream, t0)
        self.shadows.launch_all(self.run, self.queries, self.stats, stream)
        self.shadows.wait_committed(stream)
        if stream is not None:
            self.landed = torch.cuda.Event()
            self.landed.record(stream)
        self.stats.launch_time(time.perf_counter() - t0)

    def await_landed(self) -> None:
        """Block until the moves flushed so far have run. The planner frees a compaction's
        surplus slots when it plans it, and the moves that read them run in stream order
        before the next forward: a writer outside that order (a PD decode server's KV
        transfer into slots it preallocates) must wait for them. (On the CPU they ran in
        flush.)"""
        if self.landed is not None:
            self.landed.synchronize()
            self.landed = None

    def queries(self, plan) -> Optional[Queries]:
        """The plan's window rows (a copy), or the calibrated queries at its requests' next
        positions; None for a windowless plan or a copy."""
        if isinstance(plan, SlotCopy) or plan.windowless:
            return None
        if self.calibrated is not None:
            return self.calibrated.at(plan.positions)
        return Queries(self.window.gather(plan.window_slots))

    def run(self, plan, queries: Optional[Queries], stream) -> None:
        """One plan (or prompt copy, own_prompt.py) on ``stream`` (None: the CPU, now); its
        tensors stay alive until then."""
        if stream is not None:
            held = (queries.rows, queries.rope and queries.rope.positions) if queries else ()
            for t in (*plan.tensors, *held):
                if t is not None:
                    t.record_stream(stream)
        if isinstance(plan, SlotCopy):
            copy_slots(plan, self.kv, self.followers)
        else:
            execute(plan, self.params, queries, self.kv, self._score_buffers, self.sm_scale,
                    self.followers)

    def warm_up(self, page_size: int, copies: bool = False) -> None:
        """Compile the Triton kernels now, not in the middle of the first compaction
        (seconds of JIT with every running request waiting): one compaction on scratch
        buffers shaped like the pool's. The kernels compile one variant for any batch
        (kernels.utils.lazy_jit's batch_args, plans padded to S_MAX_ALIGN columns)."""
        k, s = 2 * page_size, max(4 * page_size, 2 * S_MAX_ALIGN)
        dev = self.device
        like = lambda bufs: [torch.zeros((s + 1, *bufs[0].shape[1:]), dtype=bufs[0].dtype,  # noqa: E731
                                         device=dev)] * len(bufs) if bufs else bufs
        kv = self.kv
        scratch = dataclasses.replace(kv, keys=like(kv.keys), values=like(kv.values),
                                      recent_keys=like(kv.recent_keys),
                                      recent_values=like(kv.recent_values))
        scores = [torch.zeros((s + 1, kv.keys[0].shape[1]), device=dev)] * len(kv.keys)
        slots = torch.arange(1, s + 1, device=dev)[None]
        plan = CompactionPlan(
            k=k, req_pool_indices=[0], window_slots=torch.zeros(1, dtype=torch.int64, device=dev),
            src_slots=slots, src_lens=torch.tensor([s], device=dev), dst_slots=slots[:, :k],
            n_stored=torch.tensor([k], device=dev), first=torch.tensor([True], device=dev),
            positions=torch.tensor([s]))
        execute(plan, self.params, self.queries(plan), scratch,
                scores if self.score_buffer is not None else None, self.sm_scale)
        if copies:  # --zipage-compress-prompt: the prompt copy's kernel variant too
            copy_slots(SlotCopy(slots[0, :k], slots[0, k:2 * k]), scratch)
        torch.cuda.synchronize()
