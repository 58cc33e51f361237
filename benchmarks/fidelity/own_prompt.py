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
import time

import torch

from sglang_zipage.harness import record
from sglang_zipage.harness.fidelity.hf_reference import HFReference
from sglang_zipage.harness.fidelity.metrics import compare, from_step
from sglang_zipage.harness.fidelity.selection import Eviction
from sglang_zipage.harness.fidelity.texts import load_items


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    a = p.add_argument
    a("--n-texts", type=int, default=4)
    a("--prompt-len", type=int, default=256)
    a("--cont-len", type=int, default=512)
    a("--budget", type=int, default=128)
    a("--buffer", type=int, default=32)
    a("--window", type=int, default=16)
    a("--device", default="cpu")
    a("--dtype", default="float32", choices=["float32", "bfloat16"])
    a("--model", default=None, help="model folder (default: the bundled SmolLM2)")
    a("--out", required=True)
    return p.parse_args(argv)


def first_compaction(run) -> int:
    counts = next(iter(run.values()))["compactions_before"]
    return next(i for i, n in enumerate(counts) if n)


def main(argv=None):
    args = parse_args(argv)
    from transformers import AutoTokenizer

    from sglang_zipage.model import bundled_model_path

    model = args.model or bundled_model_path()
    items = load_items(AutoTokenizer.from_pretrained(model), args.n_texts, args.prompt_len,
                       args.cont_len)
    ref = HFReference(model, dtype=getattr(torch, args.dtype), device=args.device)
    kept = Eviction(budget=args.budget, buffer=args.buffer, window=args.window)
    rows = {"full": None, "prompt_kept": kept,
            "prompt_compressed": dataclasses.replace(kept, own_prompt=True),
            "prompt_compressed_same_memory": dataclasses.replace(
                kept, own_prompt=True, budget=args.budget + args.prompt_len)}
    prompts = torch.tensor([it.prompt_ids for it in items])
    refs_t = torch.tensor([it.ref_ids for it in items])
    refs = {it.id: it.ref_ids for it in items}
    runs, seconds = {}, {}
    for name, ev in rows.items():
        t0 = time.time()
        out = ref.teacher_forced(prompts, refs_t, ev)
        seconds[name] = round(time.time() - t0, 1)
        runs[name] = {it.id: {"logprob": out["logprob"][i], "top1": out["top1"][i],
                              "compactions_before": out["compactions_before"]}
                      for i, it in enumerate(items)}
        print(f"{name}: {seconds[name]} s", flush=True)
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
                        "common": compare(from_step(run, common), runs["full"], refs),
                        "own": compare(run, runs["full"], refs)}
        for part in ("common", "own"):
            result[name][part].pop("per_text")
        f = result[name]["common"]
        print(f"{name:30s} holds <= {held}: from step {common}: NLL ratio {f['nll_ratio']:.4f} "
              f"{f['nll_ratio_ci95']}, top-1 agreement {f['top1_agreement']:.3f}", flush=True)
    record.write_json({
        "command": record.command_line(), "commit": record.git_commit(dirty=True),
        "versions": record.versions(), "device": record.gpu_name(args.device),
        "model": model, "texts": [it.id for it in items], "settings": vars(args),
        "implementation": "hf reference (sglang_zipage/harness/fidelity/hf_reference.py)",
        "common_from_step": common, "seconds": seconds, "rows": result}, args.out)


if __name__ == "__main__":
    main()
