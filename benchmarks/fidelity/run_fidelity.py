#!/usr/bin/env python3
"""Fidelity of Compressed PagedAttention in the SGLang integration (issue 8, part 2).

Teacher forcing: every text is cut into a prompt (--prompt-len tokens, never compressed) and a
reference continuation (--cont-len tokens) that the engine decodes token by token while it
compresses, recording the log-probability and top-1 it gave each reference token
(forcing.py). Each compressed run is compared with the full-KV run of the same implementation
over the steps after its first compaction: NLL ratio and top-1 agreement, with block-bootstrap
intervals (harness/fidelity/metrics.py). Budgets are --budgets fractions of --cont-len.
Variants (cumulative): window, +decay, +redundancy, +pooling; controls random and recent.
Implementations: "engine" (sglang_zipage.Engine, one process per configuration,
engine_runner.py) and "hf" (a plain transformers loop with the same eviction,
harness/fidelity/hf_reference.py); engine - hf per variant, paired bootstrap. Free running:
greedy generations with and without compression (length inflation, 4-gram repetition).

Presets: --preset subset (2 texts x 256, CPU ~10 min), cpu (4 x 512, CPU ~80 min), full
(12 x 1024, every variant at 12.5/25/50%); any value can be overridden. --resume reuses the
part files in --workdir.

  .venv/bin/python benchmarks/fidelity/run_fidelity.py --preset cpu --hf-budgets 0.25 \\
      --out benchmarks/results/fidelity-cpu.json --png benchmarks/results/fidelity-cpu.png
Full set: benchmarks/fidelity/run_h200.sh (engine and HF halves on two GPUs, then merged);
plot_fidelity.py redraws the PNG. Method and results: benchmarks/fidelity/README.md.
"""

from __future__ import annotations

import argparse
import dataclasses
import gzip
import json
import os
import subprocess
import sys
import time
from typing import Dict, Optional

from sglang_zipage.harness.engines import parse_engine_args
from sglang_zipage.harness.fidelity import metrics
from sglang_zipage.harness.record import REPO, command_line, git_commit, gpu_name, versions

HERE = os.path.dirname(os.path.abspath(__file__))
VERSION_MODULES = ("sglang", "torch", "transformers", "triton", "sglang_zipage")

# name -> (description, scoring parameters, selection policy)
VARIANTS = {
    "window": ("window attention only",
               dict(decay=0.0, pooling=1, redundancy="none", scorer="window"), "score"),
    "+decay": ("+ global score, decay 0.8",
               dict(decay=0.8, pooling=1, redundancy="none", scorer="window"), "score"),
    "+redundancy": ("+ redundancy (R-KV, full)",
                    dict(decay=0.8, pooling=1, redundancy="full", scorer="window"), "score"),
    "+pooling": ("+ max-pooling 5 on the first compaction (all stages)",
                 dict(decay=0.8, pooling=5, redundancy="full", scorer="window"), "score"),
    "random": ("control: keep random tokens (+ the protected window)",
               dict(decay=0.0, pooling=1, redundancy="none", scorer="window"), "random"),
    "recent": ("control: keep only the most recent tokens",
               dict(decay=0.0, pooling=1, redundancy="none", scorer="window"), "recent"),
    # the calibrated scorer (issue 46): the model's query statistics (the bundled model's
    # shipped file, the same in the engine and the HF reference), no query window
    "calibrated": ("calibrated scorer: query statistics, no stored queries",
                   dict(decay=0.0, pooling=1, redundancy="none", scorer="calibrated"), "score"),
    "calibrated+decay": ("calibrated scorer + global score, decay 0.8",
                         dict(decay=0.8, pooling=1, redundancy="none", scorer="calibrated"),
                         "score"),
    "calibrated+redundancy": ("calibrated scorer + global score + redundancy (R-KV, full)",
                              dict(decay=0.8, pooling=1, redundancy="full", scorer="calibrated"),
                              "score"),
    # extras, not in the presets
    "default": ("the window scorer with decay 0.8, pooling 5, no redundancy",
                dict(decay=0.8, pooling=5, redundancy="none", scorer="window"), "score"),
    "+lightning": ("decay 0.8, pooling 5, lightning redundancy",
                   dict(decay=0.8, pooling=5, redundancy="lightning", scorer="window"), "score"),
    # engine only: the pool is sized to every text at full length, so elastic mode never
    # needs room and must equal full KV (the HF reference has no pool)
    "elastic": ("--zipage-mode elastic at low load (the window scorer)",
                dict(decay=0.8, pooling=5, redundancy="none", mode="elastic", scorer="window"),
                "score"),
}
ENGINE_ONLY = {"elastic"}
SCORING = ["window", "+decay", "+redundancy", "+pooling"]
CONTROLS = ["random", "recent"]
PRESETS = {
    "subset": dict(n_texts=2, prompt_len=64, cont_len=256, budgets=[0.25], buffer=16, window=16,
                   engine_variants=["window", "+pooling"], hf_variants=SCORING + CONTROLS,
                   n_free=2, free_max_new=256),
    "cpu": dict(n_texts=4, prompt_len=64, cont_len=512, budgets=[0.25], buffer=32, window=16,
                engine_variants=SCORING + CONTROLS, hf_variants=SCORING + CONTROLS, n_free=4,
                free_max_new=384, hf_budgets=[0.125, 0.25, 0.5]),
    "full": dict(n_texts=12, prompt_len=64, cont_len=1024, budgets=[0.125, 0.25, 0.5],
                 buffer=32, window=16, engine_variants=SCORING + CONTROLS,
                 hf_variants=SCORING + CONTROLS, n_free=12, free_max_new=1536),
}


