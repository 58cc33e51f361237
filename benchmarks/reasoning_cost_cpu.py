#!/usr/bin/env python3
"""What the reasoning features cost the scheduler (issue 31): the think-end scan
(segments.Segments.scan) and the loop guard (repetition.LoopGuard.watch), per decode step, on
the CPU they run on. Both run in the scheduler process on the token ids it already holds, once
per running request per step.

    .venv/bin/python benchmarks/reasoning_cost_cpu.py --out benchmarks/results/reasoning-cost-cpu.json

--requests requests (266: what a Qwen3-8B-shaped H200 pool runs at budget 2048, docs/results.md's
first-wave rows) with outputs of --output tokens and random ids (so no marker is found and no loop
seen: the scan searches every new token, the guard measures a full 400-token window every 32
tokens), --steps decode steps; mean milliseconds per step for each. Nothing is asserted.
"""

from __future__ import annotations

import argparse
import random
import time
import types

from sglang_zipage.harness.record import command_line, git_commit, versions, write_json
from sglang_zipage.repetition import LoopGuard
from sglang_zipage.request_state import ReqState
from sglang_zipage.segments import Segments

MARKER = [151668]  # Qwen3's </think>


def cpu_model() -> str:
    with open("/proc/cpuinfo") as f:
        return next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")),
                    "unknown")


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--requests", type=int, default=266)
    p.add_argument("--output", type=int, default=2000, help="output tokens at the start")
    p.add_argument("--steps", type=int, default=512)
    p.add_argument("--out", required=True)
    a = p.parse_args()
    rng = random.Random(0)
    reqs, states = [], []
    for i in range(a.requests):
        out = [rng.randrange(50000) for _ in range(a.output + i % LoopGuard.every)]
        params = types.SimpleNamespace(custom_params={"zipage_think_end": MARKER})
        reqs.append(types.SimpleNamespace(output_ids=out, origin_input_ids=[0] * 512,
                                          sampling_params=params))
        states.append(ReqState(c0=512, think_scanned=len(out), loop_checked_at=len(out)))
    segments, guard = Segments(), LoopGuard()
    scan_s = watch_s = 0.0
    for _ in range(a.steps):
        for r in reqs:
            r.output_ids.append(rng.randrange(50000))
        t0 = time.perf_counter()
        for r, st in zip(reqs, states):
            segments.scan(r, st)
        t1 = time.perf_counter()
        for r, st in zip(reqs, states):
            guard.watch(st, r.output_ids)
        scan_s += t1 - t0
        watch_s += time.perf_counter() - t1
    res = {"think_end_scan_ms_per_step": round(scan_s / a.steps * 1e3, 3),
           "loop_guard_ms_per_step": round(watch_s / a.steps * 1e3, 3)}
    print(res)
    write_json({"command": command_line(prog="benchmarks/reasoning_cost_cpu.py"),
                "commit": git_commit(dirty=True), "versions": versions(),
                "cpu": cpu_model(), "settings": vars(a),
                "results": res}, a.out)


if __name__ == "__main__":
    main()
