#!/usr/bin/env python3
"""What one decode step with many short sequences costs, and where it goes (issue 18, item 2).

For each engine in --engines: start it (bench_throughput.py's engine and flags), warm it up,
then hold --running requests in decode at the same KV per request for both engines: zipage in
fixed mode with prompts of --input-len ids, cycling between budget and budget + buffer once
every request has generated budget + 2 buffers; stock with prompts that give about the same
KV (the pool's used tokens at both ends of the measurement are recorded). Then:
  step time  over --measure-s: running x seconds / output tokens
  profile    SGLang's own profiler over --profile-steps forward steps, summarised: GPU kernel
             time per step by kernel and group (attention, GEMM, zipage's kernels, the rest),
             GPU busy per step, and the CPU time per step of sglang_zipage's and SGLang's
             Python functions. The raw trace stays in --trace-dir.

H200, Qwen3-8B shape, 266 running, budget 512 + 64:
  source benchmarks/device_env.sh && python3 benchmarks/step_profile.py --engines zipage,stock \\
      --attention-backend triton --disable-prefill-cuda-graph --zipage-kv-budget 512 \\
      --zipage-buffer 64 --commit SHA --out $OUT/step-triton.json
(--attention-backend flashinfer for the other backend.) CPU check (tiny model, ~4 min):
  .venv/bin/python benchmarks/step_profile.py --tiny --running 6 --input-len 160 \\
      --zipage-kv-budget 64 --zipage-buffer 16 --stock-output-len 400 --profile-steps 4 \\
      --out /tmp/sp.json
"""

from __future__ import annotations

import argparse
import asyncio
import gzip
import json
import os
import re
import time
from collections import defaultdict
from typing import Dict, List, Tuple

from sglang_zipage.harness import probe
from sglang_zipage.harness.engines import (add_engine_args, engine_kwargs, on_gpu, start_engine,
                                           tiny_model_dir, vocab_size, warm_up, zipage_options)
from sglang_zipage.harness.loads import LoadRun, LoadSpec, ReqRecord, abort_all, make_prompts, stream_one
from sglang_zipage.harness.record import command_line, git_commit, gpu_name, versions, write_json
from sglang_zipage.harness.windows import log

GROUPS = (  # first match wins; matched against the kernel name
    ("zipage", re.compile(r"_window_lse|_window_probs|_global_scores|_compact_kv|qwindow|"
                          r"_query_window|zipage", re.I)),
    ("attention", re.compile(r"fwd_kernel|decode|BatchDecode|BatchPrefill|flashinfer|attn|"
                             r"attention|_fwd_", re.I)),
    ("gemm", re.compile(r"gemm|nvjet|cutlass|xmma|sm90|sm100|cublas|splitK", re.I)),
)
SCHEDULER_FUNCS = re.compile(r": (get_next_batch_to_run|run_batch|process_batch_result|"
                             r"update_running_batch|prepare_for_decode|recv_requests|"
                             r"process_input_requests|forward_batch_generation|"
                             r"init_forward_metadata|replay|replay_prepare)$")


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    a = p.add_argument
    a("--engines", default="zipage,stock")
    a("--running", type=int, default=266,
      help="requests held in decode (also --max-running-requests unless given)")
    a("--input-len", type=int, default=128, help="zipage's prompt length")
    a("--output-len", type=int, default=16384, help="max_new_tokens (never reached)")
    a("--stock-output-len", type=int, default=1024)
    a("--measure-s", type=float, default=5.0)
    a("--profile-steps", type=int, default=16)
    a("--trace-dir", default="/tmp/zipage-step-traces")
    a("--commit", default=None, help="default: $ZIPAGE_COMMIT, else git rev-parse HEAD")
    a("--out", default="step_profile.json")
    add_engine_args(p)
    args = p.parse_args(argv)
    if args.max_running_requests is None:
        args.max_running_requests = args.running
    if not any(o.startswith("mode=") for o in args.zipage_option):
        args.zipage_option.append("mode=fixed")  # compress at the limit, whatever the pool
    if "stock" in args.engines and kv_per_request(args) - 128 < 32:
        p.error("stock's prompts are --input-len + budget + buffer / 2 - 128 ids: raise "
                "--input-len so that they are at least 32")
    return args


def kv_per_request(args) -> float:
    return args.input_len + args.zipage_kv_budget + args.zipage_buffer / 2


def prompts_for(which: str, args, vocab: int) -> Tuple[List[List[int]], int]:
    """(prompts, output tokens each request has before measuring starts)."""
    if which == "zipage":
        n_in, ready = args.input_len, args.zipage_kv_budget + 2 * args.zipage_buffer
    else:
        n_in, ready = round(kv_per_request(args)) - 128, 8
    spec = LoadSpec("step-profile", args.running, n_in, args.output_len, 0, "window")
    return make_prompts(spec, vocab, args.seed), ready


def output_len(which: str, args) -> int:
    return args.output_len if which == "zipage" else args.stock_output_len