def log(msg: str) -> None:
    print(f"[fidelity {time.strftime('%H:%M:%S')}] {msg}", flush=True)


# ------------------------------------------------------------------ arguments
def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    a = p.add_argument
    a("--preset", choices=sorted(PRESETS), default="full")
    a("--n-texts", type=int)
    a("--prompt-len", type=int)
    a("--cont-len", type=int)
    a("--budgets", type=lambda s: [float(x) for x in s.split(",")], help="e.g. 0.125,0.25,0.5")
    a("--hf-budgets", type=lambda s: [float(x) for x in s.split(",")],
      help="budgets of the HF reference (default: --budgets)")
    a("--buffer", type=int)
    a("--window", type=int)
    a("--engine-variants", type=lambda s: [x for x in s.split(",") if x],
      help=f"comma list of {', '.join(VARIANTS)}; empty string: none")
    a("--hf-variants", type=lambda s: [x for x in s.split(",") if x])
    a("--n-free", type=int, help="free-running prompts (0: skip free running)")
    a("--free-max-new", type=int)
    a("--skip-engine", action="store_true")
    a("--skip-hf", action="store_true")
    a("--hf-device", default="cpu")
    a("--hf-dtype", default="float32", choices=["float32", "bfloat16"])
    a("--hf-noise-dtype", default="bfloat16",
      help="also run the HF reference in this dtype for the variants the engine runs, at the "
           "25%% budget (else every budget): the numerics yardstick of 'within noise' "
           "('none' to skip)")
    a("--hf-threads", type=int, default=None,
      help="torch threads of the HF reference (default 1 on a CPU: 2 threads on this 2-core "
           "machine ran 5x slower as soon as anything else ran)")
    a("--engine-arg", action="append", default=[], metavar="KEY=VALUE",
      help="extra sglang_zipage.Engine keyword (VALUE parsed as JSON when it can be)")
    a("--query-stats", default=None, metavar="FILE",
      help="the calibrated variants' query statistics, in the engine and the HF reference "
           "(default: the model's own, the bundled model's shipped file)")
    a("--engine-timeout-s", type=int, default=3600)
    a("--parallel", type=int, default=1,
      help="engine configurations run at once, each with its own ports and a pool sized to "
           "the work (on a 2-core CPU keep 1)")
    a("--workdir", default=None, help="part files (default /tmp/fidelity-<preset>)")
    a("--resume", action="store_true", help="reuse part files found in --workdir")
    a("--out", default=None, help="summary JSON (default: <workdir>/fidelity.json; the "
      "committed results are written only when named)")
    a("--raw-out", default=None,
      help="per-step data (default: <out>_raw.json; gzip-compressed when it ends in .gz)")
    a("--png", default=None)
    a("--record-command", default=None,
      help="the command to record in the JSON (default: this one), e.g. the script that ran "
           "the parts and then this merge")
    args = p.parse_args(argv)
    for k, v in PRESETS[args.preset].items():
        if getattr(args, k) is None:
            setattr(args, k, v)
    if args.hf_budgets is None:
        args.hf_budgets = args.budgets
    for v in args.engine_variants + args.hf_variants:
        if v not in VARIANTS:
            p.error(f"unknown variant {v!r}; known: {', '.join(VARIANTS)}")
    if ENGINE_ONLY & set(args.hf_variants):
        p.error(f"{sorted(ENGINE_ONLY)}: engine settings; drop them from --hf-variants")
    args.workdir = args.workdir or f"/tmp/fidelity-{args.preset}"
    args.out = args.out or os.path.join(args.workdir, "fidelity.json")
    args.raw_out = args.raw_out or os.path.splitext(args.out)[0] + "_raw.json"
    return args


