#!/usr/bin/env python3
"""A PD pair on one GPU with compression on the decode server (issue 47).

Per model (dummy weights of a public shape, ``--layers`` layers, token ids): a prefill server
(zipage's launcher: compression inactive, a prefill server decodes nothing) and a decode
server that compresses (fixed mode ``--budget`` + ``--buffer``, its prefix tree on), each
with its own KV pool of ``--pool`` tokens on the same GPU, the prompt's KV sent by mooncake's
CUDA transfer engine, SGLang's Python mini load balancer (``sglang_router.launch_router
--mini-lb``) in front, SGLang's strict memory checks on both servers. Through the balancer:

1. ``--long`` requests at once, ``--long-out`` tokens each: they compress on the decode
   server (compactions, the most KV a request held against prompt + budget + buffer);
2. a two-turn conversation: turn 2 (turn 1's prompt, its answer, a new question) finds turn
   1's prompt in the decode server's tree (cached_tokens), its compressed answer not;
3. a long request aborted on the decode server while it compresses; then both servers idle
   with every slot free (the strict checker fails a leaked one), no traceback in their logs.

The JSON records each step's per-request meta_info, the decode server's zipage state and
pools, and a verdict per check.

    source benchmarks/device_env.sh && source benchmarks/pd_bundle.sh install && \\
      python3 benchmarks/pd_check.py --out $OUT/pd-check.json \\
        --rows qwen3-8b-dummy:flashinfer,deepseek-v3:triton

``--speculative NEXTN`` runs both servers with DeepSeek's MTP drafts (``--rows
deepseek-v3:triton``), the decode server without its tree (SGLang refuses it beside speculative
decoding), so without the second-turn check (passed on an H100: pd-check-spec-h100.json).
``--decode-flags "--enable-hierarchical-cache --hicache-ratio 2"`` tries HiCache on the decode
server (pd-check-hicache-h100.json).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import requests

from sglang_zipage.harness.engines import (MODELS, model_config, shape_override, vocab_size,
                                           write_config)
from sglang_zipage.harness.probe import loads
from sglang_zipage.harness.record import command_line, git_commit, gpu_name, write_json
from sglang_zipage.harness.server import (PD_ENV, PD_TRANSFER, STRICT_MEM_ENV, Server, free_port,
                                          mini_balancer, stop_process)


def generate(url, ids, max_new_tokens, **body):
    r = requests.post(url + "/generate", timeout=1800, json={
        "input_ids": ids, **body, "sampling_params": {
            "max_new_tokens": max_new_tokens, "temperature": 0, "ignore_eos": True}})
    r.raise_for_status()
    return r.json()


def meta(out):
    m = out["meta_info"]
    return {k: m.get(k) for k in ("prompt_tokens", "completion_tokens", "cached_tokens",
                                  "zipage_compactions", "zipage_kv_len", "finish_reason")}


def healthy(server: Server) -> dict:
    log = server.log()
    return {"health": requests.get(server.url + "/health", timeout=30).status_code,
            "traceback": log[log.index("Traceback"):][:2000] if "Traceback" in log else None}


ENV = {**STRICT_MEM_ENV, **PD_ENV}


def one_row(model: str, backend: str, args, work: Path) -> dict:
    path = os.path.join(MODELS, model)
    rng = random.Random(0)
    hi = min(vocab_size(path), 30000)

    def ids(n):
        return [rng.randrange(100, hi) for _ in range(n)]

    shape = ["--json-model-override-args", json.dumps(shape_override(path, args.layers))]
    spec = []
    if args.speculative:
        # both servers draft (the prefill server sends the first draft's inputs with the KV);
        # the draft reads the target's folder, and SGLang would apply the override to the
        # draft's config as well: the changed config is written into a folder of its own
        path = write_config({**model_config(os.path.join(MODELS, model)),
                             **shape_override(os.path.join(MODELS, model), args.layers)},
                            str(work / "model"))
        shape = []
        # speculative decoding runs the calibrated scorer: the written model's statistics,
        # measured as a user would (into the model's folder, found there by default)
        subprocess.run([sys.executable, "-m", "sglang_zipage.calibrate", "--model-path", path,
                        "--load-format", "dummy", "--attention-backend", backend,
                        "--sampling-backend", "pytorch", "--grammar-backend", "none"],
                       check=True, cwd=tempfile.gettempdir(),
                       stdout=open(work / "calibrate.log", "w"), stderr=subprocess.STDOUT)
        spec = ["--speculative-algorithm", args.speculative, "--speculative-num-steps", "3",
                "--speculative-eagle-topk", "1", "--speculative-num-draft-tokens", "4"]
    common = ["--model-path", path, "--load-format", "dummy", "--skip-tokenizer-init", *shape,
              *spec,
              "--attention-backend", backend, "--sampling-backend", "pytorch",
              "--grammar-backend", "none", "--max-total-tokens", str(args.pool),
              "--mem-fraction-static", str(args.mem_fraction), "--random-seed", "0",
              *PD_TRANSFER]
    bootstrap = free_port()
    starts = {
        "prefill": lambda: Server([*common, "--disaggregation-mode", "prefill",
                                   "--disaggregation-bootstrap-port", str(bootstrap)],
                                  work / "prefill.log", env=ENV),
        "decode": lambda: Server([*common, "--disaggregation-mode", "decode",
                                  # (SGLang refuses the decode side's tree beside
                                  # speculative decoding)
                                  *([] if spec else
                                    ["--disaggregation-decode-enable-radix-cache"]),
                                  # (dummy weights: no statistics of their own but those
                                  # calibrated for speculative decoding; the CPU pair,
                                  # test_pd_pair.py, runs the calibrated scorer)
                                  "--zipage-scorer", "calibrated" if spec else "window",
                                  # (greedy dummy weights repeat a 2-token cycle, on
                                  # which the loop guard raises a budget by design)
                                  "--zipage-no-loop-guard",
                                  "--zipage-mode", "fixed", "--zipage-kv-budget",
                                  str(args.budget), "--zipage-buffer", str(args.buffer),
                                  *args.decode_flags.split()],
                                 work / "decode.log", env=ENV)}
    row = {"model": model, "attention_backend": backend, "speculative": args.speculative or None,
           "decode_flags": args.decode_flags or None, "checks": {}}
    t0 = time.monotonic()
    # one after the other: a server sizes itself from the memory free when it starts
    prefill = starts["prefill"]()
    try:
        decode = starts["decode"]()
    except Exception:
        prefill.stop(grace=10)
        raise
    row["start_s"] = round(time.monotonic() - t0, 1)
    proc, url = mini_balancer(prefill.url, bootstrap, decode.url, work / "balancer.log")
    try:
        state = decode.zipage_state()
        limit = state["budget_limit_tokens"]
        row["decode_zipage"] = {k: state.get(k) for k in (
            "layout", "budget_limit_tokens", "memory_bytes", "memory", "window_slots")}
        # 1. long outputs compress on the decode server
        prompts = [ids(args.prompt) for _ in range(args.long)]
        with ThreadPoolExecutor(args.long) as ex:
            long = [meta(o) for o in ex.map(lambda p: generate(url, p, args.long_out), prompts)]
        row["long"] = long
        row["checks"]["long_outputs_compress_within_the_limit"] = all(
            m["completion_tokens"] == args.long_out and (m["zipage_compactions"] or 0) > 0
            and m["zipage_kv_len"] <= m["prompt_tokens"] + limit for m in long)
        # 2. a second turn finds the first prompt in the decode server's tree (not with
        # speculative decoding, where SGLang keeps no tree on the decode side)
        first = ids(args.prompt)
        one = generate(url, first, args.turn_out)
        two = generate(url, first + one["output_ids"] + ids(32), args.turn_out)
        row["conversation"] = [meta(one), meta(two)]
        if not spec:
            row["checks"]["second_turn_hits_the_decode_servers_tree"] = (
                meta(two)["cached_tokens"] >= len(first) - 1  # (a page-aligned match)
                and meta(two)["cached_tokens"] < len(first) + len(one["output_ids"]))
        # 3. an abort while compressing gives everything back
        rid = f"pd-check-abort-{time.monotonic_ns()}"
        answer = {}
        client = threading.Thread(target=lambda: answer.update(
            generate(url, ids(args.prompt), args.long_out, rid=rid)))
        client.start()
        deadline = time.monotonic() + 300
        while decode.zipage_state()["running_compressed_requests"] == 0:
            if time.monotonic() > deadline:
                break
            time.sleep(0.2)
        requests.post(decode.url + "/abort_request", json={"rid": rid}, timeout=60)
        client.join(timeout=600)
        row["abort"] = meta(answer) if answer else None
        decode.idle_and_flushed()
        prefill.idle_and_flushed()
        time.sleep(2)
        row["decode_used_tokens_idle"] = loads(decode.url)["num_used_tokens"]
        row["health"] = {"prefill": healthy(prefill), "decode": healthy(decode)}
        row["checks"]["abort_and_idle_leak_nothing"] = bool(
            answer and answer["meta_info"]["finish_reason"]["type"] == "abort"
            and row["decode_used_tokens_idle"] == 0
            and all(h["health"] == 200 and not h["traceback"] for h in row["health"].values()))
        end = decode.zipage_state()
        row["decode_zipage_end"] = {k: end.get(k) for k in (
            "compactions", "windowless_compactions", "most_running_requests")}
    finally:
        stop_process(proc)
        for s in (prefill, decode):
            s.stop(grace=10)
    row["status"] = "pass" if all(row["checks"].values()) else "fail"
    return row


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--rows", default="qwen3-8b-dummy:flashinfer,deepseek-v3:triton",
                    help="MODEL:BACKEND,... (folders under benchmarks/models)")
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--pool", type=int, default=65536, help="each server's KV pool (tokens)")
    ap.add_argument("--mem-fraction", type=float, default=0.4)
    ap.add_argument("--budget", type=int, default=512)
    ap.add_argument("--buffer", type=int, default=64)
    ap.add_argument("--prompt", type=int, default=300)
    ap.add_argument("--long", type=int, default=8)
    ap.add_argument("--long-out", type=int, default=2000)
    ap.add_argument("--turn-out", type=int, default=800)
    ap.add_argument("--decode-flags", default="",
                    help="more flags for the decode server (e.g. '--enable-hierarchical-cache')")
    ap.add_argument("--speculative", default="",
                    help="a draft-free algorithm on both servers (NEXTN on deepseek-v3: its MTP "
                         "layer), 3 steps, 4 draft tokens")
    args = ap.parse_args()
    doc = {"benchmark": "pd_check", "command": command_line(), "commit": git_commit(dirty=True),
           "gpu": gpu_name(), "settings": {k: v for k, v in vars(args).items() if k != "out"},
           "mc_force_tcp": ENV["MC_FORCE_TCP"],
           "rows": []}
    for item in args.rows.split(","):
        model, backend = item.split(":")
        work = Path(tempfile.mkdtemp(prefix=f"pd-{model}-"))
        try:
            row = one_row(model, backend, args, work)
        except Exception as e:  # noqa: BLE001 - recorded, the next row still runs
            row = {"model": model, "attention_backend": backend, "status": "error",
                   "error": repr(e)[-3000:]}
        row["logs"] = {p.name: p.read_text(errors="replace")[-4000:] for p in work.glob("*.log")}
        doc["rows"].append(row)
        print(json.dumps({k: row.get(k) for k in ("model", "status", "checks", "start_s")}),
              flush=True)
        write_json(doc, args.out)


if __name__ == "__main__":
    main()
