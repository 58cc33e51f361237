#!/usr/bin/env python3
"""Model-family coverage on the GPU (issue 15): each family starts, compresses within its
budget and matches stock where nothing compresses, or is refused at startup by name.

    source benchmarks/device_env.sh && python3 benchmarks/coverage.py \\
        --out $OUT/coverage-h200.json --parallel 6 --deadline-s 1500

Each row (family, kv_dtype, attention_backend, page_size) runs in a process of its own
(``coverage.py row ...``): a stock engine, then a zipage engine (fixed mode, loop guard on), on
the family's config.json under benchmarks/models/ (public dimensions, a few layers, dummy
weights seeded alike), CUDA graphs, overlap and SGLang's strict memory checker on. Checks:
  short     4 x 200-id prompts, 48 greedy tokens, one batch: output ids equal stock's
  compress  16 x 200 ids x 900 tokens at temperature 1, one batch: every request completes,
            compacts at least once per buffer after its limit, and no suffix outgrows
            budget + buffer (the loop guard's raised budget where it fired)
  answers   the same prompts with a think-end marker (a logit bias) and answer budget 128:
            every answer stays whole, the thinking before it is kept within the answer budget
  memory    zipage's buffers take at most 3% of the pool stock sizes from the same flags;
            start times and zipage's kernel warm-up are recorded
With --scorer calibrated each row first calibrates its model (python -m sglang_zipage.calibrate's
capture on a zipage engine of the row's flags, random ids: dummy weights have no tokenizer) and
its zipage engine scores with those statistics (write such rows to a file of their own).
--speculative runs SPEC_MATRIX instead (issue 45): each family with a speculative algorithm
and its draft, calibrated scorer, page 1; its zipage engine also runs the long prompts greedy
compressed and with a per-request budget of 0, and reports both accept lengths side by side.
A startup refusal is status ``refused``; a failed check, crash or timeout ``fail``. Rows run
--parallel at a time on one GPU, as GPU_GIB allows; the JSON is written after every row.
FAMILIES and MATRIX below list the rows; ``coverage.py merge BASE RUN... --out`` folds runs
into benchmarks/results/coverage-h200.json.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import subprocess
import sys
import threading
import time
import traceback
from concurrent.futures import ThreadPoolExecutor

from sglang_zipage import segments
from sglang_zipage.harness import engines, probe
from sglang_zipage.harness.engines import (MODELS, dummy_engine_kwargs, model_config,
                                           shape_override, vocab_size, zipage_kwargs)
from sglang_zipage.harness.record import command_line, git_commit, gpu_name, write_json
from sglang_zipage.harness.server import STRICT_CHECKS_ENV
from sglang_zipage.repetition import LoopGuard

PROMPT, SHORT_OUT, LONG_OUT, N_SHORT, N_LONG = 200, 48, 900, 4, 16
ANSWER_BUDGET = 128  # the think-segment batch's zipage_answer_budget (legal on every page)
MARKER_EVERY = 450  # tokens per think-end marker written, on average (think_marker_params)

# name -> (folder, layers, kv_budget, buffer). Layer counts keep each family's mix of layer
# kinds (Gemma 3: 5 sliding + 1 global; gpt-oss: sliding/full alternate; DeepSeek: 1 dense +
# MoE, V3: 3 dense + MoE). Gemma 3's budget covers its 512-token sliding window.
FAMILIES = {
    "qwen3-8b": ("qwen3-8b-dummy", 4, 256, 64),
    "llama-3.1-8b": ("llama-3.1-8b", 4, 256, 64),
    "deepseek-r1-distill-qwen-7b": ("deepseek-r1-distill-qwen-7b", 4, 256, 64),
    "mistral-7b": ("mistral-7b", 4, 256, 64),
    "qwen3-30b-a3b": ("qwen3-30b-a3b", 4, 256, 64),
    "gemma-3-1b": ("gemma-3-1b", 6, 512, 128),
    "gpt-oss-20b": ("gpt-oss-20b", 4, 256, 64),
    "deepseek-v2-lite": ("deepseek-v2-lite", 4, 256, 64),
    "deepseek-v3": ("deepseek-v3", 4, 256, 64),
    "qwen3-next-80b-a3b": ("qwen3-next-80b-a3b", 4, 256, 64),
}
# A second batch at a per-request budget (zipage_kv_budget) on the same engine:
# family -> (kv_budget, output tokens)
LARGE_BUDGET = {"deepseek-v3": (2048, 2600)}
# (kv_dtype, attention_backend, page_size) per family; "*" = every family. Page 64: what
# SGLang's FlashMLA backend needs, the page MLA deployments run with.
MATRIX = [("*", "bfloat16", "triton", 1), ("*", "fp8_e4m3", "triton", 1),
          ("*", "bfloat16", "flashinfer", 1), ("*", "bfloat16", "triton", 16),
          ("deepseek-v2-lite", "fp8_e4m3", "flashinfer", 1),
          ("gpt-oss-20b", "bfloat16", "triton-no-hybrid-swa", 1),
          ("deepseek-v3", "bfloat16", "triton", 64), ("deepseek-v3", "fp8_e4m3", "triton", 64),
          ("deepseek-v3", "bfloat16", "flashinfer", 64), ("deepseek-v3", "fp8_e4m3", "flashinfer", 1),
          ("deepseek-v3", "fp8_e4m3", "flashinfer", 64),
          # MLA backends SGLang 0.5.17 has that zipage does not compress: refused by name
          ("deepseek-v3", "bfloat16", "fa3", 64), ("deepseek-v3", "bfloat16", "flashmla", 64),
          ("deepseek-v3", "bfloat16", "cutlass_mla", 64), ("deepseek-v3", "bfloat16", "trtllm_mla", 64)]
# Every row's pool: large enough that the default --zipage-memory-fraction (3%) holds a window
# slot for each of the N_LONG requests compressing at once (a pool of a few thousand tokens
# would hold none: memory.py), as any real deployment's pool does.
# GPU memory a row's engine holds (weights, pool, graphs), to start no more rows at once than
# fit: eight rows side by side at c903d7e ran out of memory (DeepSeek-V3 ~24 GiB each).
GPU_GIB = {"deepseek-v3": 30}
DEFAULT_GPU_GIB = 14
GPU_GIB_TOTAL = 120
# Speculative decoding rows (issue 45; --speculative): (family, algorithm, draft, kv_dtype,
# backend), page 1 and the calibrated scorer (what zipage runs speculative decoding with),
# SGLang's chain drafts (SPEC_STEPS steps, topk 1, SPEC_DRAFT_TOKENS draft tokens). Drafts are
# dummy weights of public draft shapes under benchmarks/models/: one LlamaForCausalLMEagle3
# layer with a 32k draft vocabulary for Qwen3-8B, one EAGLE layer for Llama-3.1-8B,
# DeepSeek-V3's own MTP layer (NEXTN: no draft folder), and STANDALONE with the target itself
# ("target": the same dummy seed makes the draft the target, so its accept length means
# something; the other drafts' random weights propose near-random tokens).
SPEC_STEPS, SPEC_DRAFT_TOKENS = 3, 4
SPEC_MATRIX = [  # in the order they start: the three pairs first, bf16 before FP8
    ("qwen3-8b", "EAGLE3", "qwen3-8b-eagle3", "bfloat16", "flashinfer"),
    ("deepseek-v3", "NEXTN", None, "bfloat16", "triton"),
    ("llama-3.1-8b", "EAGLE", "llama-3.1-8b-eagle", "bfloat16", "flashinfer"),
    ("qwen3-8b", "STANDALONE", "target", "bfloat16", "flashinfer"),
    ("qwen3-8b", "EAGLE3", "qwen3-8b-eagle3", "fp8_e4m3", "flashinfer"),
    ("deepseek-v3", "NEXTN", None, "fp8_e4m3", "triton"),
    ("llama-3.1-8b", "EAGLE", "llama-3.1-8b-eagle", "fp8_e4m3", "flashinfer"),
    ("deepseek-v3", "NEXTN", None, "bfloat16", "flashinfer"),
    ("qwen3-8b", "STANDALONE", "target", "bfloat16", "triton"),
    ("qwen3-8b", "EAGLE3", "qwen3-8b-eagle3", "bfloat16", "triton"),
    ("llama-3.1-8b", "EAGLE", "llama-3.1-8b-eagle", "bfloat16", "triton"),
]
SPEC_GIB = 1.25  # a draft model and its pool beside the target's
POOL_TOKENS = {"deepseek-v3": 2_000_000}  # 128 query heads: a slot costs 3.1 MB
DEFAULT_POOL_TOKENS = 600_000
DEFAULT_SHARE = 0.03

def rows(families):
    out = []
    for fam, dtype, backend, page in MATRIX:
        for name in (families if fam == "*" else [fam]):
            if name in families:
                out.append({"family": name, "kv_dtype": dtype, "attention_backend": backend,
                            "page_size": page})
    return out


def spec_rows(families):
    return [{"family": fam, "kv_dtype": dtype, "attention_backend": backend, "page_size": 1,
             "speculative": algorithm, "draft": draft}
            for fam, algorithm, draft, dtype, backend in SPEC_MATRIX if fam in families]


# ------------------------------------------------------------------------------ one row
def model_override(row):
    """The config fields a row changes (harness.engines.shape_override)."""
    folder, layers, _, _ = FAMILIES[row["family"]]
    return shape_override(os.path.join(MODELS, folder), layers)


def written_model(row) -> str:
    """A folder holding the family's config.json with the row's override written in. A
    speculative row needs it: SGLang applies --json-model-override-args to the draft's config
    as well (it would give an EAGLE draft the target's layer count), while a draft that is the
    target (NEXTN's MTP layer, STANDALONE) must read the target's changed config."""
    folder = FAMILIES[row["family"]][0]
    cfg = {**model_config(os.path.join(MODELS, folder)), **model_override(row)}
    return write_config(cfg, f"{folder}-L{cfg['num_hidden_layers']}")


def write_config(cfg, name: str) -> str:
    """A folder of the temp dir's zipage-coverage-models holding ``cfg`` as its config.json."""
    import tempfile

    return engines.write_config(cfg, os.path.join(tempfile.gettempdir(),
                                                  "zipage-coverage-models", name))


def eagle3_draft(row) -> str:
    """The row's EAGLE3 draft folder with the target layers it reads named for the row's
    target. SGLang's default, layers (2, L // 2, L - 3), repeats a layer when L is the
    coverage rows' 4, and the draft's first layer then gets two hidden states where it takes
    three (seen on an H100: "mat1 and mat2 shapes cannot be multiplied (800x8192 and
    12288x4096)"); three distinct layers spread over the target, as a real draft's are."""
    layers = model_override(row)["num_hidden_layers"]
    cfg = model_config(os.path.join(MODELS, row["draft"]))
    cfg["eagle_config"] = {**cfg.get("eagle_config", {}), "eagle_aux_hidden_state_layer_ids":
                           sorted({0, layers // 2 - 1, layers - 2})}
    return write_config(cfg, f"{row['draft']}-for-L{layers}")


def spec_kwargs(row, target: str):
    """SGLang's speculative decoding flags of a row (see SPEC_MATRIX)."""
    kw = {"speculative_algorithm": row["speculative"],
          "speculative_num_draft_tokens": SPEC_DRAFT_TOKENS}
    if row["speculative"] != "NGRAM":
        kw.update(speculative_num_steps=SPEC_STEPS, speculative_eagle_topk=1)
    if row.get("draft") == "target":
        kw["speculative_draft_model_path"] = target
    elif row["speculative"] == "EAGLE3":
        kw["speculative_draft_model_path"] = eagle3_draft(row)
    elif row.get("draft"):
        kw["speculative_draft_model_path"] = os.path.join(MODELS, row["draft"])
    return kw


def engine_kwargs(row, stock):
    folder, _, budget, buffer = FAMILIES[row["family"]]
    backend = row["attention_backend"]
    model, more = os.path.join(MODELS, folder), {}
    if row.get("speculative"):
        model = written_model(row)
        more = spec_kwargs(row, model)
    else:
        more["json_model_override_args"] = json.dumps(model_override(row))
    kw = dummy_engine_kwargs(
        model, page_size=row["page_size"], seed=0, log_level="warning",
        kv_cache_dtype=row["kv_dtype"] if row["kv_dtype"] != "bfloat16" else "auto",
        mem_fraction_static=0.85, disable_prefill_cuda_graph=True,
        cuda_graph_bs_decode=[1, N_SHORT, N_LONG], **more)
    if backend.endswith("-no-hybrid-swa"):
        backend = backend[:-len("-no-hybrid-swa")]
        kw["disable_hybrid_swa_memory"] = True
    kw["attention_backend"] = backend
    if not row.get("default_pool"):  # else SGLang sizes it from mem_fraction_static, alone
        kw["max_total_tokens"] = POOL_TOKENS.get(row["family"], DEFAULT_POOL_TOKENS)
    # the window scorer unless the row calibrates: a statistics file some other run left in
    # the model's folder (a 36-layer calibration beside these 4-layer rows) is not the row's
    options = {"mode": "fixed", "kv_budget": budget, "buffer": buffer, "scorer": "window"}
    if row.get("scorer") == "calibrated":
        options.update(scorer="calibrated", query_stats=row["query_stats"])
    return {**kw, **zipage_kwargs("stock" if stock else "zipage", options)}


def without(row, *keys):
    return {k: v for k, v in row.items() if k not in keys}


def calibrate_row(row) -> None:
    """The row's model's query statistics (K = calibrate.QUERIES) at row["query_stats"],
    captured on a zipage engine of the row's flags (window scorer) from random ids."""
    from sglang_zipage import calibrate

    plain = without(row, "scorer", "query_stats", "speculative", "draft")
    parts, what = calibrate.calibration_tokens(os.path.join(MODELS, FAMILIES[row["family"]][0]),
                                               calibrate.DOMAINS, 1024)
    acc = calibrate.capture(engine_kwargs(plain, stock=False), parts)
    acc.stats(calibrate.QUERIES, {"texts": what, "row": plain}).save(row["query_stats"])


def prompts(row, n, seed):
    hi = min(vocab_size(os.path.join(MODELS, FAMILIES[row["family"]][0])), 30000)
    rng = random.Random(seed)
    return [[rng.randrange(100, hi) for _ in range(PROMPT)] for _ in range(n)]


def per_request(outs):
    """What the checks need of each response's meta_info."""
    keys = {"completion_tokens": "tokens", "zipage_compactions": "compactions",
            "zipage_loop_guard": "loop_guard", "zipage_kv_len": "kv_len",
            "prompt_tokens": "prompt", "spec_accept_length": "accept_length"}
    return [{short: o["meta_info"].get(k) for k, short in keys.items()} for o in outs]


def think_marker_params(row, n):
    """Per request i of n, its think-end marker (token 50 + i, never in a prompt) and a logit
    bias that makes a sampled output write it about once per MARKER_EVERY tokens where the
    dummy weights' next-token distribution is near uniform: it first comes at a random point,
    often past the request's first compactions (then its thinking is compacted to the answer
    budget) with an answer longer than the limit after it (then an evicted answer token
    would show)."""
    bias = math.log(vocab_size(os.path.join(MODELS, FAMILIES[row["family"]][0])) / MARKER_EVERY)
    return [{"zipage_think_end": [50 + i], "zipage_answer_budget": ANSWER_BUDGET,
             "logit_bias": {str(50 + i): bias}} for i in range(n)]


def run_engine(row, stock):
    from sglang_zipage import Engine

    res = {}
    t0 = time.perf_counter()
    try:
        eng = Engine(**engine_kwargs(row, stock))
    except (ValueError, AssertionError, RuntimeError) as e:
        res["refused"] = str(e)[-1500:]
        return res
    res["start_s"] = round(time.perf_counter() - t0, 1)
    try:
        greedy = lambda n, **kw: {"max_new_tokens": n, "temperature": 0, "ignore_eos": True, **kw}  # noqa: E731
        sampled = lambda n, **kw: greedy(n, temperature=1.0, **kw)  # noqa: E731
        outs = eng.generate(input_ids=prompts(row, N_SHORT, 1), sampling_params=greedy(SHORT_OUT))
        res["short"] = [o["output_ids"] for o in outs]
        if not stock:
            long_prompts = prompts(row, N_LONG, 2)
            t1 = time.perf_counter()
            outs = eng.generate(input_ids=long_prompts, sampling_params=sampled(LONG_OUT))
            res["compress_s"] = round(time.perf_counter() - t1, 1)
            res["requests"] = per_request(outs)
            # the same prompts again, each with a think-end marker (per-request
            # zipage_think_end as token ids) and an answer budget
            marks = think_marker_params(row, N_LONG)
            outs = eng.generate(input_ids=long_prompts,
                                sampling_params=[sampled(LONG_OUT, **m) for m in marks])
            res["answers"] = [{**r, "marker_at": segments.find(o["output_ids"], m["zipage_think_end"])}
                              for r, o, m in zip(per_request(outs), outs, marks)]
            if row.get("speculative"):
                # accept length, greedy, the same prompts compressed and not (a per-request
                # budget of 0), on the same engine
                res["accept"] = {
                    name: per_request(eng.generate(input_ids=long_prompts, sampling_params=greedy(
                        LONG_OUT, **({} if name == "compressed" else {"zipage_kv_budget": 0}))))
                    for name in ("compressed", "full")}
            if row["family"] in LARGE_BUDGET:
                budget, out = LARGE_BUDGET[row["family"]]
                outs = eng.generate(input_ids=prompts(row, N_LONG, 3),
                                    sampling_params=sampled(out, zipage_kv_budget=budget))
                res["large_budget"] = {"kv_budget": budget, "output": out,
                                       "requests": per_request(outs)}
            res["zipage"] = probe.zipage_state(eng)
        state = probe.internal_states(eng)[0]
        res["pool_tokens"] = state.get("memory_usage", {}).get("token_capacity")
        res["startup_time"] = state.get("startup_time")
    finally:
        eng.shutdown()
    return res


def outcome(requests):
    """What a batch's requests came to: their lengths and compaction counts, each distinct."""
    return {"lengths": sorted({r["tokens"] for r in requests}),
            "request_compactions": sorted({r["compactions"] for r in requests})}


def expected_compactions(out, budget, buffer):
    """Compactions of a request that writes ``out`` tokens at a budget it keeps: one when its
    suffix first reaches the limit, then one per buffer."""
    return (out - budget - buffer) // buffer + 1


def compressed_ok(requests, out, budget, buffer, step=1):
    """Every request wrote ``out`` tokens and compacted once per buffer after its limit; one
    the loop guard raised (its budget x 2 per trigger, at most 4x) at least once, before the
    guard could watch it. With ``step`` tokens committed per decode step (speculative
    decoding) a step may cross the limit by step - 1 tokens: compactions come at least once
    per buffer + step tokens, the limit is step - 1 higher. Returns (ok, the largest limit any
    request had)."""
    want = expected_compactions(out, budget, buffer + step - 1)
    ok, limit = True, budget + buffer + step - 1
    for r in requests:
        boost = min(LoopGuard.max_boost, 2 ** (r["loop_guard"] or 0))
        ok = ok and r["tokens"] == out and r["compactions"] >= (want if boost == 1 else 1)
        limit = max(limit, budget * boost + buffer + step - 1)
    return ok, limit


def accept_summary(accept):
    """Mean accept length of the compressed and the uncompressed greedy batch, their ratio,
    and how many uncompressed requests compacted (must be none)."""
    def mean(rows, key):
        xs = [r[key] for r in rows if r.get(key) is not None]
        return round(sum(xs) / len(xs), 4) if xs else None

    a, b = mean(accept["compressed"], "accept_length"), mean(accept["full"], "accept_length")
    return {"compressed": a, "full": b, "ratio": round(a / b, 4) if a and b else None,
            "compactions_per_request": mean(accept["compressed"], "compactions"),
            "full_requests_compacted": sum(bool(r["compactions"]) for r in accept["full"])}


def answers_ok(answers, layout, page, step=1):
    """Think segments: where a request's marker was written, everything from it on is still
    in its KV at the end (kv_len >= prompt + the answer's written columns) and what it kept
    of the thinking is at most the answer budget + a page; some marker was found, except on
    hybrid sliding-window pools, where segments are off (runtime._spans_anywhere)."""
    found = [a for a in answers if a["marker_at"] >= 0]
    ev = {"markers_found": len(found), "requests": len(answers),
          "marker_at": sorted(a["marker_at"] for a in found),
          "answer_tokens": sorted(a["tokens"] - a["marker_at"] for a in found)}
    if layout == "hybrid-swa":
        return True, {**ev, "segments": "off on the hybrid sliding-window pool"}
    held = [a["kv_len"] - a["prompt"] - (a["tokens"] - 1 - a["marker_at"]) for a in found]
    ev["thinking_kept"] = sorted(held)
    ok = bool(found) and all(0 <= h <= ANSWER_BUDGET + page + step - 1 for h in held)
    return ok, ev


def judge(row, stock, zipage):
    _, _, budget, buffer = FAMILIES[row["family"]]
    for side in (zipage, stock):
        if "refused" in side:
            return {"status": "refused", "message": side["refused"],
                    "refused_by": "zipage" if "--zipage-disable" in side["refused"] else "sglang"}
    z = zipage["zipage"] or {}
    first_diff = next((i for i, (a, b) in enumerate(zip(stock["short"], zipage["short"])) if a != b), None)
    plan = z.get("memory") or {}
    mem = {"zipage_memory_bytes": z.get("memory_bytes"), "kv_pool_bytes": plan.get("kv_pool_bytes"),
           "stock_kv_pool_bytes": (stock.get("pool_tokens") or 0) * plan.get("cell_bytes", 0),
           "pool_tokens": {"stock": stock.get("pool_tokens"), "zipage": zipage.get("pool_tokens")},
           "window_slots": plan.get("window_slots"), "slots_wanted": plan.get("slots_wanted"),
           "windowless_compactions": z.get("windowless_compactions")}
    mem["share_of_stock_pool"] = (round(mem["zipage_memory_bytes"] / mem["stock_kv_pool_bytes"], 5)
                                  if mem["zipage_memory_bytes"] and mem["stock_kv_pool_bytes"] else None)
    reqs = zipage["requests"]
    step = SPEC_DRAFT_TOKENS if row.get("speculative") else 1
    compress_ok, limit = compressed_ok(reqs, LONG_OUT, budget, buffer, step)
    layout = z.get("layout") or {}
    answers_pass, answers = answers_ok(zipage["answers"], layout.get("layout"), row["page_size"],
                                       step)
    ev = {"start_s": {"stock": stock["start_s"], "zipage": zipage["start_s"]},
          "zipage_over_stock_start_s": round(zipage["start_s"] - stock["start_s"], 1),
          "warm_up_s": z.get("warm_up_s"), "memory": mem,
          "startup_time": {"stock": stock.get("startup_time"), "zipage": zipage.get("startup_time")},
          "compress_s": zipage["compress_s"], **outcome(reqs),
          "loop_guard": {"requests_raised": sum(bool(r["loop_guard"]) for r in reqs),
                         "triggers": z.get("loop_guard_triggers")},
          "compactions": z.get("compactions"), "max_suffix_tokens": z.get("max_suffix_tokens"),
          "expected_compactions_per_request": expected_compactions(LONG_OUT, budget, buffer),
          "think_segments": answers, "short_equal_stock": first_diff is None,
          "short_first_diff_request": first_diff, "layout": layout}
    ok = (ev["short_equal_stock"] and compress_ok and answers_pass
          and mem["share_of_stock_pool"] is not None and mem["share_of_stock_pool"] <= DEFAULT_SHARE)
    if "accept" in zipage:  # speculative rows: accept length reported, never judged
        ev["accept_length"] = acc = accept_summary(zipage["accept"])
        # (greedy dummy-weight text repeats itself: the loop guard raises some of these
        # requests' budgets, and so their limit; seen on an H100: 32 triggers, a suffix of 640
        # past the unraised limit 323)
        greedy_ok, greedy_limit = compressed_ok(zipage["accept"]["compressed"], LONG_OUT,
                                                budget, buffer, step)
        ok = ok and greedy_ok and acc["full_requests_compacted"] == 0
        limit = max(limit, greedy_limit)
    large = zipage.get("large_budget")
    if large:  # the per-request budget's batch: its own limit, its own compactions
        large_ok, large_limit = compressed_ok(large["requests"], large["output"],
                                              large["kv_budget"], buffer, step)
        ev["large_budget"] = {
            "kv_budget": large["kv_budget"], "output": large["output"],
            **outcome(large["requests"]),
            "kv_len": max(r["kv_len"] for r in large["requests"])}
        ok, limit = ok and large_ok, max(limit, large_limit)
    ev["limit"] = limit
    ok = ok and ev["max_suffix_tokens"] is not None and ev["max_suffix_tokens"] <= limit
    return {"status": "pass" if ok else "fail", "evidence": ev}


def refusal(row):
    """The message zipage's startup checks refuse the row's zipage engine with, or None;
    nothing starts (an engine SGLang itself cannot run, such as a backend missing from this
    build, would take the row's process down with it)."""
    from sglang_zipage.engine import checked

    try:
        checked(**engine_kwargs(row, stock=False))
    except (ValueError, AssertionError, RuntimeError) as e:
        return str(e)[-1500:]
    return None


def run_row(row, out_path):
    os.environ.update(STRICT_CHECKS_ENV)
    result = dict(row)
    try:
        # the row's model and flags without the scorer (and without speculative decoding,
        # which runs with the calibrated scorer only): what the calibration starts
        refused = refusal(without(row, "scorer", "query_stats", "speculative", "draft"))
        if not refused and row.get("scorer") == "calibrated":
            calibrate_row(row)
            refused = refusal(row)  # the statistics' shape against the model's
        if refused:
            stock = zipage = {"refused": refused}
        else:
            # stock first: where the row's kernels are not in the shared Triton cache yet,
            # the first engine compiles SGLang's own (minutes at page 1), as on a fresh
            # machine; the zipage engine after it then starts on a warm cache, so its start
            # minus stock's is its own cost (buffers, hooks, its kernels' warm-up: warm_up_s)
            stock = run_engine(row, stock=True)
            zipage = run_engine(row, stock=False)
        result.update(judge(row, stock, zipage))
    except Exception:
        result.update(status="fail", error=traceback.format_exc()[-3000:])
    write_json(result, out_path)


# ------------------------------------------------------------------------------ driver
def drive(args):
    families = args.families.split(",") if args.families else list(FAMILIES)
    todo = spec_rows(families) if args.speculative else rows(families)
    if args.rows:  # family:kv_dtype:backend:page, comma separated
        want = {tuple(r.split(":")) for r in args.rows.split(",")}
        todo = [r for r in todo if (r["family"], r["kv_dtype"], r["attention_backend"],
                                    str(r["page_size"])) + ((r["speculative"],) if args.speculative
                                                            else ()) in want]
    if args.default_pool:
        todo = [{**r, "default_pool": True} for r in todo]
    workdir = args.workdir or os.path.dirname(os.path.abspath(args.out))
    if args.scorer == "calibrated" or args.speculative:
        todo = [{**r, "scorer": "calibrated",
                 "query_stats": os.path.join(workdir, "stats-{family}-{kv_dtype}-{attention_backend}"
                                             "-{page_size}{spec}.safetensors".format(
                                                 **r, spec=f"-{r['speculative']}" if r.get("speculative") else ""))}
                for r in todo]
    if not args.speculative:  # (speculative rows keep SPEC_MATRIX's order)
        todo.sort(key=lambda r: r["family"] != "deepseek-v3")  # the rows first
    os.makedirs(workdir, exist_ok=True)
    deadline = time.monotonic() + args.deadline_s
    report = {"command": command_line(prog="python3 benchmarks/coverage.py"),
              "commit": git_commit() or "unknown", "gpu": gpu_name(),
              "setup": {"prompt": PROMPT, "short_out": SHORT_OUT, "long_out": LONG_OUT,
                        "n_short": N_SHORT, "n_long": N_LONG, "families": FAMILIES,
                        "cuda_graphs": True, "overlap": True, "strict_mem_check": True},
              "rows": []}

    room = threading.Condition()
    free = [args.gpu_gib]

    def one(i_row):
        gib = GPU_GIB.get(i_row[1]["family"], DEFAULT_GPU_GIB)
        gib = min(args.gpu_gib, gib * (SPEC_GIB if i_row[1].get("speculative") else 1))
        with room:
            room.wait_for(lambda: free[0] >= gib)
            free[0] -= gib
        try:
            return run_one(i_row)
        finally:
            with room:
                free[0] += gib
                room.notify_all()

    def run_one(i_row):
        i, row = i_row
        part = os.path.join(workdir, f"row{i:02d}.json")
        log = open(os.path.join(workdir, f"row{i:02d}.log"), "w")
        left = deadline - time.monotonic()
        if left < 60:
            return {**row, "status": "fail", "error": "not run: deadline"}
        t0 = time.monotonic()
        try:
            subprocess.run([sys.executable, os.path.abspath(__file__), "row", json.dumps(row), part],
                           stdout=log, stderr=subprocess.STDOUT, timeout=left, check=False)
            res = json.load(open(part))
        except subprocess.TimeoutExpired:
            res = {**row, "status": "fail", "error": "timeout at the deadline"}
        except (OSError, ValueError):
            res = {**row, "status": "fail", "error": "no result; see log",
                   "log_tail": open(log.name).read()[-2000:]}
        res["row_s"] = round(time.monotonic() - t0, 1)
        print("ROW", json.dumps({k: res.get(k) for k in ("family", "kv_dtype", "attention_backend",
                                                         "page_size", "speculative", "status",
                                                         "row_s")}), flush=True)
        report["rows"].append(res)
        write_json(report, args.out)
        return res

    with ThreadPoolExecutor(args.parallel) as ex:
        list(ex.map(one, enumerate(todo)))
    counts = {s: sum(r["status"] == s for r in report["rows"]) for s in ("pass", "refused", "fail")}
    report["summary"] = counts
    write_json(report, args.out)
    print("SUMMARY", json.dumps(counts), flush=True)


# ------------------------------------------------------------------------------- merge
def _key(row):
    return (row["family"], row["kv_dtype"], row["attention_backend"], int(row["page_size"]),
            bool(row.get("default_pool")), row.get("speculative"))


def _harness_failure(row) -> bool:
    """A row the driver could not measure (no result: a crash outside the checks, such as
    another row's engine holding the GPU memory, or the deadline), as opposed to a check
    that failed."""
    return row["status"] == "fail" and "evidence" not in row


def merge(base: dict, runs: list) -> dict:
    """Rows of later runs replace the base's (the replaced result kept under "previous");
    a later run that could not measure a row leaves the row's last result and is listed
    under its "attempts". Each row keeps the commit and command it was measured with."""
    out = {k: v for k, v in base.items() if k not in ("rows", "summary")}
    rows = {_key(r): r for r in base.get("rows", [])}
    for run in runs:
        for r in run["rows"]:
            r = {**r, "commit": r.get("commit", run["commit"]),
                 "command": r.get("command", run["command"])}
            old = rows.get(_key(r))
            if _harness_failure(r) and old is not None:
                old.setdefault("attempts", []).append(
                    {k: r.get(k) for k in ("commit", "command", "error", "log_tail")})
                continue
            if old is not None:
                earlier = old.get("previous", [])
                earlier = earlier if isinstance(earlier, list) else [earlier]
                r["previous"] = [{k: v for k, v in old.items() if k != "previous"}] + earlier
            rows[_key(r)] = r
    out["rows"] = list(rows.values())
    out["summary"] = {s: sum(r["status"] == s for r in out["rows"]) for s in ("pass", "refused", "fail")}
    return out


def main():
    if len(sys.argv) > 1 and sys.argv[1] == "merge":
        p = argparse.ArgumentParser(description="merge coverage runs into one results file")
        p.add_argument("merge")
        p.add_argument("base", help="the results file so far")
        p.add_argument("runs", nargs="+", help="later runs' JSON, oldest first")
        p.add_argument("--out", required=True)
        a = p.parse_args()
        merged = merge(json.load(open(a.base)), [json.load(open(f)) for f in a.runs])
        write_json(merged, a.out)
        print("SUMMARY", json.dumps(merged["summary"]))
        return
    if len(sys.argv) > 1 and sys.argv[1] == "row":
        run_row(json.loads(sys.argv[2]), sys.argv[3])
        return
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True)
    p.add_argument("--families", default="", help="comma list (default: all of FAMILIES)")
    p.add_argument("--rows", default="", help="only these rows: family:kv_dtype:backend:page"
                   "[:ALGORITHM with --speculative],...")
    p.add_argument("--parallel", type=int, default=6)
    p.add_argument("--deadline-s", type=float, default=540)
    p.add_argument("--workdir", default=None, help="per-row JSON and logs (default: next to --out)")
    p.add_argument("--scorer", default="window", choices=["window", "calibrated"],
                   help="the zipage engines' scorer (calibrated: each row calibrates first)")
    p.add_argument("--speculative", action="store_true",
                   help="the speculative decoding rows (SPEC_MATRIX; calibrated scorer) instead")
    p.add_argument("--gpu-gib", type=float, default=GPU_GIB_TOTAL,
                   help="GPU memory the rows side by side may hold (GPU_GIB per row)")
    p.add_argument("--default-pool", action="store_true",
                   help="pools sized by SGLang from mem_fraction_static (run rows one at a time)")
    drive(p.parse_args())


if __name__ == "__main__":
    main()
