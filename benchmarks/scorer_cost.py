#!/usr/bin/env python3
"""What the calibrated scorer costs a compaction on the GPU, beside the window scorer (issue 46).

Qwen3-8B dims (36 layers, 32 query heads, 8 KV heads, head_dim 128, bf16), requests of
S = 2048 + 256 suffix tokens compacted to 2048 on permuted slots, batches of 8 and 32. Per
scorer: the attention stage (kernels.window_attention_scores over W query rows: the window's
16, or K calibrated queries per head rotated to each request's next position:
query_stats.DeviceQueries.at, kernels.rotate_queries), and the whole pipeline the engine runs
(scoring.select_and_compact: scoring, top-k, in-place order, compact_kv); CUDA events,
median of --iters after a warm-up. Also the kernel against its torch twin in bf16 at each W.
Imports torch, triton, bench_kernels (its timer) and sglang_zipage only.

  PYTHONPATH=$PWD python3 benchmarks/scorer_cost.py --out $OUT/scorer-cost.json   (a GPU, ~1 min)
"""

from __future__ import annotations

import argparse

import bench_kernels  # this folder's kernel benchmark: its timer
import torch

from sglang_zipage.harness import record
from sglang_zipage.kernels import window_attention_scores
from sglang_zipage.kernels.reference import window_attention_scores_ref
from sglang_zipage.kv_layout.base import LayerKV
from sglang_zipage.query_stats import DeviceQueries, QueryStats
from sglang_zipage.scoring import Queries, ScoringParams, select_and_compact

L, HQ, HKV, D, S, K = 36, 32, 8, 128, 2304, 2048


def timed_ms(fn, iters: int) -> float:
    return round(bench_kernels.timed_ms(fn, iters), 3)  # CUDA events, median after a warm-up


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--commit", default=None)
    args = ap.parse_args()
    dev, dt = torch.device("cuda"), torch.bfloat16
    g = torch.Generator(device=dev).manual_seed(0)
    n_req = 32
    slots = 1 + n_req * S
    keys = [torch.randn((slots, HKV, D), generator=g, device=dev).to(dt) for _ in range(L)]
    values = [torch.randn((slots, HKV, D), generator=g, device=dev).to(dt) for _ in range(L)]
    src = (torch.randperm(slots - 1, generator=g, device=dev) + 1)[:n_req * S].view(n_req, S)
    lens = torch.full((n_req,), S, dtype=torch.int64, device=dev)
    inv = 1.0 / 1e6 ** (torch.arange(0, D, 2, device=dev, dtype=torch.float64) / D)
    ang = torch.arange(40960, device=dev, dtype=torch.float64)[:, None] * inv[None]
    cos_sin = torch.cat([ang.cos(), ang.sin()], -1).float()
    positions = torch.randint(600, 20000, (n_req,))
    out = {"dims": dict(layers=L, q_heads=HQ, kv_heads=HKV, head_dim=D, suffix=S, kept=K),
           "rows": []}
    params = ScoringParams(decay=0.8, pooling=5)
    for w, kind in ((16, "window"), (16, "calibrated"), (32, "calibrated"), (64, "calibrated"),
                    (128, "calibrated")):
        stats = QueryStats(torch.zeros(L, HQ, D), torch.zeros(L, HQ, D // 2),
                           torch.randn(L, HQ, w, D), True, 0)
        dq = DeviceQueries(stats, range(L), slice(0, HQ), cos_sin, True, dt)
        row = {"scorer": kind, "queries_per_head": w, "stats_bytes": dq.nbytes}
        for r in (8, 32):
            q = (dq.at(positions[:r]) if kind == "calibrated"
                 else Queries(torch.randn((L, r, w, HQ, D), generator=g, device=dev).to(dt)))
            row[f"batch{r}_attention_ms"] = timed_ms(
                lambda: window_attention_scores(q.rows, keys, src[:r], lens[:r], D ** -0.5,
                                                None, None, q.rope), args.iters)
            sb = [torch.zeros((slots, HKV), device=dev) for _ in range(L)]
            kv = LayerKV(keys=keys, values=values)

            def pipeline():
                qq = dq.at(positions[:r]) if kind == "calibrated" else q
                select_and_compact(params, qq, kv, sb, src[:r], lens[:r],
                                   torch.zeros(r, dtype=torch.int64, device=dev),
                                   torch.ones(r, dtype=torch.bool, device=dev), D ** -0.5,
                                   src[:r, :K].clone(), K)
            row[f"batch{r}_compress_ms"] = timed_ms(pipeline, args.iters)
        rope = q.rope and q.rope._replace(positions=q.rope.positions[:4])
        args_ = (q.rows[:2, :4], keys[:2], src[:4], lens[:4], D ** -0.5, None, None, rope)
        a = window_attention_scores(*args_)  # the twin on a slice: bf16 on the GPU
        b = window_attention_scores_ref(*args_)
        row["max_abs_diff_vs_twin"] = float((a - b).abs().max())
        out["rows"].append(row)
        print(row, flush=True)
    record.write_json({"benchmark": "scorer_cost", "command": record.command_line(),
                       "commit": args.commit or record.git_commit(dirty=True),
                       "gpu": record.gpu_name("cuda"), **out}, args.out)


if __name__ == "__main__":
    main()