def budget_tokens(frac: float, cont_len: int) -> int:
    return max(1, round(frac * cont_len))


def config_name(frac: Optional[float], variant: Optional[str]) -> str:
    return "full" if frac is None else f"b{frac:g}-{variant}"


# -------------------------------------------------------------------- engine
def engine_has_selection() -> bool:
    from sglang_zipage.config import ZipageConfig

    return "selection" in {f.name for f in dataclasses.fields(ZipageConfig)}


def engine_kwargs(args, frac, variant, items, free_prompts) -> Dict:
    kw = {"enable_custom_logit_processor": True,
          # the forcing processor counts its calls per request; without overlap scheduling
          # that count is len(output_ids) (forcing.py); and greedy + seed: deterministic
          "disable_overlap_schedule": True, "random_seed": 0}
    # A pool sized to the work: on a CPU it keeps memory small; on a GPU it lets several
    # engines share one device (each profiles free memory at start, so a pool that takes
    # "the rest" would leave nothing to the next one).
    need = max(len(items) * (args.prompt_len + args.cont_len),
               sum(len(f) for f in free_prompts) + len(free_prompts) * args.free_max_new)
    kw["max_total_tokens"] = int(need * 1.1) + 1024
    if frac is None:
        kw["zipage_enabled"] = False
    else:
        _, params, policy = VARIANTS[variant]
        # fixed mode (compress at budget + buffer) unless the variant says otherwise: the pool
        # holds every text at full length, so elastic mode (the default) would never compress
        kw.update({f"zipage_{k}": v for k, v in {"mode": "fixed", **params}.items()})
        kw.update(zipage_kv_budget=budget_tokens(frac, args.cont_len), zipage_buffer=args.buffer,
                  zipage_window=args.window)
        if policy != "score":
            kw["zipage_selection"] = policy
        if params.get("scorer") == "calibrated" and args.query_stats:
            kw["zipage_query_stats"] = args.query_stats
    kw.update(parse_engine_args(args.engine_arg))
    return kw


def run_engine(args, name, kw, items, free) -> Dict:
    part = os.path.join(args.workdir, f"engine_{name}.json")
    spec = {"name": name, "engine_kwargs": kw, "free_max_new": args.free_max_new,
            "items": [dict(id=it.id, prompt_ids=it.prompt_ids, ref_ids=it.ref_ids) for it in items],
            "free": [dict(id=it.id, prompt_ids=it.free_prompt_ids) for it in free]}
    spec_path = os.path.join(args.workdir, f"spec_{name}.json")
    if args.resume and os.path.exists(part):
        same = os.path.exists(spec_path) and json.load(open(spec_path)) == spec
        if same:
            log(f"engine {name}: reusing {part}")
            return json.load(open(part))
        log(f"engine {name}: {part} was made with another spec (texts, lengths or settings): rerun")
    json.dump(spec, open(spec_path, "w"))
    log(f"engine {name}: starting ({len(items)} texts x {args.cont_len} forced tokens, "
        f"{len(free)} free prompts x <= {args.free_max_new} tokens) {kw}")
    t0 = time.time()
    subprocess.run([sys.executable, os.path.join(HERE, "engine_runner.py"), spec_path, part],
                   check=True, timeout=args.engine_timeout_s)
    res = json.load(open(part))
    ok = all(r["forced_ok"] for r in res["forced"].values())
    log(f"engine {name}: done in {time.time() - t0:.0f} s (start {res['start_s']:.0f} s, forced "
        f"{res['forced_s']:.0f} s, free {res.get('free_s', 0):.0f} s); forced tokens emitted: {ok}")
    return res


