#!/usr/bin/env python3
"""What the budget range's squeeze costs (issue 30): teacher-forced fidelity at a budget B,
at its floor F, and at B squeezed to F at output step X, as the engine squeezes a running
request under overload (budget.py A3: compacted to its floor, which stays its budget).

Same texts and method as run_fidelity.py (harness/fidelity: a prompt of --prompt-len tokens,
the next --cont-len tokens decoded by teacher forcing, NLL ratio and top-1 agreement against
the full-KV run of the same implementation, block-bootstrap intervals), in the HF reference
(hf_reference.py, the engine's schedule step for step; the engine's squeeze is a compaction
with its floor as the kept count, scored as any). Scoring: decay 0.8 + pooling 5, with the
window scorer or (--scorer calibrated) the model's query statistics. Every row is scored over the same steps, those from X on
(``from_squeeze``), and over the steps after its own first compaction (``own``).

CPU (the bundled SmolLM2, the fidelity CPU preset's texts and lengths; about 15 minutes):
  .venv/bin/python benchmarks/fidelity/squeeze.py --budget 128 --floor 64 --squeeze-at 256 \\
      --out benchmarks/results/fidelity-squeeze-cpu.json
  (... --scorer calibrated --out benchmarks/results/fidelity-squeeze-calibrated-cpu.json)
At the default budget (2048 + 256, squeezed to 1024 at step 2560, after the first
compaction): the 5 of fidelity.json's 12 texts with at least 64 + 3600 tokens, on the CPU
(about 42 minutes on 2 cores; glibc's default mmap threshold lets the growing float32
activations fragment the heap past 24 GiB, so large blocks go to mmap, ~2 GiB resident):
  MALLOC_MMAP_THRESHOLD_=1048576 .venv/bin/python benchmarks/fidelity/squeeze.py \\
      --n-texts 12 --long-enough --cont-len 3600 --budget 2048 --floor 1024 --buffer 256 \\
      --squeeze-at 2560 --out benchmarks/results/fidelity-squeeze-2048-cpu.json
GPU (a realistic budget needs outputs of several thousand tokens; fidelity.json's texts):
  python benchmarks/fidelity/squeeze.py --device cuda --dtype bfloat16 --cont-len 4096 \\
      --budget 2048 --floor 1024 --squeeze-at 2560 --buffer 256 --n-texts 12 --out ...
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
    add_reference_args(p, prompt_len=64, scorer=True)
    p.add_argument("--floor", type=int, default=64)
    p.add_argument("--squeeze-at", type=int, default=None,
                   help="output step of the squeeze (default: half)")
    args = p.parse_args(argv)
    args.squeeze_at = args.squeeze_at or args.cont_len // 2
    if not args.budget + args.buffer < args.squeeze_at < args.cont_len:
        p.error("--squeeze-at must come after the first compaction at the budget and before "
                "the end of the continuation")
    return args


def main(argv=None):
    args = parse_args(argv)
    model, items, ref = for_texts(args.model, args.n_texts, args.prompt_len, args.cont_len,
                                  args.dtype, args.device, args.long_enough, args.scorer)
    base = Eviction(budget=args.budget, buffer=args.buffer, window=args.window,
                    scorer=args.scorer)
    rows = {"full": None, "budget": base,
            "floor": dataclasses.replace(base, budget=args.floor),
            "squeezed": dataclasses.replace(base, squeeze_to=args.floor,
                                            squeeze_at=args.squeeze_at)}
    runs, seconds = ref.forced_rows(items, rows, log=lambda line: print(line, flush=True))
    refs = {it.id: it.ref_ids for it in items}
    result = {}
    for name, ev in rows.items():
        if ev is None:
            continue
        run = runs[name]
        result[name] = {"eviction": dataclasses.asdict(ev),
                        "compactions": run[items[0].id]["compactions_before"][-1],
                        **scores_from(run, runs["full"], refs, args.squeeze_at, "from_squeeze")}
        f = result[name]["from_squeeze"]
        print(f"{name:9s} from step {args.squeeze_at}: NLL ratio {f['nll_ratio']:.4f} "
              f"{f['nll_ratio_ci95']}, top-1 agreement {f['top1_agreement']:.3f}", flush=True)
    write_result(args.out, args, model, items, seconds, result)


if __name__ == "__main__":
    main()
