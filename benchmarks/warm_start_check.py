#!/usr/bin/env python3
"""Does a warm start (steady_state.py --warm-start, harness/warm_start.py) begin where a long
run ends up? Reads steady_state.py runs of one engine, cold (no warm start) and warm, and
compares what their running sets hold over an early span and a late one: running and waiting
requests, pool use, KV tokens a running request holds, retractions, output tok/s. A warm start
does its job when its early span looks like the cold run's late span, not its early one.

  .venv/bin/python benchmarks/warm_start_check.py --runs stock-cold.json stock-warm.json \
      --spans 0-40,40-120,120-330 --out benchmarks/results/warm-start-cpu-tiny.json

The runs behind results/warm-start-cpu-tiny.json (this 2-core CPU, about 6.5 minutes each;
outputs of 1.5k-3k tokens live about a minute, so a cold start's first running set takes
most of two to turn over):
  ARGS="--tiny --num-prompts 1500 --input-len 32 --output-len 3000 --range-ratio 0.5 \
    --request-rate 4 --window-start-s 120 --window-end-s 330 --max-total-tokens 16384 \
    --attention-backend torch_native --zipage-kv-budget 512 --zipage-buffer 64 \
    --zipage-memory-fraction 0.2"
  for e in stock zipage; do
    .venv/bin/python benchmarks/steady_state.py --engine $e $ARGS --out L-$e-cold.json
    .venv/bin/python benchmarks/steady_state.py --engine $e $ARGS --warm-start auto \
      --out L-$e-warm.json
  done
A CPU step costs per running request, not per pool token, so tok/s here says little; the
running requests and what each holds are what the check compares.
"""

from __future__ import annotations

import argparse
import json
from typing import Dict, List

from sglang_zipage.harness.merge import parse_spans, turnover_s, until_abort
from sglang_zipage.harness.record import command_line, git_commit, write_json
from sglang_zipage.harness.windows import rnd, steady_window

KEYS = ("output_tok_s", "mean_running_reqs", "mean_waiting_reqs", "mean_pool_use",
        "retractions_per_min", "finished_per_min")


def held_per_request(samples: List[Dict]) -> float:
    """Mean over samples of KV slots used / running requests."""
    xs = [s["used_tokens"] / s["running_reqs"] for s in samples
          if s.get("running_reqs") and s.get("used_tokens") is not None]
    return rnd(sum(xs) / len(xs), 1) if xs else None


def spans_of(run: Dict, spans: List[List[float]]) -> List[Dict]:
    samples = until_abort(run)
    out = []
    for lo, hi in spans:
        w = steady_window(samples, lo, hi)
        inside = [s for s in samples if lo <= s["t_s"] <= hi]
        out.append(dict(span_s=[lo, hi], **{k: w.get(k) for k in KEYS},
                        tokens_per_running_req=held_per_request(inside)))
    return out


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--runs", nargs="+", required=True, help="steady_state.py result files")
    p.add_argument("--spans", required=True, help="e.g. 10-60,60-240 (s after the load started)")
    p.add_argument("--out", default=None)
    args = p.parse_args(argv)
    spans = parse_spans(args.spans)
    rows = []
    for path in args.runs:
        run = json.load(open(path))
        rows.append(dict(path=path, engine=run["engine"], commit=run.get("commit"),
                         command=run.get("command"), warm_start=run.get("warm_start", {}).get(
                             "requests", 0) if run.get("warm_start") else 0,
                         warm_mean_age=(run.get("warm_start") or {}).get("mean_age"),
                         turnover_s=turnover_s(run), spans=spans_of(run, spans)))
        for s in rows[-1]["spans"]:
            print(f"{run['engine']:6} warm={rows[-1]['warm_start']:3} {s['span_s']}: "
                  + " ".join(f"{k}={s[k]}" for k in ("mean_running_reqs", "mean_pool_use",
                                                      "tokens_per_running_req",
                                                      "retractions_per_min", "output_tok_s")))
    res = dict(benchmark="warm_start_check", command=command_line(), commit=git_commit(),
               spans=spans, runs=rows)
    if args.out:
        write_json(res, args.out)


if __name__ == "__main__":
    main()
