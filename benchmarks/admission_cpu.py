#!/usr/bin/env python3
"""Admission on the CPU (issue 30): how many requests run at once, and what the pool holds,
in a busy steady state, under the per-request rule (each running request's reserve, a new
one's prompt + budget + buffer: commit 83cc4bc), under booking at the peak (budget.py A1),
with a budget range (--zipage-min-kv-budget), and on stock, all through steady_state.py
(sglang.bench_serving, Poisson arrivals above capacity) on the 2-layer dummy Qwen3.

Two loads on a 2,048-token pool, budget 64 + buffer 16, 32-token prompts: every output 200
tokens (requests admitted together end together: the running set moves in waves), and
outputs of 50-200 tokens (--range-ratio 0.25: ends are staggered). The structure (running
requests, pool use, retractions) is the evidence; tok/s on a shared 2-core CPU is noisy.

  git worktree add /tmp/oldrule 83cc4bc   # the per-request rule
  .venv/bin/python benchmarks/admission_cpu.py run --old-checkout /tmp/oldrule --dir /tmp/adm
  .venv/bin/python benchmarks/admission_cpu.py summarize --dir /tmp/adm \\
      --out benchmarks/results/admission-cpu.json
About 25 minutes (8 runs of about 3 minutes).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

from sglang_zipage.harness.merge import ratio, steady_summary
from sglang_zipage.harness.record import REPO, command_line, git_commit, write_json

COMMON = ["--tiny", "--input-len", "32", "--output-len", "200", "--window-start-s", "20",
          "--window-end-s", "70", "--zipage-kv-budget", "64", "--zipage-buffer", "16",
          "--max-total-tokens", "2048", "--zipage-memory-fraction", "0.5"]
LOADS = {"one-length": ["--num-prompts", "600", "--request-rate", "8"],
         "staggered": ["--num-prompts", "1500", "--request-rate", "20", "--range-ratio", "0.25"]}
VARIANTS = {"stock": ["--engine", "stock"],
            "per-request-rule": ["--engine", "zipage"],  # run from --old-checkout
            "peak": ["--engine", "zipage"],
            "peak+range-32": ["--engine", "zipage", "--zipage-min-kv-budget", "32"]}


def run(args) -> None:
    for load, flags in LOADS.items():
        os.makedirs(os.path.join(args.dir, load), exist_ok=True)
        for name, variant in VARIANTS.items():
            old = name == "per-request-rule"
            root = args.old_checkout if old else REPO
            cmd = [sys.executable, os.path.join(root, "benchmarks", "steady_state.py"), *COMMON,
                   *flags, *variant, "--out", os.path.join(args.dir, load, f"{name}.json")]
            env = {**os.environ, "PYTHONPATH": root} if old else None
            subprocess.run(cmd, check=False, env=env, cwd="/tmp")


def summarize(args) -> None:
    res = {"command": command_line(), "commit": git_commit(), "loads": {}}
    for load in LOADS:
        runs = {}
        for name in VARIANTS:
            path = os.path.join(args.dir, load, f"{name}.json")
            if os.path.exists(path):
                doc = json.load(open(path))
                runs[name] = {**steady_summary(doc), "command": doc.get("command"),
                              "commit": doc.get("commit")}
        stock = runs.get("stock", {})
        for name, r in runs.items():
            r["vs_stock"] = {k: ratio(r.get(k), stock.get(k))
                             for k in ("output_tok_s", "mean_running_reqs")}
        res["loads"][load] = runs
    write_json(res, args.out)
    for load, runs in res["loads"].items():
        for name, r in runs.items():
            print(f"{load:11s} {name:17s} running {r['mean_running_reqs']}, pool use "
                  f"{r['mean_pool_use']}, retractions/min {r['retractions_per_min']}, "
                  f"tok/s {r['output_tok_s']} ({r['vs_stock']['output_tok_s']}x stock)")


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("mode", choices=("run", "summarize"))
    p.add_argument("--dir", required=True, help="where the runs' JSON files go")
    p.add_argument("--old-checkout", help="a checkout of 83cc4bc (the per-request rule)")
    p.add_argument("--out", help="summarize: the results file")
    args = p.parse_args(argv)
    if args.mode == "run" and not args.old_checkout:
        p.error("run needs --old-checkout")
    run(args) if args.mode == "run" else summarize(args)


if __name__ == "__main__":
    main()
