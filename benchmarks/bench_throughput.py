#!/usr/bin/env python3
"""Output throughput of stock SGLang 0.5.17 vs sglang-zipage, same workload, one process (issue 8).

For each engine in --engines (default stock then zipage): start it, warm it up, run every
load in --load on it, shut it down; then the next engine, with the same model and flags.
Both engines are ``sglang_zipage.Engine``: "stock" passes ``zipage_enabled=False``, which
installs no hook at all (only, on a machine without a GPU, the CPU import fix that stock
SGLang 0.5.17 needs to start there), so it runs SGLang's own code paths.

zipage runs the engine's default mode, elastic; the fixed-mode rows of the results files ran
before elastic became the default (issue 17): --zipage-option mode=fixed reproduces them.

Loads (dummy weights, random prompt ids, greedy, ignore_eos, all requests submitted at t=0):
  steady  512 x 512 -> 16384: saturated queue; output tok/s over the window
          [--window-start-s, --window-end-s] after submission, then everything is aborted
  fixed   256 x 512 -> 6144: run to completion (or --deadline-s): wall time, output tok/s
  shared  as steady, every prompt = one shared --shared-prefix-len (2048) prefix + 512 own
  short   256 x 512 -> 1024: outputs below the budget, compression never triggers
--num-requests/--input-len/--output-len change every load; one load's own sizes go after
its name: --load steady:output_len=8192,short. The label is the JSON "load" key.

Every request streams (every --stream-interval tokens) so its completion_tokens and
timestamps are known at all times; a sampler records each second: output tokens so far,
running/waiting requests and KV token usage (SGLang's load snapshot), retractions
(meta_info num_retractions, seen when a retracted request streams again) and the zipage
counters of get_server_info()["internal_states"][0]["zipage"]. A progress line is printed
every --progress-s. Results are rewritten into --out after every (engine, load), so a run
cut short keeps what it measured. benchmarks/plot_throughput.py draws the PNG.

The window lies minutes after a cold start: stock's pool is full but its sequences are
still growing, so its window rate is above its long-run rate (requests finishing and
re-admitted, longer sequences); the measured ratio is conservative. In a window that ends
before the first stock request finishes, 8k and 16k outputs behave the same.

CPU check (2-layer Qwen3 written to a temp folder; about 3 minutes):
  .venv/bin/python benchmarks/bench_throughput.py --tiny --load steady --num-requests 8 \
      --input-len 32 --output-len 2000 --zipage-kv-budget 64 --zipage-buffer 16 \
      --window-start-s 10 --window-end-s 30 --out /tmp/tp.json --png /tmp/tp.png
H200 with two GPUs (nvidia-h200-x2), both engines at the same time, one per GPU, one call
(this produced benchmarks/results/throughput-h200.json):
  source benchmarks/device_env.sh && python3 benchmarks/bench_throughput.py --parallel \
      --load steady --disable-prefill-cuda-graph --window-start-s 150 --window-end-s 330 \
      --call-budget-s 540 --commit SHA --out $OUT/throughput-h200.json
One GPU: drop --parallel (stock, then zipage, in one process), or one engine per call
(--engines stock, then --engines zipage) and
  python benchmarks/bench_throughput.py --merge stock.json zipage.json --out both.json
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import json
import os
import random
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
import traceback
from typing import Dict, List, Optional, Tuple

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if importlib.util.find_spec("sglang_zipage") is None:
    # Not installed: the checkout's root (spawned schedulers get sys.path too). Only then:
    # the root holds kernels/, which shadows PyPI's ``kernels`` where that is missing (the
    # GPU bundle), and transformers' import of it then fails (benchmarks/device_env.sh).
    sys.path.insert(0, REPO)

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from throughput_load import (LOADS, LoadRun, LoadSpec, drive_load, log, summarize,  # noqa: E402
                             wait_idle, warmup)

DEFAULT_MODEL = os.path.join(REPO, "benchmarks", "models", "qwen3-8b-dummy")
TINY_CONFIG = dict(hidden_size=256, intermediate_size=512, num_hidden_layers=2,
                   num_attention_heads=4, num_key_value_heads=2, head_dim=64,
                   vocab_size=32000, max_position_embeddings=40960, max_window_layers=2,
                   tie_word_embeddings=True, bos_token_id=1, eos_token_id=2)
SERVER_INFO_KEYS = ("max_total_num_tokens", "max_running_requests", "max_prefill_tokens",
                    "chunked_prefill_size", "cuda_graph_config", "context_len", "page_size",
                    "kv_cache_dtype", "dtype", "device", "attention_backend",
                    "decode_attention_backend", "prefill_attention_backend",
                    "sampling_backend", "mem_fraction_static", "disable_cuda_graph",
                    "disable_radix_cache", "schedule_policy", "stream_interval", "version",
                    "tp_size", "dp_size")
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
    a("--model", default=DEFAULT_MODEL, help="folder with a config.json (dummy weights)")
    a("--tiny", action="store_true", help="2-layer small Qwen3 written to a temp folder (CPU checks)")
    a("--device", default=None, help="default: cuda if available, else cpu")
    a("--attention-backend", default=None, help="default: triton on GPU, torch_native on CPU")
    a("--mem-fraction-static", type=float, default=None, help="default 0.85 on GPU")
    a("--max-total-tokens", type=int, default=None, help="KV pool size (default: SGLang's; 4096 with --tiny)")
    a("--max-running-requests", type=int, default=None)
    a("--kv-cache-dtype", default="auto", help="SGLang's --kv-cache-dtype (both engines), "
      "e.g. fp8_e4m3; a load's JSON entry records it and merges key on it")
    a("--page-size", type=int, default=1)
    a("--chunked-prefill-size", type=int, default=None)
    a("--tp-size", type=int, default=None, help="SGLang tensor parallel (GPUs per replica)")
    a("--dp-size", type=int, default=None, help="SGLang data parallel (replicas)")
    a("--disable-cuda-graph", action="store_true")
    a("--disable-overlap-schedule", action="store_true")
    a("--disable-prefill-cuda-graph", action="store_true",
      help="saves ~45 s of engine start on the H200 (decode graphs stay on)")
    a("--cuda-graph-max-bs", type=int, default=512, help="decode CUDA graphs up to this batch (both engines)")
    a("--stream-interval", type=int, default=8, help="tokens between streamed chunks (sampling param)")
    a("--zipage-kv-budget", type=int, default=2048)
    a("--zipage-buffer", type=int, default=256)
    a("--zipage-option", action="append", default=[], metavar="NAME=VALUE",
      help="any other ZipageConfig field, e.g. redundancy=lightning (repeatable)")
    a("--warmup-requests", type=int, default=None,
      help="default 40 on GPU (1 + 39 later: zipage compacts batches of 1, 32 and 7, the "
           "Triton specialisations seen under load), 8 on CPU")
    a("--warmup-output-len", type=int, default=None,
      help="default: zipage budget + 2 buffers + 32 (two compactions each, so the kernels "
           "compile before timing); stock 64")
    a("--sample-interval-s", type=float, default=1.0)
    a("--progress-s", type=float, default=5.0)
    a("--seed", type=int, default=0)
    a("--log-level", default="info")
    a("--commit", default=None, help="default: git rev-parse HEAD, else $ZIPAGE_COMMIT")
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


def zipage_options(args) -> Dict:
    from sglang_zipage.config import ZipageConfig

    fields = {f.name: f for f in dataclasses.fields(ZipageConfig)}
    opts = {"kv_budget": args.zipage_kv_budget, "buffer": args.zipage_buffer}
    for item in args.zipage_option:
        name, _, text = item.partition("=")
        if name not in fields:
            raise SystemExit(f"--zipage-option {item}: unknown field; known {sorted(fields)}")
        typ = {"int": int, "float": float, "str": str, "bool": lambda s: s.lower() in ("1", "true")}
        opts[name] = typ[fields[name].type if isinstance(fields[name].type, str)
                         else fields[name].type.__name__](text)
    return opts


# ---------------------------------------------------------------- the model
def tiny_model_dir() -> str:
    """A 2-layer Qwen3 config (dummy weights) in a fresh temp folder."""
    with open(os.path.join(REPO, "benchmarks", "models", "qwen3-1.7b-dummy", "config.json")) as f:
        cfg = json.load(f)
    cfg.update(TINY_CONFIG)
    folder = tempfile.mkdtemp(prefix="qwen3-tiny-dummy-")
    with open(os.path.join(folder, "config.json"), "w") as f:
        json.dump(cfg, f, indent=1)
    return folder


def vocab_size(model_dir: str) -> int:
    with open(os.path.join(model_dir, "config.json")) as f:
        return json.load(f)["vocab_size"]


def make_prompts(spec: LoadSpec, vocab: int, seed: int) -> List[List[int]]:
    """Seeded by (seed, load name): both engines see the same ids."""
    rng = random.Random(f"{seed}-{spec.name}")
    hi = vocab - 100
    prefix = [rng.randrange(100, hi) for _ in range(spec.shared_prefix_len)]
    return [prefix + [rng.randrange(100, hi) for _ in range(spec.input_len)]
            for _ in range(spec.num_requests)]


# --------------------------------------------------------------- the engines
def on_gpu(args) -> bool:
    import torch

    return args.device != "cpu" and torch.cuda.is_available()


def engine_kwargs(args, model_dir: str) -> Dict:
    kw = dict(model_path=model_dir, load_format="dummy", skip_tokenizer_init=True,
              sampling_backend="pytorch", grammar_backend="none", page_size=args.page_size,
              random_seed=args.seed, log_level=args.log_level)
    gpu = on_gpu(args)
    if args.device:
        kw["device"] = args.device
    if args.attention_backend or gpu:
        kw["attention_backend"] = args.attention_backend or "triton"
    if args.mem_fraction_static is not None or gpu:
        kw["mem_fraction_static"] = args.mem_fraction_static or 0.85
    max_total = args.max_total_tokens or (4096 if args.tiny else None)
    if max_total:
        kw["max_total_tokens"] = max_total
    if args.kv_cache_dtype != "auto":
        kw["kv_cache_dtype"] = args.kv_cache_dtype
    for name in ("max_running_requests", "chunked_prefill_size", "tp_size", "dp_size"):
        if getattr(args, name) is not None:
            kw[name] = getattr(args, name)
    if args.disable_overlap_schedule:
        kw["disable_overlap_schedule"] = True
    if gpu:
        if args.disable_cuda_graph:
            kw["disable_cuda_graph"] = True
        else:
            kw["cuda_graph_max_bs_decode"] = args.cuda_graph_max_bs
        if args.disable_prefill_cuda_graph:
            kw["disable_prefill_cuda_graph"] = True
    return kw


def zipage_engine_class():
    """sglang_zipage.Engine. Workaround: sglang_zipage/engine.py subclasses ``sglang.Engine``,
    which SGLang 0.5.17 exports as a LazyImport instance (not a class), so the import fails
    with "LazyImport.__init__() takes 3 positional arguments"; resolve it to the class first."""
    import sglang

    if not isinstance(sglang.Engine, type):
        from sglang.srt.entrypoints.engine import Engine as SGLangEngine

        sglang.Engine = SGLangEngine
    from sglang_zipage.engine import Engine

    return Engine


def start_engine(which: str, args, kw: Dict):
    extra = ({"zipage_enabled": False} if which == "stock"
             else {f"zipage_{k}": v for k, v in zipage_options(args).items()})
    log(f"starting {which} engine: {kw} {extra}")
    t0 = time.perf_counter()
    engine = zipage_engine_class()(**kw, **extra)
    return engine, time.perf_counter() - t0


def warm_up(engine, which: str, args, input_len: int, vocab: int) -> Tuple[int, int]:
    """--warmup-requests requests of --warmup-output-len tokens (defaults in their help);
    returns (requests, output length)."""
    out_len = args.warmup_output_len or (
        args.zipage_kv_budget + 2 * args.zipage_buffer + 32 if which == "zipage" else 64)
    n_warm = args.warmup_requests or (40 if on_gpu(args) else 8)
    engine.loop.run_until_complete(warmup(engine, n_warm, out_len, input_len, vocab, args.seed))
    return n_warm, out_len


def server_info(engine) -> Dict:
    info = engine.get_server_info()
    out = {k: info.get(k) for k in SERVER_INFO_KEYS if k in info}
    states = info.get("internal_states") or [{}]
    if "zipage" in states[0]:
        z = states[0]["zipage"]
        out["zipage"] = {k: z.get(k) for k in ("config", "active", "budget_limit_tokens",
                                                "memory_bytes", "free_window_slots")}
    out["effective_max_running_requests"] = states[0].get("effective_max_running_requests_per_dp")
    mem = states[0].get("memory_usage")
    if mem is not None:
        out["memory_usage"] = mem
    return out


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
        engine, start_s = start_engine(which, args, kw)
        eng_res["engine_start_s"] = round(start_s, 1)
        log(f"{which} engine ready in {start_s:.1f} s")
        vocab = vocab_size(model_dir)
        t = time.perf_counter()
        n_warm, out_len = warm_up(engine, which, args, min(specs[0][1].input_len, 512), vocab)
        eng_res["warmup_s"] = round(time.perf_counter() - t, 1)
        eng_res["warmup_output_len"] = out_len
        eng_res["warmup_requests"] = n_warm
        eng_res["server_info"] = server_info(engine)
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
    engine.loop.run_until_complete(drive_load(engine, run, prompts, sp, capped, args, checkpoint))
    res = summarize(run, args.window_start_s, capped)
    res["end_s_requested"], res["end_s_effective"] = end_s, round(capped, 1)
    idle = engine.loop.run_until_complete(wait_idle(engine))
    flushed = engine.loop.run_until_complete(engine.tokenizer_manager.flush_cache())
    res["idle_and_cache_flushed_after"] = idle and bool(getattr(flushed, "success", False))
    log(f"{which} {label} done: " + json.dumps(
        {k: v for k, v in res.items() if k not in ("per_request", "samples", "zipage_final_counters")}))
    return res


# Entries written before a key was recorded ran these (fixed was the mode's default until
# issue 17 made it elastic).
VARIANT_DEFAULTS = {"kv_cache_dtype": "auto", "zipage_mode": "fixed"}


def variant(args) -> Dict:
    """What besides the load's sizes tells two entries apart."""
    from sglang_zipage.config import ZipageConfig

    return {"kv_cache_dtype": args.kv_cache_dtype,
            "zipage_mode": zipage_options(args).get("mode", ZipageConfig.mode)}