async def measure(engine, which: str, args, vocab: int, trace_dir: str) -> Dict:
    prompts, ready = prompts_for(which, args, vocab)
    sp = {"max_new_tokens": output_len(which, args), "ignore_eos": True, "temperature": 0.0,
          "stream_interval": args.stream_interval}
    run = LoadRun(which, LoadSpec("step-profile", len(prompts), len(prompts[0]), sp["max_new_tokens"],
                                  0, "window"))
    run.records = [ReqRecord() for _ in prompts]
    run.t0 = time.perf_counter()
    tasks = [asyncio.create_task(stream_one(engine, run, i, ids, sp)) for i, ids in enumerate(prompts)]
    tm = engine.tokenizer_manager
    out: Dict = {"prompt_len": len(prompts[0]), "ready_after_tokens": ready}
    try:
        await probe.wait_until(lambda: min(r.tokens for r in run.records) >= ready, 600,
                               f"every request to reach {ready} output tokens")
        out["ready_s"] = round(run.now(), 1)
        load0, tok0, t0 = await probe.engine_load(engine), run.tokens, time.perf_counter()
        await asyncio.sleep(args.measure_s)
        load1, tok1, t1 = await probe.engine_load(engine), run.tokens, time.perf_counter()
        running = (load0.num_running_reqs + load1.num_running_reqs) / 2
        out.update(running=running, used_kv_tokens=[load0.num_used_tokens, load1.num_used_tokens],
                   output_tok_s=round((tok1 - tok0) / (t1 - t0), 1),
                   step_ms=round(running * (t1 - t0) * 1000 / max(1, tok1 - tok0), 3))
        state = await probe.engine_zipage_state(engine) or {}
        out["zipage_counters"] = {k: state.get(k) for k in ("compactions", "compaction_gpu_ms",
                                                            "decode_tokens") if k in state}
        log(f"{which}: {json.dumps(out)}")
        from sglang.srt.managers.io_struct import ProfileReq

        before = set(os.listdir(trace_dir))
        pid = f"{which}-{args.attention_backend or 'default'}-{int(time.time())}"
        await tm.start_profile(ProfileReq(output_dir=trace_dir, num_steps=args.profile_steps,
                                          activities=["CPU", "GPU"], with_stack=True,
                                          record_shapes=False, profile_id=pid))
        await probe.wait_until(lambda: any(f.startswith(pid) and f.endswith(".gz") and f not in before
                                           for f in os.listdir(trace_dir)), 300, "the profiler trace")
        await asyncio.sleep(5)  # the file is written in one go; let it close
        path = next(os.path.join(trace_dir, f) for f in os.listdir(trace_dir) if f.startswith(pid))
        out["trace"] = path
        out["profile"] = summarize_trace(path, args.profile_steps)
    finally:
        await abort_all(engine, tasks)
    return out


# ----------------------------------------------------------- the trace summary
def union_us(intervals: List[Tuple[float, float]]) -> float:
    total, end = 0.0, float("-inf")
    for a, b in sorted(intervals):
        if b > end:
            total += b - max(a, end)
            end = b
    return total


def outermost(events: List[Dict]) -> List[Dict]:
    """Events not inside another event of the list on the same thread."""
    keep, by_tid = [], defaultdict(list)
    for e in events:
        by_tid[(e.get("pid"), e.get("tid"))].append(e)
    for evs in by_tid.values():
        end = float("-inf")
        for e in sorted(evs, key=lambda e: (e["ts"], -e.get("dur", 0))):
            if e["ts"] >= end:
                keep.append(e)
                end = e["ts"] + e.get("dur", 0)
    return keep


OWNERS = (("zipage", re.compile(r"(^|/)sglang_zipage/")), ("sglang", re.compile(r"(^|/)sglang/")))


def owner_of(name: str):
    return next((own for own, rx in OWNERS if rx.search(name)), None)


def cpu_by_owner(py: List[Dict]) -> Dict[str, Dict[str, float]]:
    """Self time of every Python frame, charged to its nearest sglang_zipage or sglang frame
    (itself included): torch and Triton calls count for whoever made them, SGLang code that
    one of our wrappers calls counts for SGLang. {owner: {frame name: us}}."""
    out = {"zipage": defaultdict(float), "sglang": defaultdict(float)}
    by_tid = defaultdict(list)
    for e in py:
        by_tid[(e.get("pid"), e.get("tid"))].append(e)
    for evs in by_tid.values():
        stack: List[list] = []  # [end, self_us, owner, owner_frame]
        def pop():
            end, self_us, own, frame = stack.pop()
            if own:
                out[own][frame] += self_us
        for e in sorted(evs, key=lambda e: (e["ts"], -e.get("dur", 0))):
            while stack and e["ts"] >= stack[-1][0]:
                pop()
            dur = e.get("dur", 0)
            if stack:
                stack[-1][1] -= dur
            own = owner_of(e["name"])
            frame = short(e["name"])
            if own is None and stack:
                own, frame = stack[-1][2], stack[-1][3]
            stack.append([e["ts"] + dur, dur, own, frame])
        while stack:
            pop()
    return out


