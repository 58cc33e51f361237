#!/usr/bin/env python3
"""Output throughput of stock SGLang 0.5.17 vs sglang-zipage, same workload, one process (issue 8).

For each engine in --engines (default stock then zipage): start it (``sglang_zipage.Engine``;
"stock" passes ``zipage_enabled=False``, which installs no hook), warm it up, run every load in
--load on it, shut it down. Loads (dummy weights, random prompt ids, greedy, ignore_eos, all
requests submitted at t=0; sizes per load: --load steady:output_len=8192,short):
  steady  512 x 512 -> 16384: output tok/s over the window [--window-start-s, --window-end-s]
  fixed   256 x 512 -> 6144: run to completion (or --deadline-s)
  shared  as steady, every prompt one shared --shared-prefix-len (2048) prefix + 512 own
  short   256 x 512 -> 1024: outputs below the budget, compression never triggers
A sampler records output tokens, running/waiting requests, KV usage, retractions and zipage's
counters every second; --out is rewritten after every (engine, load). zipage runs elastic mode;
the committed first-wave rows ran --zipage-option mode=fixed. plot_throughput.py draws the PNG.

CPU check (2-layer Qwen3 written to a temp folder; about 3 minutes):
  .venv/bin/python benchmarks/bench_throughput.py --tiny --load steady --num-requests 8 \\
      --input-len 32 --output-len 2000 --zipage-kv-budget 64 --zipage-buffer 16 \\
      --window-start-s 10 --window-end-s 30 --out /tmp/tp.json --png /tmp/tp.png
Two GPUs (nvidia-h200-x2), both engines at once, one per GPU (throughput-h200.json):
  source benchmarks/device_env.sh && python3 benchmarks/bench_throughput.py --parallel \\
      --load steady --disable-prefill-cuda-graph --window-start-s 150 --window-end-s 330 \\
      --call-budget-s 540 --commit SHA --out $OUT/throughput-h200.json
One GPU: drop --parallel, or one engine per call and --merge stock.json zipage.json --out both.json.
Every row's command: docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import shutil
import subprocess
import sys
import time
import traceback
from typing import Dict, List, Tuple

from sglang_zipage.harness import probe
from sglang_zipage.harness.engines import (add_engine_args, engine_kwargs, model_config,
                                           start_engine, tiny_model_dir, vocab_size, warm_up,
                                           zipage_options)
from sglang_zipage.harness.loads import LOADS, LoadRun, LoadSpec, drive_load, make_prompts
from sglang_zipage.harness.merge import finish_entry, load_entry, merge_first_wave
from sglang_zipage.harness.record import command_line, git_commit, gpu_name, versions, write_json
from sglang_zipage.harness.windows import first_wave_window, log, pct, rnd

HERE = os.path.dirname(os.path.abspath(__file__))
STOCK_NOTE = ("stock = sglang_zipage.Engine(zipage_enabled=False, ...): no zipage hook is "
              "installed, SGLang 0.5.17's own code runs (on a machine without a GPU only the "
              "CPU rotary-import fix is applied, which stock SGLang needs to start there)")
SHARE_NOTE = ("compaction_share = GPU time of the scoring + compaction kernels in the window "
              "(CUDA events around them on their stream, summed as they complete) / window "
              "wall time; compaction_launch_share = the CPU time spent launching them / window")


# ------------------------------------------------------------------ arguments
def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    a = p.add_argument
    a("--engines", default="stock,zipage", help="comma list, run in this order")
    a("--load", default="steady", help=f"comma list of {', '.join(LOADS)}; a load may carry "
      "its own sizes: steady:output_len=8192:num_requests=256")
    a("--num-requests", type=int), a("--input-len", type=int), a("--output-len", type=int)
    a("--shared-prefix-len", type=int)
    a("--window-start-s", type=float, default=90.0, help="window loads: window start after submission")
    a("--window-end-s", type=float, default=170.0, help="window loads: window end = abort time")
    a("--deadline-s", type=float, default=420.0, help="complete loads: abort if not done by then")
    a("--call-budget-s", type=float, default=0.0,
      help="whole-process time limit (e.g. 570 inside a 600 s device call): the last "
           "engine's loads end early enough for the JSON to be written (0 = off)")
    add_engine_args(p)
    a("--sample-interval-s", type=float, default=1.0)
    a("--progress-s", type=float, default=5.0)
    a("--commit", default=None, help="default: $ZIPAGE_COMMIT, else git rev-parse HEAD")
    a("--out", default="throughput.json")
    a("--png", default=None, help="also draw this PNG (needs matplotlib)")
    a("--parallel", action="store_true",
      help="run each engine at the same time in its own process on its own GPU "
           "(CUDA_VISIBLE_DEVICES=0, 1, ...), then merge: side by side on one host")
    a("--merge", nargs="+", default=None, metavar="JSON",
      help="merge single-engine result files into --out instead of running")
    args = p.parse_args(argv)
    args.engine_list = [e.strip() for e in args.engines.split(",") if e.strip()]
    args.load_list = [x.strip() for x in args.load.split(",") if x.strip()]
    for e in args.engine_list:
        if e not in ("stock", "zipage"):
            p.error(f"--engines: unknown engine {e!r}")
    for x in args.load_list:
        try:
            parse_load(x, args)
        except ValueError as e:
            p.error(f"--load: {e}")
    if args.window_end_s <= args.window_start_s:
        p.error("--window-end-s must be > --window-start-s")
    return args


LOAD_KEYS = ("num_requests", "input_len", "output_len", "shared_prefix_len")


def parse_load(item: str, args) -> LoadSpec:
    """'steady' or 'steady:output_len=8192:num_requests=256' -> LoadSpec.

    Order: the table, then --num-requests/--input-len/--output-len (every load),
    --shared-prefix-len (the shared load only), then the item's own key=value pairs."""
    name, *pairs = item.split(":")
    if name not in LOADS:
        raise ValueError(f"unknown load {name!r}; known: {', '.join(LOADS)}")
    over = {k: getattr(args, k) for k in LOAD_KEYS[:3] if getattr(args, k) is not None}
    if name == "shared" and args.shared_prefix_len is not None:
        over["shared_prefix_len"] = args.shared_prefix_len
    for pair in pairs:
        key, _, value = pair.partition("=")
        if key not in LOAD_KEYS or not value.isdigit():
            raise ValueError(f"load {item!r}: expected {'|'.join(LOAD_KEYS)}=INT, got {pair!r}")
        over[key] = int(value)
    return dataclasses.replace(LOADS[name], **over)