def load_entry(results: Dict, label: str, spec: LoadSpec, var: Dict) -> Dict:
    """One entry per (load, sizes, variant)."""
    for e in results["loads"]:
        if (e["load"] == label and e["spec"] == dataclasses.asdict(spec)
                and all(e.get(k, d) == var[k] for k, d in VARIANT_DEFAULTS.items())):
            return e
    # every load here submits all its requests at t=0: the first wave (steady_state.py
    # measures staggered arrivals)
    e = {"load": label, "spec": dataclasses.asdict(spec), **var, "regime": "first-wave",
         "output_len": spec.output_len}
    results["loads"].append(e)
    return e


def finish_entry(e: Dict) -> None:
    s, z = e.get("stock") or {}, e.get("zipage") or {}
    e["stock_output_tok_s"] = s.get("output_tok_s")
    e["zipage_output_tok_s"] = z.get("output_tok_s")
    e["ratio"] = (round(z["output_tok_s"] / s["output_tok_s"], 3)
                  if s.get("output_tok_s") and z.get("output_tok_s") else None)
    e["compaction_share"] = z.get("compaction_share")


# ------------------------------------------------------------------ metadata
def git_commit() -> Optional[str]:
    try:
        return subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True,
                              text=True, timeout=10, check=True).stdout.strip()
    except Exception:
        return os.environ.get("ZIPAGE_COMMIT")


