#!/usr/bin/env python3
"""Does compression make reasoning loop, and does the loop guard help? The bundled SmolLM2-135M
on a CPU (issue 31).

    .venv/bin/python benchmarks/loop_guard_cpu.py --out benchmarks/results/loop-guard-cpu.json

Greedy SmolLM2 loops even with full KV, so the comparison is on sampled generations (fixed
seeds, ``sampling_seed``: the same draw for a prompt in every configuration, --temperature at
which full KV rarely loops), chat prompts asking for step-by-step reasoning, up to --tokens
tokens, stopping at the model's end of turn. Two servers on the same pool (budget 64 +
buffer 16, fixed mode): the loop guard off and on. Three configurations:
  full      zipage_kv_budget 0 on the guard-off server (never compressed)
  compress  budget 64 + 16, guard off
  guard     budget 64 + 16, guard on (doubles a looping request's budget, up to 4 times)
Per generation: tokens, whether it stopped on its own, the share of repeated 8-grams in its
last 400 tokens (repetition.repeated_share), and the first token count at which the guard's
measure (every 32 tokens over the last 400) says it loops. Per configuration: means and
counts. The JSON holds every generation, the command and the commit; nothing is asserted.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from sglang_zipage.harness.record import command_line, git_commit, write_json
from sglang_zipage.harness.server import STRICT_MEM_ENV, Server
from sglang_zipage.repetition import LoopGuard, repeated_share

BUDGET = ["--zipage-kv-budget", "64", "--zipage-buffer", "16", "--zipage-mode", "fixed"]
TOPICS = ["why the sky is blue", "how a refrigerator keeps food cold", "why leaves change colour",
          "how vaccines train the immune system", "how a bicycle stays upright",
          "why bread rises", "how tides work", "why ice floats", "how a rainbow forms",
          "how the heart pumps blood", "why metal feels cold", "how bees make honey",
          "how a compass works", "why we have seasons", "how a battery stores energy",
          "how plants drink water", "why the moon has phases", "how sound travels",
          "how a lightning bolt forms", "how clouds form"]


def chat(topic: str) -> str:
    return ("<|im_start|>user\nExplain step by step, in detail, " + topic
            + ".<|im_end|>\n<|im_start|>assistant\n")


def first_loop(ids, guard: LoopGuard):
    """The first output length at which the guard's measure says the output loops, or None."""
    for n in range(guard.window, len(ids) + 1, guard.every):
        if guard.looping(ids[:n]):
            return n
    return None


def one(server: Server, prompt: str, seed: int, args, extra: dict) -> dict:
    params = {"max_new_tokens": args.tokens, "temperature": args.temperature,
              "top_p": args.top_p, "sampling_seed": seed, **extra}
    out = server.generate(prompt, args.tokens, **{k: v for k, v in params.items()
                                                   if k != "max_new_tokens"})
    meta, ids = out["meta_info"], out["output_ids"]
    guard = LoopGuard()
    return {"seed": seed, "tokens": len(ids),
            "stopped": (meta.get("finish_reason") or {}).get("type") == "stop",
            "repeated_share_last_400": round(repeated_share(ids[-guard.window:], guard.n), 4),
            "first_loop_at": first_loop(ids, guard),
            "compactions": meta.get("zipage_compactions"),
            "loop_guard": meta.get("zipage_loop_guard"), "kv_len": meta.get("zipage_kv_len")}


def summary(gens) -> dict:
    n = len(gens)
    return {"generations": n, "looping": sum(g["first_loop_at"] is not None for g in gens),
            "stopped_on_their_own": sum(g["stopped"] for g in gens),
            "mean_tokens": round(sum(g["tokens"] for g in gens) / n, 1),
            "mean_repeated_share_last_400": round(sum(g["repeated_share_last_400"]
                                                      for g in gens) / n, 4),
            "guard_triggers": sum(g["loop_guard"] or 0 for g in gens)}


def run_config(server, prompts, args, extra) -> list:
    with ThreadPoolExecutor(args.concurrency) as ex:  # the same batches on every config
        return list(ex.map(lambda p: one(server, p[1], p[0], args, extra), enumerate(prompts)))


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True)
    p.add_argument("--prompts", type=int, default=20)
    p.add_argument("--tokens", type=int, default=1200)
    p.add_argument("--temperature", type=float, default=0.7)
    p.add_argument("--top-p", type=float, default=0.95)
    p.add_argument("--concurrency", type=int, default=10)
    p.add_argument("--pool", type=int, default=20000)
    args = p.parse_args()
    prompts = [chat(TOPICS[i % len(TOPICS)]) for i in range(args.prompts)]
    logs = Path(tempfile.mkdtemp(prefix="loop-guard-"))
    common = ["--max-total-tokens", str(args.pool), "--zipage-memory-fraction", "0.2", *BUDGET]
    res = {"command": command_line(prog="benchmarks/loop_guard_cpu.py"), "commit": git_commit(),
           "machine": f"CPU, {os.cpu_count()} cores, no GPU",
           "settings": {k: v for k, v in vars(args).items() if k != "out"}, "configs": {}}
    t0 = time.perf_counter()
    for name, flags, extra in (("full", ["--zipage-no-loop-guard"], {"zipage_kv_budget": 0}),
                               ("compress", ["--zipage-no-loop-guard"], {}),
                               ("guard", [], {})):
        server = Server([*common, *flags], logs / f"{name}.log", env=STRICT_MEM_ENV)
        try:
            gens = run_config(server, prompts, args, extra)
        finally:
            server.stop()
        res["configs"][name] = {"summary": summary(gens), "generations": gens}
        print(name, json.dumps(res["configs"][name]["summary"]), flush=True)
    res["seconds"] = round(time.perf_counter() - t0, 1)
    write_json(res, args.out)


if __name__ == "__main__":
    main()
