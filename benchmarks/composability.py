#!/usr/bin/env python3
"""Compression on SGLang's fast path (issue 5): output tok/s per configuration, and the
integration matrix, in one JSON (benchmarks/results/composability-h200.json).

  run    for each --configs entry, bench_throughput.py with --engines zipage and that
         configuration's flags, on the same load (the rest of the arguments are passed on);
         one JSON per configuration in --dir
  merge  configuration JSONs + gpu_check.py JSONs -> the summary (--out)

Configurations: async (async + overlap + CUDA graphs), sync (overlap + graphs),
async-nooverlap, async-nograph, sync-nooverlap, sync-nograph.

H200 (two GPUs, one call; the gpu_check matrix on one GPU, configurations on the other):
  python3 benchmarks/composability.py run --configs async,sync --dir $OUT/c -- \\
      --model benchmarks/models/qwen3-1.7b-dummy --load steady:num_requests=128 \\
      --window-start-s 40 --window-end-s 70 --disable-prefill-cuda-graph
  python3 benchmarks/composability.py merge --dir $OUT/c --matrix $OUT/m1.json --out comp.json
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import subprocess
import sys

from sglang_zipage.harness.record import write_json

HERE = os.path.dirname(os.path.abspath(__file__))
CONFIGS = {
    "async": dict(async_=True, overlap=True, cuda_graph=True),
    "sync": dict(async_=False, overlap=True, cuda_graph=True),
    "async-nooverlap": dict(async_=True, overlap=False, cuda_graph=True),
    "async-nograph": dict(async_=True, overlap=True, cuda_graph=False),
    "sync-nooverlap": dict(async_=False, overlap=False, cuda_graph=True),
    "sync-nograph": dict(async_=False, overlap=True, cuda_graph=False),
}


def flags(name: str):
    c = CONFIGS[name]
    out = ["--engines", "zipage", "--zipage-option", "mode=fixed"]  # compress at the limit
    if c["async_"]:
        out += ["--zipage-option", "async_compaction=true"]
    if not c["overlap"]:
        out.append("--disable-overlap-schedule")
    if not c["cuda_graph"]:
        out.append("--disable-cuda-graph")
    return out


def run(args, rest) -> None:
    """bench_throughput.py once per configuration, each in its own process."""
    os.makedirs(args.dir[0], exist_ok=True)
    for name in args.configs.split(","):
        out = os.path.join(args.dir[0], f"{name}.json")
        print(f"[composability] {name}", flush=True)
        subprocess.run([sys.executable, os.path.join(HERE, "bench_throughput.py"),
                        *rest, *flags(name), "--out", out], check=False)


def merge(args) -> None:
    tables = [_configs(d) for d in args.dir]
    configs = tables[0]
    matrix, gpu, commit = [], None, None
    for path in args.matrix:
        doc = json.load(open(path))
        gpu, commit = doc.get("gpu", gpu), doc.get("commit", commit)
        for row in doc["matrix"]:
            for scenario in ("exact", "compress", "radix"):
                matrix.append({"scenario": scenario, "backend": row["backend"],
                               "page_size": row["page_size"], "async": row.get("async", False),
                               "overlap": doc.get("overlap"), "cuda_graph": doc.get("cuda_graph"),
                               "passed": bool((row.get("passed") or {}).get(scenario)),
                               "commit": doc.get("commit"), "source": os.path.basename(path),
                               **({"error": row["error"][-500:]} if "error" in row else {})})
    best = max((c for c in configs if c["output_tok_s"]), key=lambda c: c["output_tok_s"], default=None)
    res = {"configs": configs, "configs_other": [c for t in tables[1:] for c in t],
           "matrix": matrix, "fastest": best and best["config"],
           "gpu": gpu, "commit": args.commit or commit, "command": args.command,
           "notes": {"compaction_share": "GPU time of scoring + compaction kernels (CUDA events "
                     "on their stream) / window wall time; in async mode they overlap decode",
                     "async_awaited_share": "async compactions the next forward had to wait "
                     "for at the limit (not finished in time) / async compactions"}}
    write_json(res, args.out)
    for c in configs:
        print("CONFIG", json.dumps({k: c[k] for k in ("config", "output_tok_s", "compaction_share",
                                                      "async_awaited_share", "error")}))
    print("MATRIX passed", sum(r["passed"] for r in matrix), "of", len(matrix))


def _configs(folder):
    configs = []
    for path in sorted(glob.glob(os.path.join(folder, "*.json"))):
        name = os.path.splitext(os.path.basename(path))[0]
        if name not in CONFIGS:
            continue
        doc = json.load(open(path))
        load = (doc.get("loads") or [{}])[0]
        z = load.get("zipage") or {}
        c = CONFIGS[name]
        configs.append({"config": name, "async": c["async_"], "overlap": c["overlap"],
                        "cuda_graph": c["cuda_graph"], "output_tok_s": z.get("output_tok_s"),
                        "compaction_share": z.get("compaction_share"),
                        "compactions_per_s": z.get("compactions_per_s"),
                        "mean_running_reqs": z.get("mean_running_reqs"),
                        "p50_tpot_ms": z.get("p50_tpot_ms"), "p99_tpot_ms": z.get("p99_tpot_ms"),
                        "async_awaited_share": _awaited_share(z),
                        "error": (doc.get("engines", {}).get("zipage") or {}).get("error"),
                        "command": doc.get("command"), "load": load.get("spec"),
                        "commit": doc.get("commit")})
    return configs


def _awaited_share(z):
    counters = z.get("zipage_final_counters") or {}
    n = counters.get("async_compactions") or 0
    return round(counters.get("async_awaited", 0) / n, 4) if n else None


def main() -> None:
    argv = sys.argv[1:]
    rest = []
    if "--" in argv:
        i = argv.index("--")
        argv, rest = argv[:i], argv[i + 1:]
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("mode", choices=("run", "merge"))
    p.add_argument("--configs", default="async,sync,async-nooverlap,async-nograph")
    p.add_argument("--dir", required=True, nargs="+", help="per-configuration JSONs (merge: "
                   "several folders; the first holds the main table, later ones go to "
                   "configs_other)")
    p.add_argument("--matrix", nargs="*", default=[], help="gpu_check.py JSONs (merge)")
    p.add_argument("--commit", default=None)
    p.add_argument("--command", default=None, help="the command line(s) to record (merge)")
    p.add_argument("--out", default=None)
    args = p.parse_args(argv)
    if args.mode == "run":
        run(args, rest)
    else:
        merge(args)


if __name__ == "__main__":
    main()