def versions() -> Dict:
    out = {"python": sys.version.split()[0]}
    for mod in ("sglang", "torch", "triton", "sglang_zipage"):
        try:
            out[mod] = __import__(mod).__version__
        except Exception as e:
            out[mod] = f"unavailable: {e}"
    return out


def gpu_name() -> str:
    import torch

    return torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu"


def write_json(results: Dict, path: str) -> None:
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(results, f, indent=1, default=str)
    os.replace(tmp, path)


# ---------------------------------------------------------------------- main
def merge(paths: List[str], out: str) -> Dict:
    """Combine result files (e.g. one per engine) load by load; later files win."""
    docs = [json.load(open(p)) for p in paths]
    res = {k: v for k, v in docs[0].items() if k not in ("loads", "engines")}
    sources = []  # a merged file passes its own sources on, so provenance survives re-merging
    for p, d in zip(paths, docs):
        sources += d.get("merged_from") or [{"path": p, "command": d.get("command"),
                                             "commit": d.get("commit")}]
    res.update(merged_from=sources, engines={}, loads=[])
    for d in docs:
        res["engines"].update(d.get("engines", {}))
        for e in d.get("loads", []):
            tgt = load_entry(res, e["load"], LoadSpec(**e["spec"]),
                             {k: e.get(k, d) for k, d in VARIANT_DEFAULTS.items()})
            for which in ("stock", "zipage"):
                if which in e:
                    # each engine's numbers keep the command and commit that measured them
                    tgt[which] = {"command": e.get("command", d.get("command")),
                                  "commit": e.get("commit", d.get("commit")), **e[which]}
            finish_entry(tgt)
    write_json(res, out)
    return res


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
    res = merge([o for o in outs if os.path.exists(o)], args.out)
    res["command"] = " ".join(shlex.quote(x) for x in [sys.argv[0], *argv, "--parallel"])
    res["parallel"] = {w: f"GPU {i}" for i, w in enumerate(args.engine_list)}
    write_json(res, args.out)
    print_summary(res)
    if args.png:
        from plot_throughput import plot
        plot(args.out, args.png)


def main(argv=None) -> None:
    args = parse_args(argv)
    if args.merge:
        print_summary(merge(args.merge, args.out))
        return
    if args.parallel:
        run_parallel(args, list(sys.argv[1:] if argv is None else argv))
        return
    clock = Clock(args.call_budget_s)
    model_dir = tiny_model_dir() if args.tiny else os.path.abspath(args.model)
    specs = load_specs(args)
    results = dict(benchmark="bench_throughput", command=" ".join(shlex.quote(x) for x in sys.argv),
                   commit=args.commit or git_commit(), gpu=None, versions=versions(),
                   config={k: v for k, v in vars(args).items() if k not in ("engine_list", "load_list")},
                   model_dir=model_dir, model_config=json.load(open(os.path.join(model_dir, "config.json"))),
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
        try:
            from plot_throughput import plot
        except ImportError:
            sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
            from plot_throughput import plot
        try:
            plot(args.out, args.png)
            log(f"wrote {args.png}")
        except ImportError as e:
            log(f"no PNG ({e}); draw it later: python benchmarks/plot_throughput.py {args.out}")


if __name__ == "__main__":
    main()
