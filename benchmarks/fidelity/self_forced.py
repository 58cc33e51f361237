#!/usr/bin/env python3
"""Fidelity on the model's own output (issue 46): the window and the calibrated scorer
teacher-forced through what the model itself writes with full KV, not through human text.

The fidelity texts' openings (--prompt-len tokens) are continued greedily with full KV for
--cont-len tokens (end of text suppressed); those continuations are then teacher-forced
through the HF reference (hf_reference.py, the engine's schedule step for step) with full KV
and with each scorer at each budget (decay 0.8 and pooling 5 unless --plain). Per row: NLL
ratio and top-1 agreement against full KV with block-bootstrap intervals, and the calibrated
rows' paired difference to the window scorer at the same budget. A model's own greedy text
is what it predicts best: the ratios are larger than on human text, and they show what a
scorer loses of what the model itself relies on.

  .venv/bin/python benchmarks/fidelity/self_forced.py \\
      --out benchmarks/results/fidelity-self-forced-cpu.json   (the bundled SmolLM2, ~10 min)
"""

from __future__ import annotations

import argparse
import dataclasses

import torch

from sglang_zipage.harness.fidelity import metrics
from sglang_zipage.harness.fidelity.hf_reference import (add_reference_args, for_texts,
                                                         write_result)
from sglang_zipage.harness.fidelity.selection import Eviction


def own_continuations(ref, items, cont_len: int):
    """The items with their reference continuation replaced by the model's greedy one."""
    prompts = torch.tensor([it.prompt_ids for it in items], device=ref.device)
    with torch.no_grad():
        out = ref.model.generate(prompts, attention_mask=torch.ones_like(prompts),
                                 max_new_tokens=cont_len, min_new_tokens=cont_len,
                                 do_sample=False, pad_token_id=0)
    return [dataclasses.replace(it, ref_ids=out[i, prompts.shape[1]:].tolist())
            for i, it in enumerate(items)]


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_reference_args(p, prompt_len=64)
    p.add_argument("--budgets", default="0.125,0.25", help="fractions of --cont-len")
    p.add_argument("--plain", action="store_true", help="decay 0, pooling 1")
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    model, items, ref = for_texts(args.model, args.n_texts, args.prompt_len, args.cont_len,
                                  args.dtype, args.device, args.long_enough, "calibrated")
    items = own_continuations(ref, items, args.cont_len)
    extras = dict(decay=0.0, pooling=1) if args.plain else {}
    rows = {"full": None}
    for frac in (float(f) for f in args.budgets.split(",")):
        budget = int(frac * args.cont_len)
        for scorer in ("window", "calibrated"):
            rows[f"b{frac:g}-{scorer}"] = Eviction(budget=budget, buffer=args.buffer,
                                                   window=args.window, scorer=scorer, **extras)
    runs, seconds = ref.forced_rows(items, rows, log=lambda line: print(line, flush=True))
    refs = {it.id: it.ref_ids for it in items}
    result = {}
    for name, ev in rows.items():
        if ev is None:
            continue
        row = metrics.compare(runs[name], runs["full"], refs)
        row.pop("per_text")
        row["eviction"] = dataclasses.asdict(ev)
        if ev.scorer == "calibrated":
            window = name.replace("calibrated", "window")
            row["minus_window"] = metrics.paired_ratio_difference(
                runs[name], runs["full"], runs[window], runs["full"], refs)
        result[name] = row
        d = row.get("minus_window")
        print(f"{name:18s} NLL ratio {row['nll_ratio']:.4f} {row['nll_ratio_ci95']}, top-1 "
              f"{row['top1_agreement']:.3f}"
              + (f", minus window {d['diff']:+.4f} {d['ci95']}" if d else ""), flush=True)
    write_result(args.out, args, model, items, seconds, result,
                 continuation="the model's greedy continuation with full KV (eos suppressed)")


if __name__ == "__main__":
    main()
