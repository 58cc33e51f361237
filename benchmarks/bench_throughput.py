#!/usr/bin/env python3
"""Output throughput of stock SGLang 0.5.17 vs sglang-zipage, same workload, one process (issue 8).

For each engine in --engines (default stock then zipage): start it, warm it up, run every
load in --load on it, shut it down; then the next engine, with the same model and flags.
Both engines are ``sglang_zipage.Engine``: "stock" passes ``zipage_enabled=False``, which
installs no hook at all (only, on a machine without a GPU, the CPU import fix that stock
SGLang 0.5.17 needs to start there), so it runs SGLang's own code paths.

Loads (dummy weights, random prompt ids, greedy, ignore_eos, all requests submitted at t=0):
  steady  512 x 512 -> 16384: saturated queue; output tok/s over the window
          [--window-start-s, --window-end-s] after submission, then everything is aborted
  fixed   256 x 512 -> 6144: run to completion (or --deadline-s): wall time, output tok/s
  shared  as steady, every prompt = one shared --shared-prefix-len (2048) prefix + 512 own
  short   256 x 512 -> 1024: outputs below the budget, compression never triggers
--num-requests/--input-len/--output-len/--shared-prefix-len override the table.

Every request streams (every --stream-interval tokens) so its completion_tokens and
timestamps are known at all times; a sampler records each second: output tokens so far,
running/waiting requests and KV token usage (SGLang's load snapshot), retractions
(meta_info num_retractions, seen when a retracted request streams again) and, for zipage,
its counters from get_server_info()["internal_states"][0]["zipage"]. A progress line is
printed every --progress-s. Results are rewritten into --out after every (engine, load),
so a run cut short still leaves what it measured; benchmarks/plot_throughput.py draws them.

CPU check (2-layer Qwen3, minutes):
  .venv/bin/python benchmarks/bench_throughput.py --tiny --load steady --num-requests 8 \
      --input-len 32 --output-len 2000 --zipage-kv-budget 64 --zipage-buffer 16 \
      --window-start-s 10 --window-end-s 30 --out /tmp/tp.json --png /tmp/tp.png
GPU (one call, both engines; see benchmarks/README-throughput in the issue report):
  python3 benchmarks/bench_throughput.py --load steady --output-len 16384 \
      --disable-prefill-cuda-graph --window-start-s 90 --window-end-s 170 --out $OUT/steady16k.json
Merge two single-engine runs:  bench_throughput.py --merge a.json b.json --out c.json
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import os
import random
import shlex
import subprocess
import sys
import tempfile
import time
import traceback
from dataclasses import dataclass, field
from typing import Dict, List, Optional

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if REPO not in sys.path:
    sys.path.insert(0, REPO)  # spawned schedulers get sys.path too

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
                    "disable_radix_cache", "schedule_policy", "stream_interval", "version")
STOCK_NOTE = ("stock = sglang_zipage.Engine(zipage_enabled=False, ...): no zipage hook is "
              "installed, SGLang 0.5.17's own code runs (on a machine without a GPU only the "
              "CPU rotary-import fix is applied, which stock SGLang needs to start there)")
SHARE_NOTE = ("compaction_share = delta of zipage compaction_ms over the window / window ms. "
              "compaction_ms is the CPU-side wall time of ZipageRuntime.flush() (scoring + "
              "compaction kernel launches, no device synchronisation), not GPU time")


@dataclass(frozen=True)
class LoadSpec:
    name: str
    num_requests: int
    input_len: int  # each request's own random ids
    output_len: int
    shared_prefix_len: int  # one prefix, the same for every request, before its own ids
    until: str  # "window": abort at --window-end-s; "complete": all finished or --deadline-s


LOADS = {
    "steady": LoadSpec("steady", 512, 512, 16384, 0, "window"),
    "fixed": LoadSpec("fixed", 256, 512, 6144, 0, "complete"),
    "shared": LoadSpec("shared", 512, 512, 16384, 2048, "window"),
    "short": LoadSpec("short", 256, 512, 1024, 0, "complete"),
}


def log(*a) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}]", *a, flush=True)


# ------------------------------------------------------------------ arguments
def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    a = p.add_argument
    a("--engines", default="stock,zipage", help="comma list, run in this order")
    a("--load", default="steady", help=f"comma list of {', '.join(LOADS)}")
    a("--num-requests", type=int), a("--input-len", type=int), a("--output-len", type=int)
    a("--shared-prefix-len", type=int)
    a("--window-start-s", type=float, default=90.0, help="window loads: window start after submission")
    a("--window-end-s", type=float, default=170.0, help="window loads: window end = abort time")
    a("--deadline-s", type=float, default=420.0, help="complete loads: abort if not done by then")
    a("--call-budget-s", type=float, default=0.0,
      help="whole-process time limit (e.g. 580 inside a 600 s device call): the last "
           "engine's window/deadline is cut so the JSON is written in time (0 = off)")
    a("--model", default=DEFAULT_MODEL, help="folder with a config.json (dummy weights)")
    a("--tiny", action="store_true", help="2-layer small Qwen3 written to a temp folder (CPU checks)")
    a("--device", default=None, help="default: cuda if available, else cpu")
    a("--attention-backend", default=None, help="default: triton on GPU, torch_native on CPU")
    a("--mem-fraction-static", type=float, default=None, help="default 0.85 on GPU")
    a("--max-total-tokens", type=int, default=None, help="KV pool size (default: SGLang's; 4096 with --tiny)")
    a("--max-running-requests", type=int, default=None)
    a("--page-size", type=int, default=1)
    a("--chunked-prefill-size", type=int, default=None)
    a("--disable-cuda-graph", action="store_true")
    a("--disable-prefill-cuda-graph", action="store_true",
      help="saves ~45 s of engine start on the H200 (decode graphs stay on)")
    a("--cuda-graph-max-bs", type=int, default=512, help="decode CUDA graphs up to this batch (both engines)")
    a("--stream-interval", type=int, default=8, help="tokens between streamed chunks (sampling param)")
    a("--zipage-kv-budget", type=int, default=2048)
    a("--zipage-buffer", type=int, default=256)
    a("--zipage-option", action="append", default=[], metavar="NAME=VALUE",
      help="any other ZipageConfig field, e.g. redundancy=lightning (repeatable)")
    a("--warmup-requests", type=int, default=8)
    a("--warmup-output-len", type=int, default=None,
      help="default: zipage budget + 2 buffers + 2 windows (two compactions, batch 1 and "
           "batch n-1, so the Triton kernels compile before timing); stock 64")
    a("--sample-interval-s", type=float, default=1.0)
    a("--progress-s", type=float, default=5.0)
    a("--seed", type=int, default=0)
    a("--log-level", default="info")
    a("--commit", default=None, help="default: git rev-parse HEAD, else $ZIPAGE_COMMIT")
    a("--out", default="throughput.json")
    a("--png", default=None, help="also draw this PNG (needs matplotlib)")
    a("--merge", nargs="+", default=None, metavar="JSON",
      help="merge single-engine result files into --out instead of running")
    args = p.parse_args(argv)
    args.engine_list = [e.strip() for e in args.engines.split(",") if e.strip()]
    args.load_list = [x.strip() for x in args.load.split(",") if x.strip()]
    for e in args.engine_list:
        if e not in ("stock", "zipage"):
            p.error(f"--engines: unknown engine {e!r}")
    for x in args.load_list:
        if x not in LOADS:
            p.error(f"--load: unknown load {x!r}; known: {', '.join(LOADS)}")
    if args.window_end_s <= args.window_start_s:
        p.error("--window-end-s must be > --window-start-s")
    return args


def load_specs(args) -> List[LoadSpec]:
    over = {k: getattr(args, k) for k in ("num_requests", "input_len", "output_len",
                                          "shared_prefix_len") if getattr(args, k) is not None}
    specs = []
    for name in args.load_list:
        spec = dataclasses.replace(LOADS[name], **over)
        if name != "shared" and "shared_prefix_len" not in over:
            spec = dataclasses.replace(spec, shared_prefix_len=0)
        specs.append(spec)
    return specs


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
    for name in ("max_running_requests", "chunked_prefill_size"):
        if getattr(args, name) is not None:
            kw[name] = getattr(args, name)
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


def server_info(engine) -> Dict:
    info = engine.get_server_info()
    out = {k: info.get(k) for k in SERVER_INFO_KEYS if k in info}
    states = info.get("internal_states") or [{}]
    if "zipage" in states[0]:
        z = states[0]["zipage"]
        out["zipage"] = {k: z.get(k) for k in ("config", "active", "budget_limit_tokens",
                                                "memory_bytes", "free_window_slots")}
    mem = states[0].get("memory_usage")
    if mem is not None:
        out["memory_usage"] = mem
    return out


# ------------------------------------------------------------------ one load
@dataclass
class ReqRecord:
    t_first: Optional[float] = None  # s after submission, first streamed token
    t_last: Optional[float] = None
    tokens_first: int = 0
    tokens: int = 0  # completion_tokens so far
    retractions: int = 0
    finish: Optional[str] = None  # "length", "abort", "error: ..." or None (not finished)


@dataclass
class LoadRun:
    which: str
    spec: LoadSpec
    t0: float = 0.0
    tokens: int = 0  # sum of completion_tokens over requests, as streamed
    retractions: int = 0
    finished: int = 0
    records: List[ReqRecord] = field(default_factory=list)
    samples: List[Dict] = field(default_factory=list)

    def now(self) -> float:
        return time.perf_counter() - self.t0


async def stream_one(engine, run: LoadRun, i: int, ids: List[int], sp: Dict) -> None:
    rec = run.records[i]
    try:
        gen = await engine.async_generate(input_ids=ids, sampling_params=sp, stream=True)
        async for chunk in gen:
            t, meta = run.now(), chunk["meta_info"]
            n = meta.get("completion_tokens", 0)
            if rec.t_first is None and n > 0:
                rec.t_first, rec.tokens_first = t, n
            run.tokens += n - rec.tokens
            rec.tokens, rec.t_last = max(rec.tokens, n), t
            r = meta.get("num_retractions") or 0
            run.retractions += r - rec.retractions
            rec.retractions = r
            reason = meta.get("finish_reason")
            if reason is not None:
                rec.finish = reason.get("type") if isinstance(reason, dict) else str(reason)
    except Exception as e:  # an abort may surface as an exception
        rec.finish = f"error: {type(e).__name__}: {e}"[:200]
    if rec.finish is not None:
        run.finished += 1


async def take_sample(engine, run: LoadRun, zipage: bool) -> Dict:
    s = dict(t_s=round(run.now(), 3), output_tokens=run.tokens, retractions=run.retractions,
             finished=run.finished, started=sum(r.t_first is not None for r in run.records))
    tm = engine.tokenizer_manager
    try:
        load = (await tm.get_loads())[0]
        s.update(running_reqs=load.num_running_reqs, waiting_reqs=load.num_waiting_reqs,
                 token_usage=load.token_usage, used_tokens=load.num_used_tokens)
    except Exception as e:  # keep sampling tokens even if the snapshot is unavailable
        s["loads_error"] = repr(e)[:200]
    if zipage:
        state = (await tm.get_internal_state())[0].get("zipage") or {}
        s["zipage"] = {k: state.get(k) for k in ("compactions", "compaction_ms", "tokens_evicted",
                                                 "compaction_batches", "running_compressed_requests",
                                                 "max_suffix_tokens", "window_slot_misses")}
    return s


def progress_line(run: LoadRun, prev: Optional[Dict], s: Dict) -> str:
    rate = 0.0
    if prev is not None and s["t_s"] > prev["t_s"]:
        rate = (s["output_tokens"] - prev["output_tokens"]) / (s["t_s"] - prev["t_s"])
    z = s.get("zipage") or {}
    zpart = (f" compactions={z.get('compactions')} comp_ms={z.get('compaction_ms', 0):.0f}"
             if z else "")
    return (f"[{run.which} {run.spec.name}] t={s['t_s']:6.1f}s tokens={s['output_tokens']} "
            f"tok/s={rate:8.1f} running={s.get('running_reqs')} waiting={s.get('waiting_reqs')} "
            f"usage={s.get('token_usage')} retractions={s['retractions']} "
            f"finished={s['finished']}/{run.spec.num_requests}{zpart}")


async def drive_load(engine, run: LoadRun, prompts, sp: Dict, end_s: float, args) -> None:
    """Submit everything, sample every interval until end_s (or all finished), abort."""
    zipage = run.which == "zipage"
    run.records = [ReqRecord() for _ in prompts]
    run.t0 = time.perf_counter()
    tasks = [asyncio.create_task(stream_one(engine, run, i, ids, sp)) for i, ids in enumerate(prompts)]
    tick, last_print = 0, None
    while True:
        tick += 1
        await asyncio.sleep(max(0.0, tick * args.sample_interval_s - run.now()))
        done = all(t.done() for t in tasks)
        s = await take_sample(engine, run, zipage)
        run.samples.append(s)
        if last_print is None or s["t_s"] - last_print["t_s"] >= args.progress_s - 1e-6 or done:
            print(progress_line(run, last_print, s), flush=True)
            last_print = s
        if done or s["t_s"] >= end_s:
            break
    await abort_all(engine, tasks)


async def abort_all(engine, tasks) -> None:
    pending = [t for t in tasks if not t.done()]
    if not pending:
        return
    log(f"aborting {len(pending)} unfinished requests")
    engine.tokenizer_manager.abort_request(abort_all=True)
    _, still = await asyncio.wait(pending, timeout=60)
    for t in still:
        t.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


async def wait_idle(engine, timeout_s: float = 60.0) -> bool:
    t_end = time.perf_counter() + timeout_s
    while time.perf_counter() < t_end:
        load = (await engine.tokenizer_manager.get_loads())[0]
        if load.num_running_reqs == 0 and load.num_waiting_reqs == 0:
            return True
        await asyncio.sleep(0.5)
    return False


async def warmup(engine, n: int, out_len: int, input_len: int, vocab: int, seed: int) -> None:
    """Request 0 runs a 2*16-token head start, then n-1 more join: zipage compacts once
    alone and once as a batch, so its Triton kernels compile outside any timed region."""
    rng = random.Random(f"{seed}-warmup")
    prompts = [[rng.randrange(100, vocab - 100) for _ in range(input_len)] for _ in range(n)]
    sp = {"max_new_tokens": out_len, "ignore_eos": True, "temperature": 0.0, "stream_interval": 1}
    run = LoadRun("warmup", LoadSpec("warmup", n, input_len, out_len, 0, "complete"))
    run.records = [ReqRecord() for _ in prompts]
    run.t0 = time.perf_counter()
    first = asyncio.create_task(stream_one(engine, run, 0, prompts[0], sp))
    while run.records[0].tokens < min(32, out_len // 2) and not first.done():
        await asyncio.sleep(0.05)
    rest = [asyncio.create_task(stream_one(engine, run, i, prompts[i], sp)) for i in range(1, n)]
    await asyncio.gather(first, *rest)


# ------------------------------------------------------------------ summaries
def pct(xs: List[float], q: float) -> Optional[float]:
    if not xs:
        return None
    xs = sorted(xs)
    pos = (len(xs) - 1) * q / 100.0
    lo = int(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def rnd(x, nd=2):
    return None if x is None else round(x, nd)


def latency_summary(records: List[ReqRecord]) -> Dict:
    ttft = [r.t_first * 1e3 for r in records if r.t_first is not None]
    tpot = [(r.t_last - r.t_first) * 1e3 / (r.tokens - r.tokens_first)
            for r in records if r.t_first is not None and r.tokens > r.tokens_first]
    return dict(p50_ttft_ms=rnd(pct(ttft, 50)), p99_ttft_ms=rnd(pct(ttft, 99)),
                p50_tpot_ms=rnd(pct(tpot, 50)), p99_tpot_ms=rnd(pct(tpot, 99)),
                requests_with_ttft=len(ttft), requests_with_tpot=len(tpot))


def window_stats(samples: List[Dict], lo_s: float, hi_s: float) -> Dict:
    """Rates between the first sample at/after lo_s and the last one at/before hi_s."""
    inside = [s for s in samples if lo_s - 1e-6 <= s["t_s"] <= hi_s + 1e-6]
    if len(inside) < 2:
        return {"window_error": f"fewer than 2 samples in [{lo_s}, {hi_s}] s"}
    a, b = inside[0], inside[-1]
    span = b["t_s"] - a["t_s"]
    running = [s["running_reqs"] for s in inside if "running_reqs" in s]
    usage = [s["token_usage"] for s in inside if "token_usage" in s]
    out = dict(window_start_s=a["t_s"], window_end_s=b["t_s"], window_s=round(span, 3),
               window_output_tokens=b["output_tokens"] - a["output_tokens"],
               output_tok_s=round((b["output_tokens"] - a["output_tokens"]) / span, 1),
               mean_running_reqs=rnd(sum(running) / len(running), 1) if running else None,
               peak_running_reqs=max(running) if running else None,
               min_running_reqs=min(running) if running else None,
               mean_token_usage=rnd(sum(usage) / len(usage), 4) if usage else None,
               peak_token_usage=max(usage) if usage else None,
               window_retractions=b["retractions"] - a["retractions"])
    if out["mean_running_reqs"]:
        out["ms_per_token_per_running_req"] = rnd(1e3 * out["mean_running_reqs"] / out["output_tok_s"]
                                                  if out["output_tok_s"] else None)
    if a.get("zipage") and b.get("zipage"):
        za, zb = a["zipage"], b["zipage"]
        d_ms = (zb["compaction_ms"] or 0) - (za["compaction_ms"] or 0)
        d_n = (zb["compactions"] or 0) - (za["compactions"] or 0)
        out.update(window_compactions=d_n, compactions_per_s=round(d_n / span, 2),
                   window_compaction_ms=round(d_ms, 1),
                   compaction_share=round(d_ms / (span * 1e3), 4),
                   window_tokens_evicted=(zb["tokens_evicted"] or 0) - (za["tokens_evicted"] or 0),
                   mean_compressed_running_reqs=rnd(sum(s["zipage"].get("running_compressed_requests") or 0
                                                        for s in inside) / len(inside), 1))
    return out


def summarize(run: LoadRun, lo_s: float, hi_s: float) -> Dict:
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
        win = window_stats(run.samples, 0.0, hi_s)  # the sampled span: the whole run
        win.pop("output_tok_s", None)  # the headline is tokens / wall_s above
        out.update(win)
    else:
        out["queue_drained_before_window_end"] = (run.samples[-1]["t_s"] < hi_s - 1e-6
                                                  if run.samples else None)
        out.update(window_stats(run.samples, lo_s, hi_s))
    z = run.samples[-1].get("zipage") if run.samples else None
    if z:
        out["zipage_final_counters"] = z
    out.update(latency_summary(recs))
    out["per_request"] = [dict(ttft_ms=rnd(r.t_first * 1e3 if r.t_first is not None else None, 1),
                               last_token_s=rnd(r.t_last, 3), output_tokens=r.tokens,
                               retractions=r.retractions, finish=r.finish) for r in recs]
    out["samples"] = run.samples
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


def run_engine(which: str, args, model_dir: str, specs: List[LoadSpec], results: Dict,
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
        out_len = args.warmup_output_len or (
            args.zipage_kv_budget + 2 * args.zipage_buffer + 32 if which == "zipage" else 64)
        t = time.perf_counter()
        engine.loop.run_until_complete(warmup(engine, args.warmup_requests, out_len,
                                              min(specs[0].input_len, 512), vocab, args.seed))
        eng_res["warmup_s"] = round(time.perf_counter() - t, 1)
        eng_res["warmup_output_len"] = out_len
        eng_res["server_info"] = server_info(engine)
        log(f"{which} warm-up {eng_res['warmup_s']} s; server info {eng_res['server_info']}")
        for j, spec in enumerate(specs):
            last = is_last_engine and j == len(specs) - 1
            res = run_one_load(engine, which, spec, args, vocab, clock, last)
            entry = load_entry(results, spec)
            entry[which] = res
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


def run_one_load(engine, which: str, spec: LoadSpec, args, vocab: int, clock: Clock,
                 last: bool) -> Dict:
    prompts = make_prompts(spec, vocab, args.seed)
    sp = {"max_new_tokens": spec.output_len, "ignore_eos": True, "temperature": 0.0,
          "stream_interval": args.stream_interval}
    end_s = args.window_end_s if spec.until == "window" else args.deadline_s
    capped = clock.cap(end_s, reserve_s=30.0) if last else end_s
    if capped < end_s:
        log(f"--call-budget-s: {which} {spec.name} ends at {capped:.0f} s instead of {end_s:.0f} s")
    log(f"{which} {spec.name}: {spec}; stops at {capped:.0f} s")
    run = LoadRun(which, spec)
    engine.loop.run_until_complete(drive_load(engine, run, prompts, sp, capped, args))
    res = summarize(run, args.window_start_s, capped)
    res["end_s_requested"], res["end_s_effective"] = end_s, round(capped, 1)
    idle = engine.loop.run_until_complete(wait_idle(engine))
    flushed = engine.loop.run_until_complete(engine.tokenizer_manager.flush_cache())
    res["idle_and_cache_flushed_after"] = idle and bool(getattr(flushed, "success", False))
    log(f"{which} {spec.name} done: " + json.dumps(
        {k: v for k, v in res.items() if k not in ("per_request", "samples", "zipage_final_counters")}))
    return res


def load_entry(results: Dict, spec: LoadSpec) -> Dict:
    for e in results["loads"]:
        if e["load"] == spec.name and e["spec"] == dataclasses.asdict(spec):
            return e
    e = {"load": spec.name, "spec": dataclasses.asdict(spec)}
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
    res.update(merged_from=[{"path": p, "command": d.get("command"), "commit": d.get("commit")}
                            for p, d in zip(paths, docs)], engines={}, loads=[])
    for d in docs:
        res["engines"].update(d.get("engines", {}))
        for e in d.get("loads", []):
            tgt = load_entry(res, LoadSpec(**e["spec"]))
            for which in ("stock", "zipage"):
                if which in e:
                    tgt[which] = e[which]
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


def main(argv=None) -> None:
    args = parse_args(argv)
    if args.merge:
        print_summary(merge(args.merge, args.out))
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
                          "ttft": "first streamed token - submission (all submitted at t=0)"},
                   engines={}, loads=[])
    for i, which in enumerate(args.engine_list):
        run_engine(which, args, model_dir, specs, results, clock, i == len(args.engine_list) - 1)
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