# ------------------------------------------------------------------------ HF
def run_hf(args, ref, impl, name, ev, items) -> Dict:
    import torch

    part = os.path.join(args.workdir, f"{impl}_{name}.json")
    if args.resume and os.path.exists(part):
        old = json.load(open(part))
        f0 = next(iter(old["forced"].values()))
        if (old["eviction"] == (dataclasses.asdict(ev) if ev else None)
                and list(old["forced"]) == [it.id for it in items]
                and len(f0["logprob"]) == len(items[0].ref_ids)
                and old.get("prompt_len", len(items[0].prompt_ids)) == len(items[0].prompt_ids)):
            log(f"{impl} {name}: reusing {part}")
            return old
        log(f"{impl} {name}: {part} was made with other settings: rerun")
    prompts = torch.tensor([it.prompt_ids for it in items])
    refs = torch.tensor([it.ref_ids for it in items])
    t0 = time.time()
    out = ref.teacher_forced(prompts, refs, ev, progress=lambda s, c: log(
        f"{impl} {name}: step {s}/{c}, {s * len(items) / (time.time() - t0):.1f} tok/s"))
    res = {"name": name, "eviction": dataclasses.asdict(ev) if ev else None,
           "prompt_len": len(items[0].prompt_ids),
           "seconds": time.time() - t0,
           "forced": {it.id: {"logprob": out["logprob"][i], "top1": out["top1"][i],
                              "compactions_before": out["compactions_before"]}
                      for i, it in enumerate(items)}}
    json.dump(res, open(part, "w"))
    log(f"{impl} {name}: done in {res['seconds']:.0f} s")
    return res