def load_specs(args) -> List[Tuple[str, LoadSpec]]:
    return [(item, parse_load(item, args)) for item in args.load_list]


# ------------------------------------------------------------------- drivers
class Clock:
    """Process-wide time budget (--call-budget-s): how long the last load may still run."""

    def __init__(self, budget_s: float):
        self.t0, self.budget_s = time.perf_counter(), budget_s

    def cap(self, end_s: float, reserve_s: float) -> float:
        if not self.budget_s:
            return end_s
        left = self.budget_s - (time.perf_counter() - self.t0) - reserve_s
        return max(5.0, min(end_s, left))


def run_engine(which: str, args, model_dir: str, specs: List[Tuple[str, LoadSpec]], results: Dict,
               clock: Clock, is_last_engine: bool) -> None:
    kw = engine_kwargs(args, model_dir)
    eng_res = results["engines"].setdefault(which, {})
    eng_res["engine_kwargs"] = {k: v for k, v in kw.items() if k != "model_path"}
    engine = None
    try:
        engine, start_s = start_engine(which, kw, zipage_options(args), log)
        eng_res["engine_start_s"] = round(start_s, 1)
        log(f"{which} engine ready in {start_s:.1f} s")
        vocab = vocab_size(model_dir)
        t = time.perf_counter()
        n_warm, out_len = warm_up(engine, which, args, min(specs[0][1].input_len, 512), vocab)
        eng_res["warmup_s"] = round(time.perf_counter() - t, 1)
        eng_res["warmup_output_len"] = out_len
        eng_res["warmup_requests"] = n_warm
        eng_res["server_info"] = probe.info_summary(probe.server_info(engine))
        log(f"{which} warm-up {eng_res['warmup_s']} s; server info {eng_res['server_info']}")
        for label, spec in specs:
            entry = load_entry(results, label, spec, variant(args))
            entry[which] = run_one_load(engine, which, label, spec, args, vocab, clock,
                                        is_last_engine,
                                        save=lambda partial: save_partial(results, entry, which,
                                                                          partial, args.out))
            finish_entry(entry)
            write_json(results, args.out)
    except Exception:
        eng_res["error"] = traceback.format_exc()[-4000:]
        log(f"{which} engine FAILED:\n{eng_res['error']}")
    finally:
        if engine is not None:
            t = time.perf_counter()
            engine.shutdown()
            eng_res["shutdown_s"] = round(time.perf_counter() - t, 1)
        write_json(results, args.out)


def save_partial(results: Dict, entry: Dict, which: str, partial: Dict, path: str) -> None:
    entry[which] = {**partial, "partial": True}
    finish_entry(entry)
    write_json(results, path)


