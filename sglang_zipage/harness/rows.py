"""A merged steady state as a row of the throughput table (bench_throughput's result file,
its ``loads``): ``throughput_row`` writes it, ``add_row`` puts it in place of the row of the
same load, backend, budget floor, prompt compression and warm start."""

from __future__ import annotations

import json
import os
import shlex
from typing import Dict

from sglang_zipage.harness.merge import turnover_s
from sglang_zipage.harness.record import write_json
from sglang_zipage.harness.windows import rnd

ROW_BENCH_KEYS = ("completed", "total_output_tokens", "output_throughput", "median_e2e_latency_ms",
                  "median_ttft_ms", "p99_ttft_ms", "median_tpot_ms", "p99_tpot_ms",
                  "median_itl_ms", "p99_itl_ms")
ROW_WINDOW_KEYS = ("output_tok_s", "mean_running_reqs", "min_running_reqs", "max_running_reqs",
                   "mean_waiting_reqs", "mean_pool_use", "retractions_per_min",
                   "finished_per_min", "server_tpot_ms", "compaction_share")


def flag_value(command: str, flag: str, default: str) -> str:
    words = shlex.split(command or "")
    return words[words.index(flag) + 1] if flag in words[:-1] else default


def throughput_row(merged: Dict, source: str) -> Dict:
    """A merged steady-state file as a row of bench_throughput's result file (its "loads"),
    with "regime": "steady-state"; the time series stay in ``source``. The merged file's
    hand-written "device_command" and "caveat" come along."""
    engines, load = merged["engines"], merged["engines"]["stock"]["load"]

    def engine(run):
        w = run["window"]
        return dict(command=run["command"], commit=(run.get("commit") or "")[:7],
                    server_command=run["server"].get("command"),
                    window_start_s=w["start_s"], window_end_s=w["end_s"],
                    **{k: w.get(k) for k in ROW_WINDOW_KEYS},
                    bench_serving={k: rnd(run["bench_serving"][k], 2) for k in ROW_BENCH_KEYS
                                   if k in run["bench_serving"]},
                    **({"warm_start_requests": run["warm_start"]["requests"]}
                       if run.get("warm_start") else {}))

    stock, zipage = engine(engines["stock"]), engine(engines["zipage"])
    zipage_cmd = zipage["server_command"]
    turns = {name: turnover_s(engines[name]) for name in ("stock", "zipage")}
    stock["turnover_s"], zipage["turnover_s"] = turns["stock"], turns["zipage"]
    backends = {(engines[name]["server"].get("info") or {}).get("attention_backend")
                for name in ("stock", "zipage")}
    floor = flag_value(zipage_cmd, "--zipage-min-kv-budget", None)
    spread = load.get("range_ratio", 1.0)  # output lengths uniform in [spread x len, len]
    return dict(
        load=f"poisson:rate={load['request_rate']:g}:output_len={load['output_len']}"
             + (f":range_ratio={spread:g}" if spread != 1.0 else ""),
        spec=dict(name="poisson", num_requests=load["num_prompts"], input_len=load["input_len"],
                  output_len=load["output_len"], shared_prefix_len=0, until="window",
                  request_rate=load["request_rate"], range_ratio=spread,
                  arrivals=f"sglang.bench_serving --request-rate {load['request_rate']:g} "
                           "(Poisson), random ids, ignore_eos"),
        kv_cache_dtype=flag_value(zipage_cmd, "--kv-cache-dtype", "auto"),
        zipage_mode=flag_value(zipage_cmd, "--zipage-mode", "elastic"),
        stock=stock, zipage=zipage, stock_output_tok_s=stock["output_tok_s"],
        zipage_output_tok_s=zipage["output_tok_s"], ratio=merged["output_tok_s_ratio"],
        compaction_share=zipage["compaction_share"], regime="steady-state",
        # long-run: the window starts after stock's first running set turned over; warm-start:
        # the load began with a long run's running set (warm_start.py)
        span=("warm-start" if load.get("warm_start") else
              "long-run" if turns["stock"] is not None and stock["window_start_s"] >= turns["stock"]
              else "first-wave"),
        **({"warm_start": load["warm_start"]} if load.get("warm_start") else {}),
        attention_backend=backends.pop() if len(backends) == 1 else sorted(map(str, backends)),
        **({"zipage_min_kv_budget": int(floor)} if floor else {}),
        **({"zipage_compress_prompt": True}
           if "--zipage-compress-prompt" in (zipage_cmd or "").split() else {}),
        output_len=load["output_len"], gpu=merged.get("gpu"),
        source=f"{source} (time series, spans, notes)",
        device_command=merged.get("device_command"), caveat=merged.get("caveat"),
        spans=merged.get("spans"))


def add_row(merged_path: str, results_path: str) -> Dict:
    """Put a merged file's row into a bench_throughput result file, replacing the row of the
    same load, attention backend, budget floor, prompt compression and warm start, and write
    it back."""
    with open(merged_path) as f:
        row = throughput_row(json.load(f), os.path.basename(merged_path))
    with open(results_path) as f:
        res = json.load(f)
    loads = res.setdefault("loads", [])

    def key(e):
        return (e.get("load"), e.get("attention_backend"), e.get("zipage_min_kv_budget"),
                e.get("zipage_compress_prompt"), e.get("warm_start"))

    same = [i for i, e in enumerate(loads) if key(e) == key(row)]
    if same:
        loads[same[0]] = row
    else:
        loads.append(row)
    write_json(res, results_path)
    return row