# ------------------------------------------------------------------- summary
def summarize(args, items, runs_by_impl: Dict[str, Dict[str, Dict]], free_items) -> Dict:
    """runs_by_impl: {"engine": {...}, "hf": {...}, "hf-bfloat16": {...}}, each name -> run."""
    refs = {it.id: it.ref_ids for it in items}
    engine_runs = runs_by_impl.get("engine", {})
    rows, vs, raw = [], [], {impl: {} for impl in runs_by_impl}
    full = {impl: runs.get("full") for impl, runs in runs_by_impl.items()}
    checks = ({"engine_forced_tokens_emitted": True, "engine_steps_equal_output_len": True,
               "engine_schedule_matches_formula": True} if engine_runs else {})
    from sglang_zipage.harness.fidelity.hf_reference import schedule
    from sglang_zipage.harness.fidelity.selection import Eviction

    for impl, runs in runs_by_impl.items():
        for name, run in runs.items():
            raw[impl][name] = run["forced"]
            if impl == "engine":
                checks["engine_forced_tokens_emitted"] &= all(
                    r["forced_ok"] for r in run["forced"].values())
                checks["engine_steps_equal_output_len"] &= all(
                    r["steps_match_output_len"] for r in run["forced"].values())
            if name == "full" or full[impl] is None:
                continue
            frac, variant = run["frac"], run["variant"]
            b = budget_tokens(frac, args.cont_len)
            if impl == "engine" and variant not in ENGINE_ONLY:
                ev = Eviction(budget=b, buffer=args.buffer, window=args.window)
                want = schedule(args.cont_len, ev)
                checks["engine_schedule_matches_formula"] &= all(
                    r["compactions_before"] == want for r in run["forced"].values())
            row = {"impl": impl, "budget_frac": frac, "budget_tokens": b, "variant": variant,
                   **metrics.compare(run["forced"], full[impl]["forced"], refs)}
            if variant in ENGINE_ONLY:  # no compaction expected: every step vs full KV
                row["compactions"] = sum(r["compactions_before"][-1] for r in run["forced"].values())
                row["vs_full_kv_every_step"] = metrics.full_kv_agreement(
                    run["forced"], full[impl]["forced"])
            if impl == "engine" and run.get("free") and full["engine"].get("free"):
                row.update(metrics.free_running(run["free"], full["engine"]["free"]))
                raw["engine"][name + "/free"] = run["free"]
            rows.append(row)
    if full.get("engine") and full["engine"].get("free"):
        raw["engine"]["full/free"] = full["engine"]["free"]
    by = {(r["impl"], r["budget_frac"], r["variant"]): r for r in rows}
    noise_impl = next((i for i in runs_by_impl if i.startswith("hf-")), None)

    def diff(a, b, frac, variant):
        name = config_name(frac, variant)
        return metrics.paired_ratio_difference(
            runs_by_impl[a][name]["forced"], full[a]["forced"],
            runs_by_impl[b][name]["forced"], full[b]["forced"], refs)

    for frac in sorted({k[1] for k in by}):
        variants = [v for v in VARIANTS if ("engine", frac, v) in by and ("hf", frac, v) in by]
        noise = {}
        if noise_impl:
            for v in variants:
                if (noise_impl, frac, v) in by:
                    noise[v] = diff(noise_impl, "hf", frac, v)
        rms = ((sum(n["diff"] ** 2 for n in noise.values()) / len(noise)) ** 0.5
               if noise else None)
        for v in variants:
            d = diff("engine", "hf", frac, v)
            within = d["ci_contains_0"] or (rms is not None and abs(d["diff"]) <= 2 * rms)
            vs.append({"budget_frac": frac, "variant": v,
                       "engine_nll_ratio": by[("engine", frac, v)]["nll_ratio"],
                       "hf_nll_ratio": by[("hf", frac, v)]["nll_ratio"],
                       "engine_minus_hf": d["diff"], "ci95": d["ci95"],
                       "ci_contains_0": d["ci_contains_0"],
                       f"{noise_impl}_minus_hf": noise[v]["diff"] if v in noise else None,
                       f"{noise_impl}_minus_hf_ci95": noise[v]["ci95"] if v in noise else None,
                       "numerics_noise_rms": rms, "within_noise": within})
    out = {
        "name": "fidelity",
        "subset": not (args.preset == "full" and args.n_texts >= 10 and args.cont_len >= 1024),
        "label": (f"{args.preset} preset: {len(items)} texts x {args.cont_len} forced tokens, "
                  f"budgets {args.budgets}, engine variants {args.engine_variants}, "
                  f"HF variants {args.hf_variants}"),
        "command": args.record_command or command_line(prog=os.path.relpath(sys.argv[0], REPO)),
        "config": {k: v for k, v in vars(args).items() if k not in ("out", "raw_out", "png")},
        "versions": versions(VERSION_MODULES), "git_sha": git_commit(dirty=True),
        "device": gpu_name(cpu=f"cpu ({os.cpu_count()} cores)"),
        "engine_selection_knob": engine_has_selection(),
        "variants": {k: {"description": d, **p, "policy": pol} for k, (d, p, pol) in VARIANTS.items()},
        "texts": [{"id": it.id, "kind": it.kind, "title": it.title,
                   "prompt_tokens": len(it.prompt_ids), "continuation_tokens": len(it.ref_ids)}
                  for it in items],
        "free_prompts": [{"id": it.id, "prompt": it.free_prompt} for it in free_items],
        "results": rows,
        "engine_vs_hf": vs,
        "full_kv": {},
        "checks": checks,
        "within_noise_rule": (
            "engine - hf (pooled nll_ratio, same texts and steps): within noise when its 95% "
            "paired block-bootstrap interval contains 0, or when |engine - hf| <= 2 x "
            "numerics_noise_rms, the RMS over the variants of this budget of "
            f"({noise_impl} - hf): how far the HF reference itself moves when it runs in "
            "bf16 like the engine instead of fp32"),
        "timings_s": {**{f"engine/{k}": {x: v.get(x) for x in ("start_s", "forced_s", "free_s", "total_s")}
                         for k, v in engine_runs.items()},
                      **{f"{impl}/{k}": v["seconds"] for impl, runs in runs_by_impl.items()
                         if impl != "engine" for k, v in runs.items()}},
        "zipage_counters": {k: v.get("zipage_after_forced") for k, v in engine_runs.items()},
        "metrics_doc": metrics.__doc__.strip(),
    }
    for impl in runs_by_impl:
        if impl != "hf" and full.get(impl) and full.get("hf"):
            out["full_kv"][f"{impl}_vs_hf"] = metrics.full_kv_agreement(full[impl]["forced"],
                                                                      full["hf"]["forced"])
    out["goals_at_25pct"] = goals(rows, vs, runs_by_impl, full, refs)
    return out, raw