def run_one_load(engine, which: str, label: str, spec: LoadSpec, args, vocab: int,
                 clock: Clock, capped_by_budget: bool, save=None) -> Dict:
    prompts = make_prompts(spec, vocab, args.seed)
    sp = {"max_new_tokens": spec.output_len, "ignore_eos": True, "temperature": 0.0,
          "stream_interval": args.stream_interval}
    end_s = args.window_end_s if spec.until == "window" else args.deadline_s
    # Only the last engine's loads are cut: the time an earlier one may take is unknown.
    capped = clock.cap(end_s, reserve_s=30.0) if capped_by_budget else end_s
    if capped < end_s:
        log(f"--call-budget-s: {which} {label} ends at {capped:.0f} s instead of {end_s:.0f} s")
    log(f"{which} {label}: {spec}; stops at {capped:.0f} s")
    run = LoadRun(which, spec, label)
    checkpoint = None if save is None else (
        lambda r: save(summarize(r, args.window_start_s, capped)))
    engine.loop.run_until_complete(drive_load(engine, run, prompts, sp, capped, args.sample_interval_s,
                                              args.progress_s, checkpoint))
    res = summarize(run, args.window_start_s, capped)
    res["end_s_requested"], res["end_s_effective"] = end_s, round(capped, 1)
    idle = engine.loop.run_until_complete(probe.engine_idle(engine))
    flushed = engine.loop.run_until_complete(engine.tokenizer_manager.flush_cache())
    res["idle_and_cache_flushed_after"] = idle and bool(getattr(flushed, "success", False))
    log(f"{which} {label} done: " + json.dumps(
        {k: v for k, v in res.items() if k not in ("per_request", "samples", "zipage_final_counters")}))
    return res


def variant(args) -> Dict:
    """What besides the load's sizes tells two entries apart (merge.VARIANT_DEFAULTS)."""
    from sglang_zipage.config import ZipageConfig

    return {"kv_cache_dtype": args.kv_cache_dtype,
            "zipage_mode": zipage_options(args).get("mode", ZipageConfig.mode)}


# ------------------------------------------------------------------ summaries
def latency_summary(records) -> Dict:
    ttft = [r.t_first * 1e3 for r in records if r.t_first is not None]
    tpot = [(r.t_last - r.t_first) * 1e3 / (r.tokens - r.tokens_first)
            for r in records if r.t_first is not None and r.tokens > r.tokens_first]
    return dict(p50_ttft_ms=rnd(pct(ttft, 50)), p99_ttft_ms=rnd(pct(ttft, 99)),
                p50_tpot_ms=rnd(pct(tpot, 50)), p99_tpot_ms=rnd(pct(tpot, 99)),
                requests_with_ttft=len(ttft), requests_with_tpot=len(tpot))


def summarize(run: LoadRun, lo_s: float, hi_s: float) -> Dict:
    """lo_s: window start (window loads); hi_s: the time the load was to stop."""
    spec, recs = run.spec, run.records
    finished_len = [r for r in recs if r.finish == "length"]
    out = dict(requests=spec.num_requests, requests_started=sum(r.t_first is not None for r in recs),
               requests_completed=len(finished_len), total_output_tokens=run.tokens,
               total_retractions=run.retractions, elapsed_s=rnd(run.samples[-1]["t_s"] if run.samples else None))
    if spec.until == "complete":
        last = max((r.t_last for r in recs if r.t_last is not None), default=None)
        out["completed"] = len(finished_len) == spec.num_requests
        out["wall_s"] = rnd(last, 3)
        out["output_tok_s"] = round(run.tokens / last, 1) if last else None
        win = first_wave_window(run.samples, 0.0)  # the sampled span: the whole run
        win.pop("output_tok_s", None)  # the headline is tokens / wall_s above
        out.update(win)
    else:
        out["queue_drained_before_window_end"] = (run.samples[-1]["t_s"] < hi_s - 1e-6
                                                  if run.samples else None)
        out.update(first_wave_window(run.samples, lo_s))
    z = run.samples[-1].get("zipage") if run.samples else None
    if z:
        out["zipage_final_counters"] = z
    out.update(latency_summary(recs))
    out["per_request"] = [dict(ttft_ms=rnd(r.t_first * 1e3 if r.t_first is not None else None, 1),
                               last_token_s=rnd(r.t_last, 3), output_tokens=r.tokens,
                               retractions=r.retractions, finish=r.finish) for r in recs]
    out["samples"] = run.samples
    return out


