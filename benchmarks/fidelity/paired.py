#!/usr/bin/env python3
"""Each variant's paired difference to a baseline variant in a fidelity run (run_fidelity.py):
the pooled NLL ratio of the variant minus the baseline's, on the same texts and scored steps,
with a paired block bootstrap (metrics.paired_ratio_difference), per implementation and budget.
Reads the summary and its raw file, writes the summary back with ``minus_<baseline>`` in each
row and the command under ``paired_command``.

  PYTHONPATH=$PWD .venv/bin/python benchmarks/fidelity/paired.py SUMMARY.json RAW.json.gz \\
      [--baseline window]     (the bundled model's tokenizer rebuilds the texts: seconds)
"""

from __future__ import annotations

import argparse
import gzip
import json

from sglang_zipage.harness.fidelity import metrics
from sglang_zipage.harness.record import command_line


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("summary")
    ap.add_argument("raw")
    ap.add_argument("--baseline", default="window")
    args = ap.parse_args()
    from transformers import AutoTokenizer

    from sglang_zipage.harness.fidelity.texts import load_items
    from sglang_zipage.model import bundled_model_path

    summary = json.load(open(args.summary))
    opener = gzip.open if args.raw.endswith(".gz") else open
    raw = json.load(opener(args.raw, "rt"))
    cfg = summary["config"]
    items = load_items(AutoTokenizer.from_pretrained(bundled_model_path()), cfg["n_texts"],
                       cfg["prompt_len"], cfg["cont_len"])
    refs = {it.id: it.ref_ids for it in items}
    key = f"minus_{args.baseline}"
    for row in summary["results"]:
        runs = raw[row["impl"]]
        frac = row["budget_frac"]
        base = runs.get(f"b{frac:g}-{args.baseline}")
        if row["variant"] == args.baseline or base is None:
            continue
        row[key] = metrics.paired_ratio_difference(
            runs[f"b{frac:g}-{row['variant']}"], runs["full"], base, runs["full"], refs)
        print(row["impl"], frac, row["variant"], key, round(row[key]["diff"], 4),
              [round(x, 4) for x in row[key]["ci95"]])
    summary["paired_command"] = command_line()
    json.dump(summary, open(args.summary, "w"), indent=1)


if __name__ == "__main__":
    main()
