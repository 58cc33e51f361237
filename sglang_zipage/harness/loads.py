"""Workloads on an in-process Engine: seeded prompts, the first-wave loads, the streaming
client that drives them.

Every request streams, so its completion_tokens and timestamps are known at all times
(``stream_one``); ``drive_load`` submits a whole load at once, samples the engine every
interval (windows.take_sample), prints a progress line, and aborts what is left at the
end time. Imports no torch and no sglang.
"""

from __future__ import annotations

import asyncio
import random
import time
from dataclasses import dataclass, field
from typing import Dict, List, Optional

from sglang_zipage.harness.windows import log, progress_line, take_sample


@dataclass(frozen=True)
class LoadSpec:
    name: str
    num_requests: int
    input_len: int  # each request's own random ids
    output_len: int
    shared_prefix_len: int  # one prefix, the same for every request, before its own ids
    until: str  # "window": abort at the window end; "complete": all finished or the deadline


# bench_throughput.py's first-wave loads (every request submitted at t=0)
LOADS = {
    "steady": LoadSpec("steady", 512, 512, 16384, 0, "window"),
    "fixed": LoadSpec("fixed", 256, 512, 6144, 0, "complete"),
    "shared": LoadSpec("shared", 512, 512, 16384, 2048, "window"),
    "short": LoadSpec("short", 256, 512, 1024, 0, "complete"),
}
# the zipage counters a first-wave sample keeps
ZIPAGE_SAMPLE_KEYS = ("compactions", "compaction_ms", "compaction_gpu_ms", "tokens_evicted",
                      "compaction_batches", "running_compressed_requests", "max_suffix_tokens",
                      "window_slot_misses", "async_compactions", "async_awaited",
                      "async_fallbacks", "decode_tokens", "compressed_decode_tokens")


def make_prompts(spec: LoadSpec, vocab: int, seed: int) -> List[List[int]]:
    """Random ids in [100, vocab - 100), seeded by (seed, load name): every engine sees the
    same ids."""
    rng = random.Random(f"{seed}-{spec.name}")
    hi = vocab - 100
    prefix = [rng.randrange(100, hi) for _ in range(spec.shared_prefix_len)]
    return [prefix + [rng.randrange(100, hi) for _ in range(spec.input_len)]
            for _ in range(spec.num_requests)]


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


async def sample(engine, run: LoadRun) -> Dict:
    """The client's counters, then the engine's load and zipage counters (read for both
    engines: the same overhead)."""
    stamp = dict(t_s=round(run.now(), 3), output_tokens=run.tokens, retractions=run.retractions,
                 finished=run.finished, started=sum(r.t_first is not None for r in run.records))
    return await take_sample(stamp, engine, ZIPAGE_SAMPLE_KEYS)


async def drive_load(engine, run: LoadRun, prompts, sp: Dict, end_s: float, sample_interval_s: float,
                     progress_s: float, checkpoint=None) -> None:
    """Submit everything, sample every interval until end_s (or all finished), abort.

    checkpoint(run), if given, is called about every 30 s (to save partial results)."""
    run.records = [ReqRecord() for _ in prompts]
    run.t0 = time.perf_counter()
    tasks = [asyncio.create_task(stream_one(engine, run, i, ids, sp)) for i, ids in enumerate(prompts)]
    tick, last_print = 0, None
    while True:
        tick += 1
        await asyncio.sleep(max(0.0, tick * sample_interval_s - run.now()))
        done = all(t.done() for t in tasks)
        s = await sample(engine, run)
        run.samples.append(s)
        if last_print is None or s["t_s"] - last_print["t_s"] >= progress_s - 1e-6 or done:
            print(progress_line(f"{run.which} {run.label or run.spec.name}", last_print, s,
                                of=run.spec.num_requests), flush=True)
            last_print = s
        if checkpoint is not None and tick % max(1, round(30 / sample_interval_s)) == 0:
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