def print_summary(results: Dict) -> None:
    for e in results["loads"]:
        line = {k: e.get(k) for k in ("load", "stock_output_tok_s", "zipage_output_tok_s",
                                      "ratio", "compaction_share")}
        for which in ("stock", "zipage"):
            r = e.get(which) or {}
            line[which] = {k: r.get(k) for k in ("mean_running_reqs", "peak_running_reqs",
                                                 "mean_token_usage", "window_retractions",
                                                 "total_retractions", "compactions_per_s",
                                                 "p50_ttft_ms", "p99_ttft_ms", "p50_tpot_ms",
                                                 "p99_tpot_ms", "wall_s") if k in r}
        print("SUMMARY " + json.dumps(line), flush=True)


def draw_png(json_path: str, png_path: str) -> None:
    """benchmarks/plot_throughput.py, in its own process (it needs matplotlib)."""
    cmd = [sys.executable, os.path.join(HERE, "plot_throughput.py"), json_path, png_path]
    done = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    if done.returncode == 0:
        log(f"wrote {png_path}")
    else:  # the error's last line, e.g. "ModuleNotFoundError: No module named 'matplotlib'"
        why = (done.stderr.strip().splitlines() or ["exit status %d" % done.returncode])[-1]
        log(f"no PNG ({why.split(': ', 1)[-1]}); draw it later: "
            f"python benchmarks/plot_throughput.py {json_path}")


# ---------------------------------------------------------------------- main
def run_parallel(args, argv: List[str]) -> None:
    """One child process per engine, each pinned to its own GPU; then --merge."""
    argv = [a for a in argv if a != "--parallel"]
    base, ext = os.path.splitext(args.out)
    outs, procs = [], []
    for gpu, which in enumerate(args.engine_list):
        out = f"{base}-{which}{ext}"
        env = {**os.environ, "CUDA_VISIBLE_DEVICES": str(gpu)}
        cmd = [sys.executable, os.path.abspath(__file__), *argv, "--engines", which, "--out", out]
        log(f"GPU {gpu}: {which}: {' '.join(cmd)}")
        procs.append(subprocess.Popen(cmd, env=env))
        outs.append(out)
    codes = [p.wait() for p in procs]
    log(f"engine processes exited with {codes}")
    res = merge_first_wave([o for o in outs if os.path.exists(o)], args.out)
    res["command"] = command_line([*argv, "--parallel"])
    res["parallel"] = {w: f"GPU {i}" for i, w in enumerate(args.engine_list)}
    write_json(res, args.out)
    print_summary(res)
    if args.png:
        draw_png(args.out, args.png)


def main(argv=None) -> None:
    args = parse_args(argv)
    if args.merge:
        print_summary(merge_first_wave(args.merge, args.out))
        return
    if args.parallel:
        run_parallel(args, list(sys.argv[1:] if argv is None else argv))
        return
    clock = Clock(args.call_budget_s)
    model_dir = tiny_model_dir() if args.tiny else os.path.abspath(args.model)
    specs = load_specs(args)
    results = dict(benchmark="bench_throughput", command=command_line(),
                   commit=args.commit or git_commit(), gpu=None, versions=versions(),
                   config={k: v for k, v in vars(args).items() if k not in ("engine_list", "load_list")},
                   model_dir=model_dir, model_config=model_config(model_dir),
                   notes={"stock": STOCK_NOTE, "compaction_share": SHARE_NOTE,
                          "retractions": "sum of meta_info num_retractions as streamed: a "
                          "retracted request is counted when it streams again",
                          "tpot": "per request (last - first streamed token time) / tokens "
                          "between; includes stalls (retraction, queueing after retraction)",
                          "window": "window loads measure minutes after a cold start: stock's "
                          "pool is full but its sequences still grow, so its window rate is above "
                          "its long-run rate; the ratio is conservative",
                          "ttft": "first streamed token - submission (all submitted at t=0); "
                          "only requests that started (requests_started): window loads abort the "
                          "queue, so their TTFT percentiles leave out the requests that never ran"},
                   engines={}, loads=[])
    for i, which in enumerate(args.engine_list):
        run_engine(which, args, model_dir, specs, results, clock, i == len(args.engine_list) - 1)
    if args.tiny:
        shutil.rmtree(model_dir, ignore_errors=True)  # its config.json is in the results
    results["gpu"] = gpu_name()  # after the engines: no CUDA context in this process before
    results["total_s"] = round(time.perf_counter() - clock.t0, 1)
    write_json(results, args.out)
    log(f"wrote {args.out}")
    print_summary(results)
    if args.png:
        draw_png(args.out, args.png)


if __name__ == "__main__":
    main()
