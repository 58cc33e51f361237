#!/usr/bin/env python3
"""The README's sizing arithmetic ("Sizing the budget"), as numbers: the tokens a running
request holds on average in a long run, for stock and for zipage (prompt kept whole or
compressed, at the budget or squeezed to a floor), and the running-request ratios they give
in one pool. Arithmetic over ints, not a measurement.

Outputs are uniform over [L/2, L] (bench_serving --random-range-ratio 0.5); a request counts
in proportion to how long it runs (each output token is one decode step). Stock holds prompt +
output so far. Zipage under pressure: its suffix (the output, plus the prompt when compressed)
grows to budget + buffer, then cycles between budget and budget + buffer (mean budget +
buffer / 2); a kept prompt stays beside it.

  python3 benchmarks/sizing_arithmetic.py --out benchmarks/results/sizing-arithmetic.json
"""

from __future__ import annotations

import argparse
import json
import sys


def mean_held(prompt: int, lengths, held) -> float:
    """Step-weighted mean of held(t) over every request's steps t < length."""
    total = steps = 0
    for n in lengths:
        total += sum(held(t) for t in range(n))
        steps += n
    return total / steps


def zipage_held(prompt: int, budget: int, buffer: int, own_prompt: bool):
    limit = budget + buffer

    def held(t: int) -> float:
        suffix = t + (prompt if own_prompt else 0)
        mean = budget + buffer / 2 if suffix >= limit else suffix  # cycling once reached
        return mean + (0 if own_prompt else prompt)
    return held


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--prompt", type=int, default=512)
    p.add_argument("--budget", type=int, default=2048)
    p.add_argument("--buffer", type=int, default=256)
    p.add_argument("--floor", type=int, default=1024)
    p.add_argument("--output-lens", default="8192,16384")
    p.add_argument("--step", type=int, default=64, help="output lengths sampled every STEP")
    p.add_argument("--out", default=None)
    args = p.parse_args(argv)
    rows = {}
    for top in map(int, args.output_lens.split(",")):
        lengths = range(top // 2, top + 1, args.step)
        stock = mean_held(args.prompt, lengths, lambda t: args.prompt + t)
        row = {"stock_tokens": round(stock)}
        for name, budget, own in (("kept", args.budget, False), ("compressed", args.budget, True),
                                  ("kept_floor", args.floor, False),
                                  ("compressed_floor", args.floor, True)):
            z = mean_held(args.prompt, lengths, zipage_held(args.prompt, budget, args.buffer, own))
            row[name] = {"tokens": round(z), "running_vs_stock": round(stock / z, 2)}
        row["compressed_vs_kept_running"] = round(row["kept"]["tokens"]
                                                  / row["compressed"]["tokens"], 2)
        rows[str(top)] = row
    res = {"command": "python3 " + " ".join(sys.argv), "settings": vars(args), "rows": rows}
    text = json.dumps(res, indent=1)
    print(text)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text + "\n")


if __name__ == "__main__":
    main()
