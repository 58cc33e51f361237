#!/usr/bin/env python3
"""Scoring without stored queries (issue 46), in the HF reference: teacher-forced fidelity of
the calibrated scorer (query_stats.py: K centroids of each head's pre-RoPE queries, rotated
to the request's next position) beside the window scorer (the last W decode queries), the
single-mean baseline (one mean query per head at geometric offsets 1..32768, as published
scorers use) and the controls; same texts, schedule and metrics as run_fidelity.py (NLL ratio
to full KV, block-bootstrap intervals, each row's paired difference to the window scorer).

Statistics come from sglang_zipage/calibration_texts.json (disjoint from the benchmark's
texts, build_texts.py), in chunks of --chunk tokens, over --domains. A row is
SCORER[K][+EXTRA...]: window, mean, calibratedK, random, recent; extras decay (0.8),
pooling (5), redundancy (full).

  .venv/bin/python benchmarks/fidelity/calibrated.py --out benchmarks/results/fidelity-calibrated-cpu.json
  (the bundled SmolLM2, 4 texts x 512 tokens at 25%, budget 128 + 32: about 12 minutes on
  2 cores); --domains code: the domain check.
"""

from __future__ import annotations

import argparse
import dataclasses
import re

from sglang_zipage.calibrate import chunks
from sglang_zipage.harness.fidelity.hf_reference import (add_reference_args, for_texts,
                                                         write_result)
from sglang_zipage.harness.fidelity.metrics import compare, paired_ratio_difference
from sglang_zipage.harness.fidelity.selection import Eviction

ROWS = ("window,window+decay+pooling,mean,calibrated16,calibrated64,calibrated128,"
        "calibrated64+decay+pooling,random,recent")


EXTRAS = {"decay": dict(decay=0.8), "pooling": dict(pooling=5),
          "redundancy": dict(redundancy="full")}


def eviction(name: str, base: Eviction):
    """(Eviction, centroids K or 0) of a row name: SCORER[K] then +EXTRA for each extra."""
    m = re.fullmatch(r"(window|mean|calibrated|random|recent)(\d*)((?:\+\w+)*)", name)
    extras = m.group(3).split("+")[1:] if m else []
    if not m or any(e not in EXTRAS for e in extras):
        raise SystemExit(f"unknown row {name!r}")
    scorer, k = m.group(1), m.group(2)
    ev = base
    if scorer in ("random", "recent"):
        ev = dataclasses.replace(ev, policy=scorer)
    elif scorer != "window":
        ev = dataclasses.replace(ev, scorer=scorer)
    for e in extras:
        ev = dataclasses.replace(ev, **EXTRAS[e])
    return ev, int(k or 0)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_reference_args(p, prompt_len=64)
    p.add_argument("--domains", default="prose,math")
    p.add_argument("--chunk", type=int, default=1024)
    p.add_argument("--rows", default=ROWS)
    args = p.parse_args(argv)
    from transformers import AutoTokenizer

    model, items, ref = for_texts(args.model, args.n_texts, args.prompt_len, args.cont_len,
                                  args.dtype, args.device, args.long_enough)
    tok = AutoTokenizer.from_pretrained(model)
    acc = ref.calibrate(chunks(lambda t: tok(t, add_special_tokens=False)["input_ids"],
                               args.domains.split(","), args.chunk))
    base = Eviction(budget=args.budget, buffer=args.buffer, window=args.window, decay=0,
                    pooling=1)
    rows = {name: eviction(name, base) for name in args.rows.split(",")}
    runs, seconds = ref.forced_rows(items, {"full": None}, log=print)
    for name, (ev, k) in rows.items():
        ref.query_stats = acc.stats(max(k, 1))
        more, secs = ref.forced_rows(items, {name: ev}, log=lambda line: print(line, flush=True))
        runs.update(more)
        seconds.update(secs)
    refs = {it.id: it.ref_ids for it in items}
    result = {}
    for name, (ev, k) in rows.items():
        r = result[name] = {"eviction": dataclasses.asdict(ev), "centroids": k,
                            **compare(runs[name], runs["full"], refs)}
        if name != "window" and "window" in runs:
            r["minus_window"] = paired_ratio_difference(runs[name], runs["full"],
                                                        runs["window"], runs["full"], refs)
        print(f"{name:28s} NLL ratio {r['nll_ratio']:.4f} {r['nll_ratio_ci95']}, top-1 "
              f"{r['top1_agreement']:.3f}" + (f", minus window {r['minus_window']}"
                                              if "minus_window" in r else ""), flush=True)
    write_result(args.out, args, model, items, seconds, result,
                 calibration={"domains": args.domains, "chunk": args.chunk,
                              "tokens": acc.counts[0]})


if __name__ == "__main__":
    main()
