#!/usr/bin/env python3
"""Elastic budget on the bundled SmolLM2-135M, on a CPU (issue 17's CPU check).

    .venv/bin/python benchmarks/elastic_cpu.py --out benchmarks/results/elastic-cpu.json

Two servers on the bundled model with the same KV pool (--max-total-tokens, page 1, strict
memory checker): zipage ``--zipage-mode elastic`` with budget 64 + buffer 16, and stock
(``--zipage-disable``). Greedy decoding, ignore_eos, token-id prompts:
  alone  one request of --tokens tokens on each server, nothing else running (the same batch
         composition on both): elastic compacts 0 times, keeps prompt + output in its KV,
         and its tokens equal stock's
  crowd  the same request plus --neighbours requests of --neighbour-tokens tokens, one
         /generate call (admitted together) on the elastic server, more than the pool holds
         at full length: every request completes, nobody is retracted, every compaction is
         made under pressure, the long request is among those compressed, and once the
         neighbours finished it holds more than its budget again (the pool left pressure)
The JSON holds the facts, the command and the commit. Timing is reported, never asserted.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

from sglang_zipage.harness.record import command_line, git_commit
from sglang_zipage.harness.server import STRICT_MEM_ENV, Server

BUDGET, BUFFER = 64, 16  # the elastic server's --zipage-kv-budget / --zipage-buffer
META = ("prompt_tokens", "completion_tokens", "num_retractions", "zipage_compactions",
        "zipage_pressure_compactions", "zipage_kv_len")


def params(tokens: int) -> dict:
    return {"max_new_tokens": tokens, "temperature": 0, "ignore_eos": True}


def facts(out: dict) -> dict:
    return {k: out["meta_info"].get(k) for k in META}


def run(args) -> dict:
    logs = Path(tempfile.mkdtemp(prefix="elastic-cpu-"))
    common = ["--max-total-tokens", str(args.pool), "--enable-tokenizer-batch-encode"]
    prompt = list(range(1000, 1000 + args.prompt_tokens))
    neighbours = [list(range(2000 + 40 * i, 2000 + 40 * i + args.prompt_tokens))
                  for i in range(args.neighbours)]
    res = {"command": command_line(prog="benchmarks/elastic_cpu.py"),
           "commit": git_commit(), "machine": f"CPU, {os.cpu_count()} cores, no GPU",
           "settings": {k: v for k, v in vars(args).items() if k != "out"}}
    t0 = time.perf_counter()
    stock = Server([*common, "--zipage-disable"], logs / "stock.log", env=STRICT_MEM_ENV)
    try:
        (out,) = stock.generate_ids([prompt], [params(args.tokens)])
        stock_ids = out["output_ids"]
        res["stock_alone"] = facts(out)
    finally:
        stock.stop()
    # a pool of a few thousand tokens needs a larger share for a window slot per request
    # (memory.py; as the CPU tests' pools)
    elastic = Server([*common, "--zipage-mode", "elastic", "--zipage-kv-budget", str(BUDGET),
                      "--zipage-buffer", str(BUFFER), "--zipage-memory-fraction", "0.5"],
                     logs / "elastic.log", env=STRICT_MEM_ENV)
    try:
        (out,) = elastic.generate_ids([prompt], [params(args.tokens)])
        alone = facts(out)
        alone["tokens_equal_stock"] = out["output_ids"] == stock_ids
        alone["first_difference"] = next((i for i, (a, b) in enumerate(zip(out["output_ids"], stock_ids))
                                          if a != b), None)
        res["elastic_alone"] = alone
        elastic.idle_and_flushed()
        t = time.perf_counter()
        outs = elastic.generate_ids([prompt, *neighbours],
                                    [params(args.tokens)] + [params(args.neighbour_tokens)] * args.neighbours)
        crowd = [facts(o) for o in outs]
        state = elastic.zipage_state()
        res["elastic_crowd"] = {
            "full_length_tokens": sum(c["prompt_tokens"] + c["completion_tokens"] for c in crowd),
            "pool_tokens": args.pool, "requests": crowd, "wall_s": round(time.perf_counter() - t, 1),
            "all_complete": all(c["completion_tokens"] == n for c, n in
                                zip(crowd, [args.tokens] + [args.neighbour_tokens] * args.neighbours)),
            "retractions": sum(c["num_retractions"] for c in crowd),
            "compressed_requests": sum(c["zipage_compactions"] > 0 for c in crowd),
            "all_compactions_on_demand": all(c["zipage_compactions"] == c["zipage_pressure_compactions"]
                                             for c in crowd),
            "server_compactions": state["compactions"],
            "server_pressure_compactions": state["pressure_compactions"],
            "max_suffix_tokens": state["max_suffix_tokens"],
            "pressure_episodes": state["pressure_episodes"],
            "pressure_at_the_end": state["elastic_pressure"],
            # once the neighbours finished the pool left pressure: full KV again
            "long_request_grew_back": crowd[0]["zipage_kv_len"] > args.prompt_tokens + BUDGET + BUFFER}
        res["healthy"] = "Traceback" not in elastic.log()
    finally:
        elastic.stop()
    res["total_s"] = round(time.perf_counter() - t0, 1)
    ok = (res["elastic_alone"]["zipage_compactions"] == 0 and res["elastic_alone"]["tokens_equal_stock"]
          and res["elastic_crowd"]["all_complete"] and res["elastic_crowd"]["retractions"] == 0
          and res["elastic_crowd"]["all_compactions_on_demand"]
          and res["elastic_crowd"]["requests"][0]["zipage_compactions"] > 0
          and res["elastic_crowd"]["long_request_grew_back"] and res["healthy"])
    res["verdict"] = "pass" if ok else "fail"
    return res


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tokens", type=int, default=2000)
    p.add_argument("--prompt-tokens", type=int, default=32)
    p.add_argument("--pool", type=int, default=2304, help="KV pool: holds the request alone")
    p.add_argument("--neighbours", type=int, default=6)
    p.add_argument("--neighbour-tokens", type=int, default=700)
    p.add_argument("--out", required=True)
    args = p.parse_args()
    res = run(args)
    Path(args.out).write_text(json.dumps(res, indent=1))
    print(json.dumps({k: res[k] for k in ("verdict", "elastic_alone", "total_s")}))
    return 0 if res["verdict"] == "pass" else 1


if __name__ == "__main__":
    sys.exit(main())
