#!/usr/bin/env python3
"""CPU decode speed of the bundled model through sglang_zipage.Engine (no compression hit:
outputs stay under the default budget). usage: python benchmarks/cpu_decode.py --out FILE"""

import argparse
import sys
import time

from sglang_zipage.harness.record import command_line, write_json


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True)
    p.add_argument("--tokens", type=int, default=200)
    a = p.parse_args()
    from sglang_zipage import Engine

    eng = Engine(log_level="error")
    sp = {"max_new_tokens": a.tokens, "temperature": 0, "ignore_eos": True}
    prompt = "<|im_start|>user\nWrite about the sea.<|im_end|>\n<|im_start|>assistant\n"
    eng.generate(prompt, {"max_new_tokens": 8})  # warm-up
    res = {"command": command_line(prog=f"python {sys.argv[0]}"), "device": "cpu (2 cores)"}
    for n in (1, 3):
        t0 = time.perf_counter()
        outs = eng.generate([prompt] * n, sp)
        dt = time.perf_counter() - t0
        toks = sum(o["meta_info"]["completion_tokens"] for o in outs)
        res[f"requests_{n}_output_tok_s"] = round(toks / dt, 2)
    eng.shutdown()
    write_json(res, a.out)
    print(res)


if __name__ == "__main__":
    main()
