#!/usr/bin/env python3
"""GPU integration check: the e2e scenarios on the H200 with dummy Qwen3 weights.

For each (attention backend, page size) it starts a stock engine (zipage disabled) and a
zipage engine with a small budget, both with CUDA graphs and the overlap scheduler on, and
SGLang's strict memory checker on, then checks:
  exact     greedy outputs of short requests (which never compress) are token-identical
  compress  many concurrent long requests compress (counted), suffix <= budget + buffer,
            every request completes its full length, the scheduler stays alive
  radix     after compressing requests that share a prompt, a fresh request with that
            prompt hits the cache for the whole prompt and matches stock token for token
Dummy weights are identical across engines (SGLang seeds them per parameter).

usage: python3 benchmarks/gpu_check.py --out results.json [--combos triton:1,triton:16,flashinfer:1]
       [--modes sync,async]   (one stock engine, then one zipage engine per mode)
       [--tp-size 2] [--dp-size 2]   (SGLang's own TP / DP; counters summed over DP replicas,
                                      rows carry tp_size and dp_size)
"""

import argparse
import json
import os
import random
import sys
import time
import traceback

from sglang_zipage.harness import probe
from sglang_zipage.harness.engines import dummy_engine_kwargs, zipage_kwargs
from sglang_zipage.harness.record import command_line, git_commit, gpu_name, write_json
from sglang_zipage.harness.server import STRICT_CHECKS_ENV

N_USERS = int(os.environ.get("GPU_CHECK_USERS", "24"))
VOCAB = int(os.environ.get("GPU_CHECK_VOCAB", "100000"))


def engine(kind, backend, page, model, budget, buffer, extra):
    """kind: stock, sync or async. Decode graphs up to batch 64 unless extra names them."""
    from sglang_zipage import Engine

    kw = dummy_engine_kwargs(model, page_size=page, seed=0, log_level="warning",
                             attention_backend=backend, mem_fraction_static=0.5,
                             disable_prefill_cuda_graph=True, **extra)
    if "cuda_graph_bs_decode" not in kw:
        kw["cuda_graph_max_bs_decode"] = 64
    which = "stock" if kind == "stock" else "zipage"
    return Engine(**kw, **zipage_kwargs(which, dict(mode="fixed", kv_budget=budget, buffer=buffer,
                                                    async_compaction=kind == "async")))


def gen(eng, ids, n, ignore_eos=True):
    outs = eng.generate(input_ids=ids, sampling_params={"max_new_tokens": n, "temperature": 0,
                                                        "ignore_eos": ignore_eos})
    return outs


def scenarios(eng, rng_seed=0):
    rng = random.Random(rng_seed)
    res = {}
    short = [[rng.randrange(100, VOCAB) for _ in range(40 + 7 * i)] for i in range(4)]
    res["exact"] = [gen(eng, [p], 48)[0]["output_ids"] for p in short]  # one at a time
    shared = [rng.randrange(100, VOCAB) for _ in range(300)]
    gen(eng, [shared], 1)  # the shared prompt enters the radix tree alone
    users = [shared + [rng.randrange(100, VOCAB) for _ in range(20)] for _ in range(N_USERS)]
    t0 = time.perf_counter()
    outs = gen(eng, users, 700)
    res["compress_wall_s"] = time.perf_counter() - t0
    res["compress_lengths"] = sorted({o["meta_info"]["completion_tokens"] for o in outs})
    fresh = gen(eng, [users[0]], 32)[0]
    res["radix_output"] = fresh["output_ids"]
    res["radix_cached"] = fresh["meta_info"]["cached_tokens"]
    res["zipage"] = merged(probe.zipage_states(eng))
    return res


def merged(states):
    """One zipage state over DP replicas: counters summed, largest suffix the largest."""
    states = [s for s in states if s]
    if not states:
        return None
    out = dict(states[0])
    for key in ("compactions", "async_compactions", "shadow_tokens_held"):
        out[key] = sum(s.get(key, 0) for s in states)
    out["max_suffix_tokens"] = max(s.get("max_suffix_tokens", 0) for s in states)
    out["replicas"] = len(states)
    return out


