#!/usr/bin/env python3
"""What compressing the prompt costs (--zipage-compress-prompt): teacher-forced fidelity with
the prompt kept whole (the default) and compressed with the output, at the same budget and at
the same memory (the budget plus the prompt's length: what a kept prompt holds).

Same texts and method as run_fidelity.py and squeeze.py (harness/fidelity: a prompt of
--prompt-len tokens, the next --cont-len decoded by teacher forcing, NLL ratio and top-1
agreement against the full-KV run, block-bootstrap intervals), in the HF reference
(hf_reference.py, Eviction.own_prompt: the suffix starts with the prompt, and a compaction
waits for a full window, as the engine's). Every row is scored over the same steps, those
after the last row's first compaction (``common``), and over the steps after its own first
compaction (``own``).

CPU (the bundled SmolLM2, fp32; about 15 minutes):
  .venv/bin/python benchmarks/fidelity/own_prompt.py --out benchmarks/results/fidelity-own-prompt-cpu.json
"""

from __future__ import annotations

import argparse
import dataclasses

from sglang_zipage.harness.fidelity.hf_reference import (add_reference_args, for_texts,
                                                         write_result)
from sglang_zipage.harness.fidelity.metrics import scores_from
from sglang_zipage.harness.fidelity.selection import Eviction


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_reference_args(p, prompt_len=256)
    return p.parse_args(argv)


def first_compaction(run) -> int:
    counts = next(iter(run.values()))["compactions_before"]
    return next(i for i, n in enumerate(counts) if n)


def main(argv=None):
    args = parse_args(argv)
    model, items, ref = for_texts(args.model, args.n_texts, args.prompt_len, args.cont_len,
                                  args.dtype, args.device, args.long_enough)
    kept = Eviction(budget=args.budget, buffer=args.buffer, window=args.window)
    rows = {"full": None, "prompt_kept": kept,
            "prompt_compressed": dataclasses.replace(kept, own_prompt=True),
            "prompt_compressed_same_memory": dataclasses.replace(
                kept, own_prompt=True, budget=args.budget + args.prompt_len)}
    runs, seconds = ref.forced_rows(items, rows, log=lambda line: print(line, flush=True))
    refs = {it.id: it.ref_ids for it in items}
    common = max(first_compaction(runs[name]) for name, ev in rows.items() if ev is not None)
    result = {}
    for name, ev in rows.items():
        if ev is None:
            continue
        run = runs[name]
        held = ev.budget + ev.buffer + (0 if ev.own_prompt else args.prompt_len)
        result[name] = {"eviction": dataclasses.asdict(ev), "most_tokens_held": held,
                        "first_compaction_step": first_compaction(run),
                        "compactions": run[items[0].id]["compactions_before"][-1],
                        **scores_from(run, runs["full"], refs, common, "common")}
        f = result[name]["common"]
        print(f"{name:30s} holds <= {held}: from step {common}: NLL ratio {f['nll_ratio']:.4f} "
              f"{f['nll_ratio_ci95']}, top-1 agreement {f['top1_agreement']:.3f}", flush=True)
    write_result(args.out, args, model, items, seconds, result, common_from_step=common)


if __name__ == "__main__":
    main()
