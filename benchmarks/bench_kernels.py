"""Benchmark of the compression kernels (selection + compaction) on one GPU.

Qwen3-8B dims: 36 layers, 32 query heads, 8 KV heads, head_dim 128, bf16; S = 2048 + 256
tokens per request, k = 2048; batches of 1, 8 and 32 requests on permuted slots. Measures
(CUDA events, warm-up first, median of N; launch configs swept first at batch 32):
  copy_GBps / compaction_GBps   a device-to-device copy; compact_kv in place, batch 32
  batch{1,8,32}_compress_ms     scoring.select_and_compact, what the engine runs: scoring +
                                top-k + in-place order + compact_kv; each pipeline row also
                                times every stage, compact_kv moving every kept row, the
                                fused global_scores against torch, and scoring with full and
                                lightning redundancy
  qwindow_write_us_per_step     QueryWindow.write for 36 layers of 256 requests, per decode
                                step (CUDA-graph replay; eager too)
  bf16_checks                   Triton vs torch twin on the GPU in bf16
  jit_variants                  compiled Triton variants before and after batches of other
                                shapes: 0 new ones means no compile stall mid-serving
Imports torch, triton and sglang_zipage.{kernels,scoring,query_window,harness.record} only.

Run:  PYTHONPATH=$PWD python3 benchmarks/bench_kernels.py --out results/kernels-h200.json
CPU:  PYTHONPATH=$PWD python3 benchmarks/bench_kernels.py --tiny --out /tmp/k.json
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import time
import traceback

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")  # before the first kernel launch

from sglang_zipage.kernels import (compact_kv_ref, global_scores_ref, select_topk,  # noqa: E402
                                   window_attention_scores_ref)
import triton  # noqa: E402

from sglang_zipage.compaction import S_MAX_ALIGN, aligned_s_max  # noqa: E402
from sglang_zipage.kernels import compaction as compaction_mod  # noqa: E402
from sglang_zipage.kernels import pool_decay_protect as pool_mod  # noqa: E402
from sglang_zipage.kernels import scores as scores_mod  # noqa: E402
from sglang_zipage.kernels.compaction import compact_kv  # noqa: E402
from sglang_zipage.kernels.pool_decay_protect import global_scores  # noqa: E402
from sglang_zipage.kernels.scores import window_attention_scores  # noqa: E402
from sglang_zipage.harness.record import command_line, git_commit, gpu_name, versions, write_json  # noqa: E402
from sglang_zipage.query_window import QueryWindow  # noqa: E402
from sglang_zipage.kv_layout import LayerKV  # noqa: E402
from sglang_zipage.scoring import (Queries, ScoringParams, in_place_order, score_tokens,  # noqa: E402
                                   select_and_compact)

FULL = dict(layers=36, hq=32, hkv=8, d=128, s=2304, k=2048, batches=[1, 8, 32], w=16,
            q_bs=256, dtype=torch.bfloat16, iters=10, copy_bytes=2 << 30)
TINY = dict(layers=2, hq=4, hkv=2, d=64, s=80, k=64, batches=[1, 2], w=4,
            q_bs=4, dtype=torch.float32, iters=1, copy_bytes=1 << 20)


def log(*a):
    print(f"[{time.strftime('%H:%M:%S')}]", *a, flush=True)


def sync():
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def timed_ms(fn, iters, warmup=2):
    """Median wall time of fn() in ms (CUDA events on a GPU)."""
    for _ in range(warmup):
        fn()
    sync()
    times = []
    for _ in range(iters):
        if torch.cuda.is_available():
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end))
        else:
            t0 = time.perf_counter()
            fn()
            times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


class Pool:
    """K/V/score buffers for max(batches) requests plus a disjoint destination region."""

    def __init__(self, cfg, dev, layers=None, n_req=None, seed=0):
        gen = torch.Generator(device=dev).manual_seed(seed)
        self.layers = layers or cfg["layers"]
        self.n_req = n_req or max(cfg["batches"])
        s, k, hkv, d = cfg["s"], cfg["k"], cfg["hkv"], cfg["d"]
        n_slots = 1 + self.n_req * (s + k)
        shape = (n_slots, hkv, d)
        self.k = [torch.randn(shape, generator=gen, device=dev).to(cfg["dtype"]) for _ in range(self.layers)]
        self.v = [torch.randn(shape, generator=gen, device=dev).to(cfg["dtype"]) for _ in range(self.layers)]
        self.sb = [torch.rand((n_slots, hkv), generator=gen, device=dev) * 1e-3 for _ in range(self.layers)]
        perm = torch.randperm(n_slots - 1, generator=gen, device=dev) + 1
        self.src = perm[: self.n_req * s].view(self.n_req, s).contiguous()
        self.disjoint_dst = perm[self.n_req * s :].view(self.n_req, k).contiguous()
        self.lens = torch.full((self.n_req,), s, dtype=torch.int64, device=dev)
        q_shape = (self.layers, self.n_req, cfg["w"], cfg["hq"], d)
        self.q = torch.randn(q_shape, generator=gen, device=dev).to(cfg["dtype"])


def random_keep(layers, n_req, cfg, dev, seed=1):
    gen = torch.Generator(device=dev).manual_seed(seed)
    return select_topk(torch.rand((layers, n_req, cfg["hkv"], cfg["s"]), generator=gen, device=dev), cfg["k"])


def bench_copy(cfg, dev):
    n = cfg["copy_bytes"] // 2
    src, dst = torch.randn(n, device=dev).half(), torch.empty(n, device=dev, dtype=torch.half)
    ms = timed_ms(lambda: dst.copy_(src), cfg["iters"])
    return 2 * n * 2 / ms / 1e6


def compaction_bytes(cfg, layers, n_req):
    elt = torch.empty((), dtype=cfg["dtype"]).element_size()
    rows = layers * n_req * cfg["hkv"] * cfg["k"]
    return rows * (2 * 2 * cfg["d"] * elt + 4 + 4)  # K, V read + written; score written + read


def bench_compaction(cfg, pool, dev):
    """Sweep launch configs in place, adopt the fastest as TUNING, then time both modes."""
    b = max(cfg["batches"])
    keep = random_keep(pool.layers, b, cfg, dev)
    kept = torch.rand(keep.shape, device=dev)
    nbytes = compaction_bytes(cfg, pool.layers, b)
    in_place, disjoint = pool.src[:b, : cfg["k"]].contiguous(), pool.disjoint_dst[:b]
    res = {"bytes": nbytes, "sweep": []}
    configs = [(bj, nw) for bj in (16, 32, 64, 128) for nw in (2, 4, 8)]
    for block_j, num_warps in configs if torch.cuda.is_available() else configs[:1]:
        fn = lambda: compact_kv(pool.k, pool.v, pool.sb, pool.src[:b], keep, in_place, kept,  # noqa: E731
                                block_j=block_j, num_warps=num_warps)
        ms = timed_ms(fn, cfg["iters"])
        res["sweep"].append(dict(block_j=block_j, num_warps=num_warps, ms=ms, GBps=nbytes / ms / 1e6))
        log("compact_kv sweep", res["sweep"][-1])
    best = min(res["sweep"], key=lambda row: row["ms"])
    compaction_mod.TUNING.update(block_j=best["block_j"], num_warps=best["num_warps"])
    res["tuning"] = dict(compaction_mod.TUNING)
    for name, dst in (("in_place", in_place), ("disjoint", disjoint)):
        ms = timed_ms(lambda: compact_kv(pool.k, pool.v, pool.sb, pool.src[:b], keep, dst, kept), cfg["iters"])
        res[name] = dict(ms=ms, GBps=nbytes / ms / 1e6)
    return res


def bench_scores_sweep(cfg, pool):
    """Sweep (BLOCK_S, num_warps) of pass 1, then pass 2; adopt the fastest as TUNING."""
    b = max(cfg["batches"])
    args = (pool.q[:, :b], pool.k, pool.src[:b], pool.lens[:b], cfg["d"] ** -0.5)
    rows_small = max(16, cfg["w"]) * triton.next_power_of_2(cfg["hq"] // cfg["hkv"]) <= 64
    configs = [(64, 4), (64, 8), (128, 4), (128, 8), (32, 4)]
    configs = configs if torch.cuda.is_available() else configs[:1]
    res = {"sweep": []}
    for stage in ("lse", "probs"):
        for conf in configs:
            ms = timed_ms(lambda: window_attention_scores(*args, config={stage: conf}), cfg["iters"])
            res["sweep"].append(dict(stage=stage, block_s=conf[0], num_warps=conf[1], ms=ms))
            log("window_attention_scores sweep", res["sweep"][-1])
        best = min((r for r in res["sweep"] if r["stage"] == stage), key=lambda r: r["ms"])
        scores_mod.TUNING[(stage, rows_small)] = (best["block_s"], best["num_warps"])
    res["tuning"] = {f"{k[0]}_rows_le_64={k[1]}": v for k, v in scores_mod.TUNING.items()}
    res["ms"] = timed_ms(lambda: window_attention_scores(*args), cfg["iters"])
    return res


def bench_pipeline(cfg, pool, b):
    """Stage times and the total of one compression of b requests (in place)."""
    params, k = ScoringParams(), cfg["k"]
    q, src, lens = pool.q[:, :b], pool.src[:b], pool.lens[:b]
    n_stored = torch.full((b,), k, dtype=torch.int64, device=src.device)
    first = torch.ones(b, dtype=torch.bool, device=src.device)
    dst = src[:, :k].contiguous()
    scale = cfg["d"] ** -0.5

    def scoring():
        return score_tokens(params, Queries(q), LayerKV(pool.k, pool.v), pool.sb, src, lens, n_stored, first, scale)

    def full():  # what the engine runs: scoring.select_and_compact
        select_and_compact(params, Queries(q), LayerKV(pool.k, pool.v), pool.sb, src, lens, n_stored,
                           first, scale, dst, k)

    final, g = scoring()
    keep = select_topk(final, k)
    kept = torch.gather(g, -1, keep)
    arranged = in_place_order(keep, params.window)
    kept_arranged = torch.gather(g, -1, arranged)
    it = cfg["iters"]
    att = window_attention_scores(q, pool.k, src, lens, scale)
    stages = (att, pool.sb, src, lens, n_stored, first, params.pooling, params.decay,
              params.sink, params.window)
    return dict(
        batch=b,
        window_scores_ms=timed_ms(lambda: window_attention_scores(q, pool.k, src, lens, scale), it),
        # pooling + decay + protection: the fused kernel, and its torch twin (the staged
        # torch code the engine ran before it)
        global_scores_ms=timed_ms(lambda: global_scores(*stages), it),
        global_scores_torch_ms=timed_ms(lambda: global_scores_ref(*stages), it),
        global_scores_bit_exact=all(torch.equal(x, y) for x, y in
                                    zip(global_scores(*stages), global_scores_ref(*stages))),
        score_tokens_ms=timed_ms(scoring, it),
        select_topk_ms=timed_ms(lambda: select_topk(final, k), it),
        in_place_order_ms=timed_ms(lambda: in_place_order(keep, params.window), it),
        compact_kv_ascending_ms=timed_ms(lambda: compact_kv(pool.k, pool.v, pool.sb, src, keep, dst, kept), it),
        compact_kv_ms=timed_ms(lambda: compact_kv(pool.k, pool.v, pool.sb, src, arranged, dst,
                                                  kept_arranged), it),
        rows_moved_share=(arranged != torch.arange(k, device=src.device)).float().mean().item(),
        total_ms=timed_ms(full, it),
        # what --zipage-redundancy costs on top (issue 17: the default scoring's price)
        **{f"score_tokens_{mode}_ms": timed_ms(lambda mode=mode: score_tokens(
            ScoringParams(redundancy=mode), Queries(q), LayerKV(pool.k, pool.v), pool.sb, src, lens,
            n_stored, first, scale), it) for mode in ("full", "lightning")},
    )


def bench_qwindow(cfg, dev):
    """Per decode step, all layers: what the engine's RadixAttention hook does,
    QueryWindow.write of every layer's [bs, Hq, D] queries (a strided view of a fused qkv
    output, as the model passes them) into the ring at (slot of req_pool_idx, pos % W)."""
    bs, layers, hq, d = cfg["q_bs"], cfg["layers"], cfg["hq"], cfg["d"]
    window = QueryWindow(layers, bs // 4, bs + 1, cfg["w"], hq, d, cfg["dtype"], dev)
    for rpi in range(1, bs // 4 + 1):  # a quarter of the batch holds a slot, the rest write row 0
        window.assign(rpi)
    window.flush()
    qkv = torch.randn((bs, (hq + 2 * cfg["hkv"]) * d), device=dev).to(cfg["dtype"])
    q = qkv[:, : hq * d].view(bs, hq, d)
    rpi = torch.arange(1, bs + 1, device=dev)
    pos = torch.randint(0, 4096, (bs,), device=dev)

    def step():
        for layer in range(layers):
            window.write(layer, q, rpi, pos)

    res = {"q_contiguous": q.is_contiguous(), "slots_held": bs // 4}
    res["eager_us"] = timed_ms(step, 20 if torch.cuda.is_available() else 1) * 1e3
    if torch.cuda.is_available():
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            for _ in range(3):
                step()
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            step()
        res["graph_us"] = timed_ms(graph.replay, 50) * 1e3
    window.ring.zero_()
    step()
    slot = window.slot_of_rpi[rpi]
    expect = torch.zeros_like(window.ring)
    held = slot > 0
    expect[:, slot[held], pos[held] % cfg["w"]] = q[held]
    res["writes_correct"] = bool(torch.equal(window.ring[:, 1:], expect[:, 1:]))
    return res


def bf16_checks(cfg, dev):
    """Triton vs twin in the model dtype: score errors, compaction bit-exactness."""
    layers, n_req = min(cfg["layers"], 4), min(max(cfg["batches"]), 8)
    pool = Pool(cfg, dev, layers=layers, n_req=n_req, seed=5)
    args = (pool.q, pool.k, pool.src, pool.lens, cfg["d"] ** -0.5)
    got, want = window_attention_scores(*args), window_attention_scores_ref(*args)
    err = (got - want).abs()
    out = dict(dtype=str(cfg["dtype"]), layers=layers, requests=n_req,
               scores_max_abs_err=err.max().item(), scores_ref_max=want.max().item(),
               scores_max_rel_err=(err / want.abs().clamp(min=1e-6)).max().item(),
               scores_allclose=bool(torch.allclose(got, want, atol=1e-3, rtol=3e-2)),
               scores_allclose_tol="atol 1e-3, rtol 3e-2",
               topk_agreement=(select_topk(got, cfg["k"]) == select_topk(want, cfg["k"])).float().mean().item())
    keep = random_keep(layers, n_req, cfg, dev, seed=9)
    shift = (torch.arange(cfg["k"], device=dev) + cfg["s"] - cfg["k"]).expand_as(keep).contiguous()
    for name, kp, dst in (("in_place", keep, pool.src[:, : cfg["k"]].contiguous()),
                          ("in_place_order", in_place_order(keep, 16), pool.src[:, : cfg["k"]].contiguous()),
                          ("disjoint", keep, pool.disjoint_dst),
                          ("in_place_max_shift", shift, pool.src[:, : cfg["k"]].contiguous())):
        kept = torch.rand(kp.shape, device=dev)
        twin = ([t.clone() for t in pool.k], [t.clone() for t in pool.v], [t.clone() for t in pool.sb])
        compact_kv(pool.k, pool.v, pool.sb, pool.src, kp, dst, kept)
        compact_kv_ref(*twin, pool.src, kp, dst, kept)
        same = all(torch.equal(a, b) for xs, ys in zip((pool.k, pool.v, pool.sb), twin) for a, b in zip(xs, ys))
        out[f"compaction_{name}_bit_exact"] = same
    return out


KERNELS = (scores_mod._window_lse_kernel, scores_mod._window_probs_kernel,
           pool_mod._global_scores_kernel, compaction_mod._compact_kv_kernel)


def jit_variants(cfg, pool):
    """Batches of shapes the engine meets (elastic: any suffix length) after the ones timed
    above; the planner pads S_max to S_MAX_ALIGN."""
    params, scale, gen = ScoringParams(), cfg["d"] ** -0.5, torch.Generator().manual_seed(3)
    s_full, k_full, n = cfg["s"], cfg["k"], pool.n_req
    shapes = [(n, s_full, k_full), (1, s_full, k_full), (3, s_full // 2, k_full // 4),
              (n // 2 or 1, s_full - 2 * S_MAX_ALIGN, k_full - 8), (7 % n or 1, s_full, k_full // 2 + 3)]
    count = lambda: [kern.compiled_variants() for kern in KERNELS]  # noqa: E731
    res = {"before": count(), "shapes": []}
    for b, s_max, k in shapes:
        s_max = min(aligned_s_max(s_max), s_full)
        k, b = min(k, s_max - 8), min(b, n)
        lens = torch.randint(k + 1, s_max + 1, (b,), generator=gen).to(pool.src.device)
        src = pool.src[:b, :s_max].contiguous()
        n_stored = torch.full((b,), min(k, int(lens.min())), dtype=torch.int64, device=src.device)
        first = torch.zeros(b, dtype=torch.bool, device=src.device)

        def run():
            select_and_compact(params, Queries(pool.q[:, :b]), LayerKV(pool.k, pool.v), pool.sb, src, lens,
                               n_stored, first, scale, src[:, :k].contiguous(), k)
        first_ms = timed_ms(run, 1, warmup=0)
        res["shapes"].append(dict(requests=b, s_max=s_max, k=k, first_call_ms=first_ms,
                                  second_call_ms=timed_ms(run, 1, warmup=0), variants=count()))
    res["after"] = count()
    if None not in res["before"] + res["after"]:
        res["new_variants"] = sum(res["after"]) - sum(res["before"])
    return res


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True, help="JSON output path")
    ap.add_argument("--tiny", action="store_true", help="small dims, runs on CPU (interpreter)")
    ap.add_argument("--commit", default=None,
                    help="git sha to record (default: $ZIPAGE_COMMIT, else git rev-parse HEAD)")
    args = ap.parse_args()
    cfg = TINY if args.tiny else FULL
    dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")

    res = dict(
        command=command_line(prog=f"{os.path.basename(sys.executable)} {sys.argv[0]}"),
        commit=args.commit or git_commit() or "unknown",
        gpu=gpu_name(cpu=f"cpu ({platform.processor()})"),
        versions=versions(("torch", "triton")),
        config={k: (str(v) if k == "dtype" else v) for k, v in cfg.items()},
    )
    log("device", res["gpu"], "config", res["config"])
    res["errors"] = {}

    def section(name, fn):
        """Run one measurement; record a failure and go on, so one run yields the rest."""
        try:
            return fn()
        except Exception as exc:  # noqa: BLE001
            traceback.print_exc()
            res["errors"][name] = f"{type(exc).__name__}: {exc}"
            return None

    res["copy_GBps"] = section("copy", lambda: bench_copy(cfg, dev))
    log("copy GB/s", res["copy_GBps"])
    res["bf16_checks"] = section("bf16_checks", lambda: bf16_checks(cfg, dev))
    log("checks", res["bf16_checks"])
    pool = Pool(cfg, dev)
    res["qwindow"] = section("qwindow", lambda: bench_qwindow(cfg, dev)) or {}
    res["qwindow_write_us_per_step"] = res["qwindow"].get("graph_us", res["qwindow"].get("eager_us"))
    log("query window write", res["qwindow"])
    res["window_scores"] = section("window_scores", lambda: bench_scores_sweep(cfg, pool))
    if res["window_scores"]:
        res[f"batch{max(cfg['batches'])}_window_scores_ms"] = res["window_scores"]["ms"]
    res["compaction"] = section("compaction", lambda: bench_compaction(cfg, pool, dev))
    if res["compaction"] and res["copy_GBps"]:
        res["compaction_GBps"] = res["compaction"]["in_place"]["GBps"]
        res["compaction_vs_copy"] = res["compaction_GBps"] / res["copy_GBps"]
        log("compaction GB/s", round(res["compaction_GBps"], 1), "ratio", round(res["compaction_vs_copy"], 3))
    res["pipeline"] = []
    for b in cfg["batches"]:
        row = section(f"pipeline_batch{b}", lambda: bench_pipeline(cfg, pool, b))
        if row:
            res["pipeline"].append(row)
            res[f"batch{b}_compress_ms"] = row["total_ms"]
        log("pipeline", row)
    res["jit_variants"] = section("jit_variants", lambda: jit_variants(cfg, pool))
    log("jit variants", res["jit_variants"])
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    write_json(res, args.out, indent=2)
    log("wrote", args.out)


if __name__ == "__main__":
    main()