def check(stock, zipage, budget, buffer, mode="sync"):
    z = zipage["zipage"] or {}
    return {
        "exact": stock["exact"] == zipage["exact"],
        "compress": (z.get("compactions", 0) > 0 and z.get("max_suffix_tokens", 1 << 30) <= budget + buffer
                     and zipage["compress_lengths"] == [700]
                     and (mode == "sync" or z.get("async_compactions", 0) > 0)
                     and z.get("shadow_tokens_held", 0) == 0),
        "radix": (zipage["radix_output"] == stock["radix_output"]
                  and zipage["radix_cached"] >= 300 and zipage["radix_cached"] >= stock["radix_cached"] - 1),
    }


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--model", default="benchmarks/models/qwen3-1.7b-dummy")
    p.add_argument("--combos", default="triton:1,triton:16,flashinfer:1")
    p.add_argument("--budget", type=int, default=128)
    p.add_argument("--buffer", type=int, default=32)
    p.add_argument("--disable-overlap-schedule", action="store_true")
    p.add_argument("--disable-cuda-graph", action="store_true")
    p.add_argument("--graph-bs", default=None,
                   help="decode batch sizes to capture, e.g. 1,32 (flashinfer's first capture "
                        "compiles for about a minute per batch size on a fresh machine)")
    p.add_argument("--modes", default="sync", help="zipage modes to check: sync, async or both")
    p.add_argument("--tp-size", type=int, default=1)
    p.add_argument("--dp-size", type=int, default=1)
    p.add_argument("--out", required=True)
    a = p.parse_args()
    os.environ.update(STRICT_CHECKS_ENV)
    extra = {}
    if a.disable_overlap_schedule:
        extra["disable_overlap_schedule"] = True
    if a.tp_size > 1:
        extra["tp_size"] = a.tp_size
    if a.dp_size > 1:
        extra["dp_size"] = a.dp_size
    if a.disable_cuda_graph:
        extra["disable_cuda_graph"] = True
    elif a.graph_bs:
        extra["cuda_graph_bs_decode"] = [int(x) for x in a.graph_bs.split(",")]
    report = {"command": command_line(prog=f"{os.path.basename(sys.executable)} {sys.argv[0]}"),
              "gpu": gpu_name(), "commit": git_commit() or "unknown",
              "overlap": not a.disable_overlap_schedule, "cuda_graph": not a.disable_cuda_graph,
              "budget": a.budget, "buffer": a.buffer, "matrix": []}
    modes = [m for m in a.modes.split(",") if m]
    for combo in a.combos.split(","):
        backend, page = combo.split(":")
        page = int(page)
        runs = {}
        try:
            for kind in ("stock", *modes):
                t0 = time.perf_counter()
                eng = engine(kind, backend, page, a.model, a.budget, a.buffer, extra)
                start_s = round(time.perf_counter() - t0, 1)
                try:
                    runs[kind] = scenarios(eng)
                    runs[kind]["start_s"] = start_s
                finally:
                    eng.shutdown()
        except Exception:
            runs["error"] = traceback.format_exc()[-4000:]
        for mode in modes:
            row = {"backend": backend, "page_size": page, "async": mode == "async",
                   "tp_size": a.tp_size, "dp_size": a.dp_size}
            if mode in runs and "stock" in runs:
                row["passed"] = check(runs["stock"], runs[mode], a.budget, a.buffer, mode)
                row["zipage_state"] = runs[mode]["zipage"]
                row["start_s"] = {k: runs[k]["start_s"] for k in ("stock", mode)}
                row["wall_s"] = {k: round(runs[k]["compress_wall_s"], 2) for k in ("stock", mode)}
            else:
                row["error"] = runs.get("error", "engine did not run")
            report["matrix"].append(row)
            print("CHECK", json.dumps({k: v for k, v in row.items() if k != "zipage_state"}), flush=True)
        write_json(report, a.out)


if __name__ == "__main__":
    main()