def goals(rows, vs, runs_by_impl, full, refs) -> Dict:
    g = {}
    at = [r for r in rows if abs(r["budget_frac"] - 0.25) < 1e-9]
    if not at:
        return {"note": "no 25% budget in this run"}
    near = [v for v in vs if abs(v["budget_frac"] - 0.25) < 1e-9]
    g["engine_within_noise_of_hf"] = {v["variant"]: v["within_noise"] for v in near}
    for impl in ("engine", "hf"):
        runs = runs_by_impl.get(impl, {})
        mine = {r["variant"]: r for r in at if r["impl"] == impl}
        scoring = [v for v in SCORING if v in mine]
        if not scoring:
            continue
        best = min(scoring, key=lambda v: mine[v]["nll_ratio"])
        res = {"best_variant": best, "best_nll_ratio": mine[best]["nll_ratio"]}
        for c in CONTROLS:
            if c in mine:
                d = metrics.paired_ratio_difference(
                    runs[config_name(0.25, best)]["forced"], full[impl]["forced"],
                    runs[config_name(0.25, c)]["forced"], full[impl]["forced"], refs)
                res[f"vs_{c}"] = {"control_nll_ratio": mine[c]["nll_ratio"],
                                  "best_minus_control": d["diff"], "ci95": d["ci95"],
                                  "clearly_better": (d["ci95"][1] < 0) if d["ci95"] else None}
            elif impl == "engine" and c in {r["variant"] for r in at}:
                res[f"vs_{c}"] = "not run in the engine (needs the zipage_selection knob)"
        if "window" in mine and mine["window"]["nll_ratio"] > 1:
            gap_w, gap_b = mine["window"]["nll_ratio"] - 1, mine[best]["nll_ratio"] - 1
            res["gap_best_over_gap_window"] = gap_b / gap_w
            res["stretch_gap_halved"] = gap_b <= 0.5 * gap_w
        g[impl] = res
    return g


def print_table(summary: Dict) -> None:
    log("impl    budget  variant       nll_ratio [95% CI]         top1_agree  len_infl  rep")
    for r in sorted(summary["results"], key=lambda r: (r["budget_frac"], r["variant"], r["impl"])):
        ci = r["nll_ratio_ci95"]
        ci = f"[{ci[0]:.4f}, {ci[1]:.4f}]" if ci else "[n/a]"
        li = r.get("length_inflation")
        li = "n/a" if li is None else f"{li:.3f}"
        rep = r.get("repetition_rate")
        rep = "n/a" if rep is None else f"{rep:.3f}"
        if r["nll_ratio"] is None:  # nothing compacted (elastic at low load)
            every = r.get("vs_full_kv_every_step") or {}
            log(f"{r['impl']:7s} {r['budget_frac']:6.3f}  {r['variant']:12s}  no compaction; "
                f"every step vs full KV: {json.dumps(every)}")
            continue
        log(f"{r['impl']:7s} {r['budget_frac']:6.3f}  {r['variant']:12s}  {r['nll_ratio']:.4f} {ci:22s} "
            f"{r['top1_agreement']:.4f}      {li:8s}  {rep}")
    for v in summary["engine_vs_hf"]:
        ci = v["ci95"]
        ci = f"[{ci[0]:+.4f}, {ci[1]:+.4f}]" if ci else "[n/a]"
        log(f"engine - hf at {v['budget_frac']:g} {v['variant']}: {v['engine_minus_hf']:+.4f} "
            f"CI {ci}; numerics noise rms {v['numerics_noise_rms']}; "
            f"within noise: {v['within_noise']}")
    log(f"goals at 25%: {json.dumps(summary['goals_at_25pct'])}")
    log(f"checks: {summary['checks']}")


