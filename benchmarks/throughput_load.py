"""One load against one running engine: submit, stream, sample, abort, summarise.

Used by bench_throughput.py (see its docstring for the loads and the CLI). Every request
streams, so its completion_tokens and timestamps are known at all times; a sampler task
records, every sample interval, the output tokens so far, SGLang's load snapshot (running
and waiting requests, KV token usage), retractions and the zipage counters. Rates come
from those samples: a window's output tok/s is the token difference between its first and
last sample over their time difference. Imports no torch and no sglang (spawned SGLang
processes re-import the benchmark's __main__ and with it this module).
"""

from __future__ import annotations

import asyncio
import random
import time
from dataclasses import dataclass, field
from typing import Dict, List, Optional


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
    label: str = ""
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
    state = (await tm.get_internal_state())[0].get("zipage")  # both engines: same overhead
    if zipage and state is not None:
        s["zipage"] = {k: state.get(k) for k in ("compactions", "compaction_ms", "compaction_gpu_ms", "tokens_evicted",
                                                 "compaction_batches", "running_compressed_requests",
                                                 "max_suffix_tokens", "window_slot_misses",
                                                 "async_compactions", "async_awaited",
                                                 "async_fallbacks", "decode_tokens",
                                                 "compressed_decode_tokens")}
    return s


def progress_line(run: LoadRun, prev: Optional[Dict], s: Dict) -> str:
    rate = 0.0
    if prev is not None and s["t_s"] > prev["t_s"]:
        rate = (s["output_tokens"] - prev["output_tokens"]) / (s["t_s"] - prev["t_s"])
    return (f"[{run.which} {run.label or run.spec.name}] t={s['t_s']:6.1f}s tokens={s['output_tokens']} "
            f"tok/s={rate:8.1f} running={s.get('running_reqs')} waiting={s.get('waiting_reqs')} "
            f"usage={s.get('token_usage')} retractions={s['retractions']} "
            f"finished={s['finished']}/{run.spec.num_requests}{zipage_progress(s)}")


def zipage_progress(sample: Dict) -> str:
    """The zipage part of a progress line ('' for stock)."""
    z = sample.get("zipage") or {}
    return (f" compactions={z.get('compactions')} comp_gpu_ms={z.get('compaction_gpu_ms') or 0:.0f}"
            if z else "")


async def drive_load(engine, run: LoadRun, prompts, sp: Dict, end_s: float, args,
                     checkpoint=None) -> None:
    """Submit everything, sample every interval until end_s (or all finished), abort.

    checkpoint(run), if given, is called about every 30 s (to save partial results)."""
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
        if checkpoint is not None and tick % max(1, round(30 / args.sample_interval_s)) == 0:
            checkpoint(run)
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


def window_stats(samples: List[Dict], lo_s: float) -> Dict:
    """Rates between the first sample at/after lo_s and the last sample, which drive_load
    takes at the end time (or when every request has finished), just before aborting."""
    inside = [s for s in samples if s["t_s"] >= lo_s - 1e-6]
    if len(inside) < 2:
        return {"window_error": f"fewer than 2 samples after {lo_s} s"}
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
        d_gpu = (zb.get("compaction_gpu_ms") or 0) - (za.get("compaction_gpu_ms") or 0)
        d_n = (zb["compactions"] or 0) - (za["compactions"] or 0)
        out.update(window_compactions=d_n, compactions_per_s=round(d_n / span, 2),
                   window_compaction_ms=round(d_ms, 1), window_compaction_gpu_ms=round(d_gpu, 1),
                   compaction_share=round(d_gpu / (span * 1e3), 4),
                   compaction_launch_share=round(d_ms / (span * 1e3), 4),
                   window_tokens_evicted=(zb["tokens_evicted"] or 0) - (za["tokens_evicted"] or 0),
                   mean_compressed_running_reqs=rnd(sum(s["zipage"].get("running_compressed_requests") or 0
                                                        for s in inside) / len(inside), 1))
        d_dec = (zb.get("decode_tokens") or 0) - (za.get("decode_tokens") or 0)
        d_comp = (zb.get("compressed_decode_tokens") or 0) - (za.get("compressed_decode_tokens") or 0)
        # the share of the window's decoded tokens that came from compressed KV
        out["compressed_token_share"] = round(d_comp / d_dec, 4) if d_dec else None
    return out


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
        win = window_stats(run.samples, 0.0)  # the sampled span: the whole run
        win.pop("output_tok_s", None)  # the headline is tokens / wall_s above
        out.update(win)
    else:
        out["queue_drained_before_window_end"] = (run.samples[-1]["t_s"] < hi_s - 1e-6
                                                  if run.samples else None)
        out.update(window_stats(run.samples, lo_s))
    z = run.samples[-1].get("zipage") if run.samples else None
    if z:
        out["zipage_final_counters"] = z
    out.update(latency_summary(recs))
    out["per_request"] = [dict(ttft_ms=rnd(r.t_first * 1e3 if r.t_first is not None else None, 1),
                               last_token_s=rnd(r.t_last, 3), output_tokens=r.tokens,
                               retractions=r.retractions, finish=r.finish) for r in recs]
    out["samples"] = run.samples
    return out
