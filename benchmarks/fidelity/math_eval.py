#!/usr/bin/env python3
"""Task-level check: pass@1 on math problems with boxed answers, full KV vs compressed KV.

For users with models that can solve them (the bundled 135M model mostly cannot: it only
shows that the script runs end to end). Every configuration is one ``sglang_zipage.Engine``
in its own process (zipage settings are server-wide): "full" (``zipage_enabled=False``) and
one per --budgets value (kv_budget in tokens, with --buffer/--window and the scoring
options). Each solves every problem with the same chat prompt asking for a final answer in
\\boxed{}; pass@1 = share of problems whose answer is right, averaged over --samples
samples when --temperature > 0 (greedy, one sample, by default).

Grading: the content of the last \\boxed{...} (balanced braces), normalized (spaces, $,
\\text{}, \\left/\\right, \\dfrac -> \\frac, a trailing period); equal to the reference as
numbers when both parse (integers, decimals, a/b, \\frac{a}{b}), else as strings. No boxed
answer counts as wrong (``--lenient``: fall back to the last number in the output);
``pass_at_1_lenient`` (last number when no box) is reported either way, for small models
that do not box their answers.

Problems: --problems FILE.jsonl with one {"problem": ..., "answer": ...} per line (also
accepted: "question" for the problem), default the 85 CHAMP problems whose answer is a
number (texts/champ_numeric.jsonl, MIT licence, see TEXTS.md).

  Bundled model, a handful of problems (CPU, about 5 minutes):
    .venv/bin/python benchmarks/fidelity/math_eval.py --n 4 --max-new-tokens 384 \
        --budgets 128 --buffer 32 --out benchmarks/results/fidelity_math_eval.json
  A larger model on a GPU (e.g. AIME/AMC-style problems in a JSONL file):
    python benchmarks/fidelity/math_eval.py --model-path Qwen/Qwen3-8B --problems amc.jsonl \
        --max-new-tokens 16384 --budgets 2048,4096 --buffer 256 --temperature 0.6 --samples 4
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
from fractions import Fraction
from typing import Dict, List, Optional

from sglang_zipage.harness.engines import parse_engine_args
from sglang_zipage.harness.record import REPO, git_commit, gpu_name, versions

VERSION_MODULES = ("sglang", "torch", "transformers", "triton", "sglang_zipage")

PROMPT = ("Solve the following math problem step by step. Put your final answer in "
          "\\boxed{{}}.\n\n{problem}")


def log(msg: str) -> None:
    print(f"[math_eval {time.strftime('%H:%M:%S')}] {msg}", flush=True)


# ------------------------------------------------------------------- grading
def last_boxed(text: str) -> Optional[str]:
    i = text.rfind("\\boxed")
    if i < 0:
        return None
    j = text.find("{", i)
    if j < 0:
        return None
    depth = 0
    for k in range(j, len(text)):
        if text[k] == "{":
            depth += 1
        elif text[k] == "}":
            depth -= 1
            if depth == 0:
                return text[j + 1:k]
    return None


def normalize(ans: str) -> str:
    s = ans.strip()
    s = re.sub(r"\\text\{([^}]*)\}", r"\1", s)
    s = s.replace("\\left", "").replace("\\right", "").replace("\\dfrac", "\\frac")
    s = s.replace("\\tfrac", "\\frac").replace("$", "").replace("\\!", "").replace("\\,", "")
    s = re.sub(r"\s+", "", s).rstrip(".")
    return s


def as_number(s: str) -> Optional[Fraction]:
    m = re.fullmatch(r"\\frac\{(-?\d+)\}\{(\d+)\}", s) or re.fullmatch(r"(-?\d+)/(\d+)", s)
    try:
        if m:
            return Fraction(int(m.group(1)), int(m.group(2)))
        return Fraction(s.replace(",", "")) if re.fullmatch(r"-?[\d,]*\.?\d+", s) else None
    except (ValueError, ZeroDivisionError):
        return None


def extract(text: str, lenient: bool) -> Optional[str]:
    boxed = last_boxed(text)
    if boxed is not None:
        return normalize(boxed)
    if lenient:
        nums = re.findall(r"-?\d+(?:/\d+)?(?:\.\d+)?", text)
        return nums[-1] if nums else None
    return None


def is_correct(pred: Optional[str], answer: str) -> bool:
    if pred is None:
        return False
    gold = normalize(answer)
    a, b = as_number(pred), as_number(gold)
    if a is not None and b is not None:
        return a == b
    return pred == gold


# --------------------------------------------------------------------- worker
def worker(spec_path: str, out_path: str) -> None:
    from sglang_zipage import Engine

    spec = json.load(open(spec_path))
    t0 = time.time()
    engine = Engine(**spec["engine_kwargs"])
    start_s = time.time() - t0
    try:
        sp = {"temperature": spec["temperature"], "max_new_tokens": spec["max_new_tokens"]}
        if spec["temperature"] > 0:
            sp["top_p"] = spec["top_p"]
        prompts = [p for p in spec["prompts"] for _ in range(spec["samples"])]
        t1 = time.time()
        outs = engine.generate(prompt=prompts, sampling_params=sp)
        gen_s = time.time() - t1
    finally:
        engine.shutdown()
    res = {"start_s": start_s, "generate_s": gen_s,
           "outputs": [{"text": o["text"], "completion_tokens": o["meta_info"]["completion_tokens"],
                        "finish_reason": o["meta_info"].get("finish_reason")} for o in outs]}
    json.dump(res, open(out_path, "w"), default=str)


# ----------------------------------------------------------------------- main
def load_problems(path: Optional[str], n: Optional[int]) -> List[Dict]:
    if path is None:
        from sglang_zipage.harness.fidelity.texts import load_numeric_problems

        rows = load_numeric_problems()
    else:
        rows = [json.loads(line) for line in open(path) if line.strip()]
    probs = [{"id": r.get("id", str(i)), "problem": r.get("problem") or r["question"],
              "answer": str(r["answer"])} for i, r in enumerate(rows)]
    return probs[:n] if n else probs


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    a = ap.add_argument
    a("--model-path", default=None, help="default: the bundled SmolLM2-135M-Instruct")
    a("--problems", default=None, help="JSONL of {problem, answer} (default: CHAMP numeric)")
    a("--n", type=int, default=None, help="first N problems only")
    a("--max-new-tokens", type=int, default=4096)
    a("--temperature", type=float, default=0.0)
    a("--top-p", type=float, default=0.95)
    a("--samples", type=int, default=1, help="samples per problem (pass@1 = mean accuracy)")
    a("--budgets", default="2048", help="comma list of kv_budget tokens; '' for full KV only")
    a("--buffer", type=int, default=256)
    a("--window", type=int, default=16)
    a("--decay", type=float, default=0.8)
    a("--pooling", type=int, default=5)
    a("--redundancy", default="none", choices=["none", "full", "lightning"])
    a("--no-full", action="store_true", help="skip the full-KV run")
    a("--lenient", action="store_true", help="no \\boxed{}: take the last number")
    a("--engine-arg", action="append", default=[], metavar="KEY=VALUE")
    a("--workdir", default="/tmp/math-eval")
    a("--out", default=os.path.join(REPO, "benchmarks", "results", "fidelity_math_eval.json"))
    args = ap.parse_args(argv)
    if args.temperature == 0 and args.samples > 1:
        ap.error("--samples > 1 needs --temperature > 0 (greedy samples are identical)")
    os.makedirs(args.workdir, exist_ok=True)

    from transformers import AutoTokenizer

    if args.model_path is None:
        from sglang_zipage.model import bundled_model_path

        args.model_path = bundled_model_path()
    tok = AutoTokenizer.from_pretrained(args.model_path)
    problems = load_problems(args.problems, args.n)
    prompts = [tok.apply_chat_template([{"role": "user",
                                         "content": PROMPT.format(problem=p["problem"])}],
                                       tokenize=False, add_generation_prompt=True)
               for p in problems]
    base = {"model_path": args.model_path, "random_seed": 0}
    import torch

    if not torch.cuda.is_available():
        longest = max(len(tok(p)["input_ids"]) for p in prompts)
        base["max_total_tokens"] = len(prompts) * args.samples * (longest + args.max_new_tokens) + 1024
    base.update(parse_engine_args(args.engine_arg))
    configs = [] if args.no_full else [("full", {**base, "zipage_enabled": False})]
    for b in [int(x) for x in args.budgets.split(",") if x.strip()]:
        configs.append((f"budget{b}", {**base, "zipage_mode": "fixed",  # compress at the limit
                                       "zipage_kv_budget": b, "zipage_buffer": args.buffer,
                                       "zipage_window": args.window, "zipage_decay": args.decay,
                                       "zipage_pooling": args.pooling,
                                       "zipage_redundancy": args.redundancy}))
    runs = {}
    for name, kw in configs:
        spec = {"engine_kwargs": kw, "prompts": prompts, "samples": args.samples,
                "temperature": args.temperature, "top_p": args.top_p,
                "max_new_tokens": args.max_new_tokens}
        sp, op = os.path.join(args.workdir, f"spec_{name}.json"), os.path.join(args.workdir, f"out_{name}.json")
        json.dump(spec, open(sp, "w"))
        log(f"{name}: {len(problems)} problems x {args.samples} samples, <= {args.max_new_tokens} tokens")
        subprocess.run([sys.executable, os.path.abspath(__file__), "--worker", sp, op], check=True)
        res = json.load(open(op))
        per = []
        for i, p in enumerate(problems):
            outs = res["outputs"][i * args.samples:(i + 1) * args.samples]
            preds = [extract(o["text"], args.lenient) for o in outs]
            loose = [extract(o["text"], True) for o in outs]
            per.append({"id": p["id"], "answer": p["answer"], "predictions": preds,
                        "correct": [is_correct(x, p["answer"]) for x in preds],
                        "correct_lenient": [is_correct(x, p["answer"]) for x in loose],
                        "completion_tokens": [o["completion_tokens"] for o in outs],
                        "texts": [o["text"] for o in outs]})
        n_out = len(problems) * args.samples
        runs[name] = {
            "engine_kwargs": {k: v for k, v in kw.items() if k != "model_path"},
            "pass_at_1": sum(sum(r["correct"]) for r in per) / n_out,
            "answer_found": sum(x is not None for r in per for x in r["predictions"]) / n_out,
            "pass_at_1_lenient": sum(sum(r["correct_lenient"]) for r in per) / n_out,
            "mean_completion_tokens": sum(sum(r["completion_tokens"]) for r in per) / n_out,
            "start_s": res["start_s"], "generate_s": res["generate_s"], "problems": per}
        log(f"{name}: pass@1 {runs[name]['pass_at_1']:.3f}, answer found "
            f"{runs[name]['answer_found']:.2f}, mean length {runs[name]['mean_completion_tokens']:.0f} "
            f"tokens, generate {res['generate_s']:.0f} s")
    if "full" in runs:
        for name, r in runs.items():
            r["length_inflation"] = r["mean_completion_tokens"] / runs["full"]["mean_completion_tokens"]
            r["pass_at_1_relative"] = (r["pass_at_1"] / runs["full"]["pass_at_1"]
                                       if runs["full"]["pass_at_1"] else None)
    out = {"name": "fidelity_math_eval", "command": " ".join([os.path.relpath(__file__, REPO)] + sys.argv[1:]),
           "config": vars(args), "versions": versions(VERSION_MODULES),
           "git_sha": git_commit(dirty=True), "device": gpu_name(cpu=f"cpu ({os.cpu_count()} cores)"),
           "prompt_template": PROMPT,
           "summary": {k: {x: v.get(x) for x in ("pass_at_1", "answer_found", "pass_at_1_lenient",
                                                 "mean_completion_tokens",
                                                 "length_inflation", "pass_at_1_relative")}
                       for k, v in runs.items()},
           "runs": runs}
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    json.dump(out, open(args.out, "w"), indent=1, default=str)
    log(f"summary {json.dumps(out['summary'])}")
    log(f"wrote {args.out}")


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "--worker":
        worker(sys.argv[2], sys.argv[3])
    else:
        main()