def group_of(name: str) -> str:
    return next((g for g, rx in GROUPS if rx.search(name)), "other")


def summarize_trace(path: str, steps: int) -> Dict:
    with gzip.open(path, "rt") as f:
        events = [e for e in json.load(f).get("traceEvents", []) if e.get("ph") == "X"]
    kernels = [e for e in events if e.get("cat") == "kernel"]
    span = (max(e["ts"] + e["dur"] for e in kernels) - min(e["ts"] for e in kernels)
            if kernels else 0.0)  # no kernels on a CPU run: only the Python side
    by_name, by_group = defaultdict(lambda: [0.0, 0]), defaultdict(float)
    for e in kernels:
        by_name[e["name"]][0] += e["dur"]
        by_name[e["name"]][1] += 1
        by_group[group_of(e["name"])] += e["dur"]
    py = [e for e in events if e.get("cat") == "python_function"]
    owned = cpu_by_owner(py)
    ours = owned["zipage"]
    sched = defaultdict(float)
    for e in outermost([e for e in py if SCHEDULER_FUNCS.search(e["name"])]):
        sched[short(e["name"])] += e["dur"]
    per_step = lambda us: round(us / steps / 1000, 3)  # noqa: E731  (ms per step)
    top = sorted(by_name.items(), key=lambda kv: -kv[1][0])[:25]
    return {
        "steps": steps, "events": len(events), "kernels": len(kernels),
        "kernel_span_ms_per_step": per_step(span),
        "gpu_busy_ms_per_step": per_step(union_us([(e["ts"], e["ts"] + e["dur"]) for e in kernels])),
        "kernel_ms_per_step": per_step(sum(by_group.values())),
        "groups_ms_per_step": {g: per_step(v) for g, v in sorted(by_group.items(), key=lambda kv: -kv[1])},
        "top_kernels": [{"name": n[:120], "ms_per_step": per_step(t), "calls_per_step": round(c / steps, 1),
                         "group": group_of(n)} for n, (t, c) in top],
        "zipage_cpu_ms_per_step": {n: per_step(v) for n, v in sorted(ours.items(), key=lambda kv: -kv[1])[:20]},
        "zipage_cpu_ms_per_step_total": per_step(sum(ours.values())),
        "sglang_cpu_ms_per_step_total": per_step(sum(owned["sglang"].values())),
        "scheduler_cpu_ms_per_step": {n: per_step(v) for n, v in sorted(sched.items(), key=lambda kv: -kv[1])},
    }


def short(name: str) -> str:
    """'/x/y/sglang_zipage/runtime.py(412): before_decode' -> 'runtime.py: before_decode'."""
    m = re.match(r"(?:.*/)?([^/]+\.py)\(\d+\): (.*)", name)
    return f"{m.group(1)}: {m.group(2)}" if m else name[:100]


# ----------------------------------------------------------------------- main
def main(argv=None) -> None:
    args = parse_args(argv)
    os.makedirs(args.trace_dir, exist_ok=True)
    model_dir = tiny_model_dir() if args.tiny else os.path.abspath(args.model)
    vocab = vocab_size(model_dir)
    res = {"benchmark": "step_profile", "command": command_line(),
           "commit": args.commit or git_commit(), "versions": versions(),
           "running": args.running, "kv_tokens_per_request": kv_per_request(args),
           "attention_backend": args.attention_backend or ("triton" if on_gpu(args.device) else "torch_native"),
           "zipage_kv_budget": args.zipage_kv_budget, "zipage_buffer": args.zipage_buffer,
           "engines": {}}
    for which in [e.strip() for e in args.engines.split(",") if e.strip()]:
        kw = engine_kwargs(args, model_dir)
        engine, entry = None, {"engine_kwargs": {k: v for k, v in kw.items() if k != "model_path"}}
        res["engines"][which] = entry
        try:
            engine, entry["engine_start_s"] = start_engine(which, kw, zipage_options(args), log)
            warm_up(engine, which, args, args.input_len, vocab)
            entry.update(engine.loop.run_until_complete(
                measure(engine, which, args, vocab, args.trace_dir)))
        except Exception as e:
            import traceback

            entry["error"] = traceback.format_exc()[-3000:]
            log(f"{which} FAILED: {e}")
        finally:
            if engine is not None:
                engine.shutdown()
            write_json(res, args.out)
    res["gpu"] = gpu_name()
    write_json(res, args.out)
    for which, e in res["engines"].items():
        p = e.get("profile") or {}
        log(f"{which}: step {e.get('step_ms')} ms, running {e.get('running')}, kernels "
            f"{p.get('kernel_ms_per_step')} ms/step {p.get('groups_ms_per_step')}, gpu busy "
            f"{p.get('gpu_busy_ms_per_step')}, zipage cpu {p.get('zipage_cpu_ms_per_step_total')}")


if __name__ == "__main__":
    main()