# ---------------------------------------------------------------------- main
def main(argv=None):
    args = parse_args(argv)
    os.makedirs(args.workdir, exist_ok=True)
    from transformers import AutoTokenizer
    from sglang_zipage.model import bundled_model_path
    from sglang_zipage.harness.fidelity.texts import load_items

    model_path = bundled_model_path()
    tok = AutoTokenizer.from_pretrained(model_path)
    items = load_items(tok, args.n_texts, args.prompt_len, args.cont_len)
    free_items = items[:args.n_free] if args.n_free else []
    log(f"{len(items)} texts x ({args.prompt_len} prompt + {args.cont_len} forced) tokens; "
        f"budgets {[budget_tokens(f, args.cont_len) for f in args.budgets]} tokens, buffer "
        f"{args.buffer}, window {args.window}; workdir {args.workdir}")

    engine_runs: Dict[str, Dict] = {}
    if not args.skip_engine:
        has_sel = engine_has_selection()
        plan = [(None, None)] + [(f, v) for f in args.budgets for v in args.engine_variants]
        jobs = []
        for frac, variant in plan:
            if variant is not None and VARIANTS[variant][2] != "score" and not has_sel:
                log(f"engine {config_name(frac, variant)}: skipped (ZipageConfig has no "
                    f"'selection' knob yet; the HF reference runs this control)")
                continue
            kw = engine_kwargs(args, frac, variant, items, [f.free_prompt_ids for f in free_items])
            if args.parallel > 1:  # several small engines share the device: own ports
                kw.setdefault("port", 31000 + 20 * len(jobs))
                kw.setdefault("nccl_port", 31000 + 20 * len(jobs) + 7)
            jobs.append((frac, variant, kw))

        def one(job):
            frac, variant, kw = job
            run = run_engine(args, config_name(frac, variant), kw, items, free_items)
            run.update(frac=frac, variant=variant)
            return config_name(frac, variant), run

        from concurrent.futures import ThreadPoolExecutor

        with ThreadPoolExecutor(max(1, args.parallel)) as pool:
            for name, run in pool.map(one, jobs):
                engine_runs[name] = run

    runs_by_impl = {"engine": engine_runs} if engine_runs else {}
    if not args.skip_hf:
        import torch
        from sglang_zipage.harness.fidelity.hf_reference import HFReference
        from sglang_zipage.calibrate import stats_file
        from sglang_zipage.harness.fidelity.selection import Eviction
        from sglang_zipage.query_stats import QueryStats

        if args.hf_threads or args.hf_device == "cpu":
            torch.set_num_threads(args.hf_threads or 1)
        passes = [("hf", args.hf_dtype, args.hf_variants)]
        if args.hf_noise_dtype not in ("", "none", args.hf_dtype):
            # the numerics yardstick: the variants the engine ran, reference in another dtype
            passes.append((f"hf-{args.hf_noise_dtype}", args.hf_noise_dtype,
                           [v for v in args.hf_variants if v in args.engine_variants]))
        noise_budgets = [f for f in args.budgets if abs(f - 0.25) < 1e-9] or args.budgets
        for impl, dtype, variants in passes:
            ref = HFReference(model_path, dtype=getattr(torch, dtype), device=args.hf_device)
            ref.query_stats = QueryStats.load(str(stats_file(args.query_stats, model_path)))
            runs_by_impl[impl] = {}
            budgets = args.hf_budgets if impl == "hf" else noise_budgets
            plan = [(None, None)] + [(f, v) for f in budgets for v in variants]
            for frac, variant in plan:
                name = config_name(frac, variant)
                ev = None
                if frac is not None:
                    _, params, policy = VARIANTS[variant]
                    ev = Eviction(budget=budget_tokens(frac, args.cont_len), buffer=args.buffer,
                                  window=args.window, policy=policy, **params)
                run = run_hf(args, ref, impl, name, ev, items)
                run.update(frac=frac, variant=variant)
                runs_by_impl[impl][name] = run
            del ref

    summary, raw = summarize(args, items, runs_by_impl, free_items)
    summary["raw_file"] = os.path.relpath(args.raw_out, REPO) if args.raw_out.startswith(REPO) else args.raw_out
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(summary, f, indent=1, default=str)
    opener = gzip.open if args.raw_out.endswith(".gz") else open
    with opener(args.raw_out, "wt") as f:
        json.dump(_round(raw), f, separators=(",", ":"))
    print_table(summary)
    log(f"wrote {args.out} and {args.raw_out}")
    if args.png:
        # benchmarks/fidelity/plot_fidelity.py, in its own process (it needs matplotlib)
        subprocess.run([sys.executable, os.path.join(HERE, "plot_fidelity.py"), args.out, args.png],
                       check=True)
        log(f"wrote {args.png}")


def _round(x):
    if isinstance(x, float):
        return round(x, 5)
    if isinstance(x, dict):
        return {k: _round(v) for k, v in x.items()}
    if isinstance(x, list):
        return [_round(v) for v in x]
    return x


if __name__ == "__main__":
    main()
