"""What a scheduler process counts: /server_info's counters and, with SGLang's
``--enable-metrics``, the same events as Prometheus series (metrics.py).

The runtime reports an event once (``step``, ``compacted``, ``pressure``, ...) and this
module keeps both views in step. Compaction device time is measured with CUDA events
around the kernels on their stream and summed once the events completed (``span_start`` /
``span_end``); on the CPU the kernels run synchronously, so wall time is device time.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from typing import Optional

import torch

logger = logging.getLogger("sglang_zipage")


class Counters:
    def __init__(self):
        self.values = dict(compactions=0, compaction_batches=0, tokens_evicted=0,
                           pages_freed=0, compaction_ms=0.0, compaction_gpu_ms=0.0,
                           max_suffix_tokens=0, window_slot_misses=0, async_compactions=0,
                           async_awaited=0, async_fallbacks=0, pressure_compactions=0,
                           # compactions without a window slot (memory.py: most recent kept)
                           windowless_compactions=0,
                           loop_guard_triggers=0,  # budgets the loop guard raised
                           # elastic mode, the pool short: squeezes to a floor, compactions
                           # before the limit (instead of a retraction)
                           squeezed_compactions=0, early_compactions=0,
                           # think segments: answers begun, thinking segments compacted then
                           answers_started=0, answer_compactions=0,
                           # --zipage-compress-prompt: prompts copied to own pages, their
                           # tokens, and copies the pool had no pages for (own_prompt.py)
                           prompt_copies=0, prompt_tokens_owned=0, prompt_copy_misses=0,
                           # one per request per decode step; of those, the steps of requests
                           # compacted before the step was planned (tokens from compressed KV)
                           decode_tokens=0, compressed_decode_tokens=0,
                           most_running_requests=0,  # the largest decode batch
                           # decode steps of more requests than the largest decode CUDA
                           # graph, which SGLang then runs eagerly (slower a step)
                           decode_steps_past_graphs=0)
        self.graph_max_bs: Optional[int] = None  # the largest decode graph; None: no graphs
        self.metrics = None  # ZipageMetrics, once export_metrics() was called
        self._spans = []  # (start, end) CUDA events of compactions not yet summed

    def export_metrics(self) -> None:
        """Also count into Prometheus series (one scheduler per attention-TP group)."""
        from sglang_zipage.metrics import ZipageMetrics

        self.metrics = ZipageMetrics()

    def __getitem__(self, name: str):
        return self.values[name]

    def add(self, name: str, n=1) -> None:
        """A counter only /server_info shows."""
        self.values[name] += n

    def suffix(self, tokens: int) -> None:
        if tokens > self.values["max_suffix_tokens"]:
            self.values["max_suffix_tokens"] = tokens

    def step(self, decoded: int, compressed: int) -> None:
        """One decode step of ``decoded`` requests, ``compressed`` of them compacted before."""
        self.values["decode_tokens"] += decoded
        self.values["most_running_requests"] = max(self.values["most_running_requests"], decoded)
        self.values["compressed_decode_tokens"] += compressed
        if self.graph_max_bs is not None and decoded > self.graph_max_bs:
            if not self.values["decode_steps_past_graphs"]:
                logger.warning("zipage: %d requests decode in one step, more than the largest "
                               "decode CUDA graph (%d): SGLang runs such steps eagerly, slower; "
                               "a larger --cuda-graph-max-bs-decode covers them",
                               decoded, self.graph_max_bs)
            self.values["decode_steps_past_graphs"] += 1
        if self.metrics is not None:
            self.metrics.on_step(decoded, compressed)

    def compacted(self, evicted: int, page_size: int) -> None:
        """One request compressed, ``evicted`` of its suffix tokens dropped."""
        self.values["compactions"] += 1
        self.values["tokens_evicted"] += evicted
        self.values["pages_freed"] += evicted // page_size
        if self.metrics is not None:
            self.metrics.on_plan(1, evicted, evicted // page_size)

    def pressure(self, n: int) -> None:
        """Elastic mode: n compactions because the pool needed the room."""
        self.values["pressure_compactions"] += n
        if self.metrics is not None:
            self.metrics.pressure_compactions.inc(n)

    def windowless(self) -> None:
        """A request compacted without a query-window slot (budget W2)."""
        self.values["windowless_compactions"] += 1
        if self.metrics is not None:
            self.metrics.windowless_compactions.inc()

    def loop_guard(self) -> None:
        """The loop guard raised a repeating request's budget (repetition.py)."""
        self.values["loop_guard_triggers"] += 1
        if self.metrics is not None:
            self.metrics.loop_guard_triggers.inc()

    def squeezed(self, n: int) -> None:
        """n requests squeezed to their floor (budget A3)."""
        self.values["squeezed_compactions"] += n
        if self.metrics is not None and n:
            self.metrics.squeezed_compactions.inc(n)

    def launch_time(self, seconds: float) -> None:
        """Host time spent launching compactions."""
        self.values["compaction_ms"] += seconds * 1e3
        if self.metrics is not None:
            self.metrics.compaction_seconds.inc(seconds)

    # ------------------------------------------------------- device time
    def span_start(self, stream) -> Optional[torch.cuda.Event]:
        if stream is None:
            return None
        start = torch.cuda.Event(enable_timing=True)
        start.record(stream)
        return start

    def span_end(self, start, stream, t0: float) -> None:
        if start is None:
            self.values["compaction_gpu_ms"] += (time.perf_counter() - t0) * 1e3
            return
        end = torch.cuda.Event(enable_timing=True)
        end.record(stream)
        self._spans.append((start, end))
        self.collect()

    def collect(self) -> None:
        """Add the device time of the spans that completed (never waits)."""
        while self._spans and self._spans[0][1].query():
            start, end = self._spans.pop(0)
            self.values["compaction_gpu_ms"] += start.elapsed_time(end)

    def snapshot(self) -> dict:
        self.collect()
        return dict(self.values)


def server_info(rt, running_reqs=()) -> dict:
    """/server_info's zipage state of a scheduler's runtime (runtime.ZipageRuntime): the
    active configuration, its layout and memory, what runs now and every count."""
    compressed = sum(1 for r in running_reqs
                     if getattr(r, "zipage", None) is not None and r.zipage.compactions)
    pressure = rt.planner.pressure if rt.planner else None
    return {"config": dataclasses.asdict(rt.config), "active": rt.ready,
            "layout": rt.layout.describe() if rt.ready else None,
            "budget_limit_tokens": rt.budget.limit if rt.budget else None,
            "memory_bytes": rt.memory_bytes, "warm_up_s": rt.warm_up_s,
            "memory": rt.memory_plan.describe() if rt.memory_plan else None,
            "running_compressed_requests": compressed,
            "running_squeezed_requests": sum(
                1 for r in running_reqs if getattr(r, "zipage", None) is not None
                and r.zipage.squeezed_to is not None),
            "free_window_slots": rt.window.free_slots if rt.window else None,
            "window_slots": rt.window.num_slots if rt.window else None,
            "shadow_tokens_held": rt.shadows.held, **rt.stats.snapshot(),
            "elastic_pressure": pressure.on if pressure else False,
            "pressure_episodes": pressure.episodes if pressure else 0,
            **rt.decisions.summary()}
