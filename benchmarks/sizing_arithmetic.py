#!/usr/bin/env python3
"""The sizing arithmetic of docs/results.md ("Reading the rows"), as numbers: the tokens a running
request holds on average in a long run, for stock and for zipage (prompt kept whole or
compressed, at the budget or squeezed to a floor), and the running-request ratios they give
in one pool. Arithmetic, not a measurement (sglang_zipage/harness/sizing.py says how a
request's holding is counted), over prompts uniform in [P/2, P] and outputs uniform in [L/2, L]
(bench_serving --random-range-ratio 0.5 spreads both).

A larger batch makes a step longer: a line through the long-run rows of --measured
(steady state, both engines, pool full: step = a + b x running requests, least squares) turns
the running requests of each row into output tokens/s, as a ratio to stock's measured row at
8k, and at other lengths to stock's running requests by the same arithmetic.

  .venv/bin/python benchmarks/sizing_arithmetic.py --out benchmarks/results/sizing-arithmetic.json
"""

from __future__ import annotations

import argparse
import json
import sys

from sglang_zipage.harness.sizing import long_run_tokens, output_lengths, stock_held, zipage_held


def step_line(points):
    """Least squares step = a + b x n through (n, step) points: (a, b, largest residual)."""
    m = len(points)
    sn, ss = sum(n for n, _ in points), sum(t for _, t in points)
    snn, sns = sum(n * n for n, _ in points), sum(n * t for n, t in points)
    b = (m * sns - sn * ss) / (m * snn - sn * sn)
    a = (ss - b * sn) / m
    return a, b, max(abs(a + b * n - t) for n, t in points)


def measured_steps(path: str, load: str):
    """(running, step ms) of stock's and every zipage run in the long-run rows of ``load``,
    and stock's (running, step)."""
    rows = [r for r in json.load(open(path))["loads"]
            if r.get("span") == "long-run" and r["load"] == load]
    stock = {(r["stock"]["mean_running_reqs"], r["stock"]["server_tpot_ms"]) for r in rows}
    zipage = [(r["zipage"]["mean_running_reqs"], r["zipage"]["server_tpot_ms"]) for r in rows]
    return sorted(stock) + zipage, sorted(stock)[0], [r["source"].split()[0] for r in rows]


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--prompt", type=int, default=512, help="bench_serving --random-input-len")
    p.add_argument("--budget", type=int, default=2048)
    p.add_argument("--buffer", type=int, default=256)
    p.add_argument("--floor", type=int, default=1024)
    p.add_argument("--output-lens", default="8192,16384")
    p.add_argument("--measured", default="benchmarks/results/throughput-h200.json")
    p.add_argument("--measured-load", default="poisson:rate=8:output_len=8192:range_ratio=0.5")
    p.add_argument("--pool", type=int, default=733396, help="zipage's pool (the 8k rows')")
    p.add_argument("--pool-use", type=float, default=0.95, help="(measured at the defaults: 0.96)")
    p.add_argument("--stock-pool", type=int, default=749782)
    p.add_argument("--stock-pool-use", type=float, default=0.92, help="(measured at 8k: 0.92)")
    p.add_argument("--out", default=None)
    args = p.parse_args(argv)
    points, (stock_n, stock_step), sources = measured_steps(args.measured, args.measured_load)
    a, b, worst = step_line(points)
    stock_rate = stock_n / stock_step

    def predicted(tokens: float, stock_rate: float, against: str) -> dict:
        n = args.pool * args.pool_use / tokens
        return {"running": round(n), "step_ms": round(a + b * n, 1),
                "tok_s_vs_stock": round(n / (a + b * n) / stock_rate, 2), "against": against}
    rows = {}
    for top in map(int, args.output_lens.split(",")):
        lengths, prompts = output_lengths(top, 0.5), output_lengths(args.prompt, 0.5)
        stock = long_run_tokens(prompts, lengths, stock_held)
        row = {"stock_tokens": round(stock)}
        against = "stock's measured long-run row"
        if top == 8192:  # the measured load's length
            rate = stock_rate
        else:  # stock at the same arithmetic and its pool use at 8k
            n_stock = args.stock_pool * args.stock_pool_use / stock
            rate, against = n_stock / (a + b * n_stock), f"stock by the same arithmetic: {n_stock:.0f} running"
        for name, budget, own in (("kept", args.budget, False), ("compressed", args.budget, True),
                                  ("kept_floor", args.floor, False),
                                  ("compressed_floor", args.floor, True)):
            z = long_run_tokens(prompts, lengths,
                                lambda prompt: zipage_held(prompt, budget, args.buffer, own))
            row[name] = {"tokens": round(z), "running_vs_stock": round(stock / z, 2)}
            row[name]["predicted"] = predicted(z, rate, against)
        row["compressed_vs_kept_running"] = round(row["kept"]["tokens"]
                                                  / row["compressed"]["tokens"], 2)
        rows[str(top)] = row
    step = {"from": sources, "points_running_step_ms": points, "a_ms": round(a, 2),
            "b_ms_per_request": round(b, 4), "largest_residual_ms": round(worst, 2),
            "stock": {"running": stock_n, "step_ms": stock_step},
            "running_for_ratio": {str(x): round(x * stock_rate * a / (1 - x * stock_rate * b))
                                  for x in (1.8, 2.5)}}
    res = {"command": "python " + " ".join(sys.argv), "settings": vars(args), "rows": rows,
           "step_line": step}
    text = json.dumps(res, indent=1)
    print(text)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text + "\n")


if __name__ == "__main__":
    main()
