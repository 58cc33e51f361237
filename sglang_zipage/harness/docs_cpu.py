"""The docs' CPU evidence tables, printed from the committed result files: admission, the
CPU fidelity runs (squeeze, own prompt), the loop guard, the soaks and CI time. Each builder
reads one file (or one family of files) under ``benchmarks/results/`` and returns markdown;
``benchmarks/make_docs.py`` puts it into a page. Plain Python over JSON: no torch, no sglang.
"""

from __future__ import annotations

import glob
import os
from collections import OrderedDict
from typing import Dict, List

from sglang_zipage.harness.docs_tables import RESULTS, link, load_json, md_table, num, short_commit


def admission_table(root: str = ".", prefix: str = "") -> str:
    """Running requests, pool use and retractions under each admission rule, tiny model."""
    rows = []
    for load, runs in load_json(root, "admission-cpu.json")["loads"].items():
        for rule, r in runs.items():
            rows.append((f"{load}, outputs 50-200" if load == "staggered" else
                         f"{load}, outputs 200", rule, num(r["mean_running_reqs"], 1),
                         f"{100 * r['mean_pool_use']:.1f}%", num(r["retractions_per_min"], 1),
                         short_commit(r["commit"]), link("admission-cpu.json", prefix)))
    for rule, r in load_json(root, "admission-cycle-cpu.json")["runs"].items():
        rows.append(("outputs 200-800", rule, num(r["mean_running_reqs"], 1),
                     f"{100 * r['mean_pool_use']:.1f}%", num(r["retractions_per_min"], 1),
                     short_commit(r["commit"]), link("admission-cycle-cpu.json", prefix)))
    return md_table(("load", "rule", "running (mean)", "pool use", "retractions/min", "commit",
                     "evidence"), rows)


def _nll(m: Dict) -> str:
    lo, hi = m["nll_ratio_ci95"]
    return f"{m['nll_ratio']:.3f} [{lo:.3f}, {hi:.3f}]"


def fidelity_cpu_table(root: str = ".", prefix: str = "") -> str:
    """The squeeze and own-prompt runs (HF reference, the bundled SmolLM2, CPU)."""
    rows = []
    for name in ("fidelity-squeeze-cpu.json", "fidelity-squeeze-calibrated-cpu.json",
                 "fidelity-squeeze-1024-cpu.json", "fidelity-squeeze-2048-cpu.json",
                 "fidelity-own-prompt-cpu.json"):
        res = load_json(root, name)
        st = res["settings"]
        scored = "from_squeeze" if "squeeze" in name else "common"
        for row, r in res["rows"].items():
            e = r["eviction"]
            what = f"budget {e['budget']} + {e['buffer']}, {e.get('scorer', 'window')}" + (
                f", squeezed to {e['squeeze_to']} at step {e['squeeze_at']}"
                if e.get("squeeze_to") else "") + (", prompt compressed"
                                                   if e.get("own_prompt") else "")
            rows.append((link(name, prefix), f"{st['n_texts']} x {st['cont_len']}", row, what,
                         _nll(r[scored]), f"{r[scored]['top1_agreement']:.3f}",
                         short_commit(res["commit"])))
    return md_table(("file", "texts x tokens", "row", "eviction", "NLL ratio [95% CI]",
                     "top-1 agreement", "commit"), rows)


def self_forced_table(root: str = ".", prefix: str = "") -> str:
    """Both scorers teacher-forced through the model's own greedy text (self_forced.py)."""
    name = "fidelity-self-forced-cpu.json"
    res = load_json(root, name)
    st = res["settings"]
    rows = []
    for row, r in res["rows"].items():
        d = r.get("minus_window")
        rows.append((row.split("-", 1)[1], f"{r['eviction']['budget']} + {r['eviction']['buffer']}",
                     _nll(r), f"{r['top1_agreement']:.3f}",
                     f"{d['diff']:+.3f} [{d['ci95'][0]:+.3f}, {d['ci95'][1]:+.3f}]" if d else "-"))
    return (md_table(("scorer", "budget + buffer", "NLL ratio [95% CI]", "top-1 agreement",
                      "minus window [95% CI]"), rows)
            + f"\n\n{st['n_texts']} of the fidelity texts' openings ({st['prompt_len']} tokens) "
            f"continued greedily by the bundled SmolLM2 with full KV for {st['cont_len']} "
            f"tokens, teacher-forced through the HF reference on a CPU, commit "
            f"{short_commit(res['commit'])}: {link(name, prefix)}.")


LOOP_GUARD_RUNS = (("loop-guard-cpu.json", "window"),
                   ("loop-guard-calibrated-cpu.json", "calibrated"))


def loop_guard_table(root: str = ".", prefix: str = "") -> str:
    """The loop guard's CPU runs, one per scorer (the calibrated one since it is the default)."""
    rows, links = [], []
    for name, scorer in LOOP_GUARD_RUNS:
        res = load_json(root, name)
        for config, cfg in res["configs"].items():
            s, gens = cfg["summary"], cfg["generations"]
            stopped = [g["tokens"] for g in gens if g["stopped"]]
            rows.append((config, "-" if config == "full" else scorer, s["generations"],
                         s["looping"], s["stopped_on_their_own"], num(s["mean_tokens"]),
                         num(sum(stopped) / len(stopped)) if stopped else "-",
                         s["guard_triggers"]))
        links.append(f"{link(name, prefix)} (commit {short_commit(res['commit'])})")
    st = res["settings"]
    header = ("configuration", "scorer", "generations", "looping", "stopped on their own",
              "mean tokens", "mean tokens of those that stopped", "guard triggers")
    return (md_table(header, rows) + f"\n\nThe bundled SmolLM2 on a CPU, up to {st['tokens']} "
            f"tokens, temperature {st['temperature']}, top-p {st['top_p']}: "
            + ", ".join(links) + ".")


def ci_time_table(root: str = ".", prefix: str = "") -> str:
    res = load_json(root, "ci-time-cpu.json")
    rows = [(r["run"], short_commit(r["commit"]), r["passed"], r["skipped"],
             f"{r['pytest_s'] / 60:.1f}", f"{r['wall_s_setup_included'] / 60:.1f}", r["note"] or "")
            for r in res["runs"]]
    walls = [r["wall_s_setup_included"] / 60 for r in res["runs"]]
    return (md_table(("run", "commit", "passed", "skipped", "pytest min", "wall min, setup included",
                      "note"), rows)
            + f"\n\nWall time {min(walls):.1f}-{max(walls):.1f} minutes over these runs; the last "
            f"ran at {short_commit(res['runs'][-1]['commit'])}, so the suite has grown since: "
            f"{link('ci-time-cpu.json', prefix)}.")


def soak_table(root: str = ".", prefix: str = "") -> str:
    """Every soak file: runs, requests, errors, leaked slots (0 and 0 is a pass)."""
    rows = []
    for path in sorted(glob.glob(os.path.join(root, RESULTS, "soak-*.json"))):
        name = os.path.basename(path)
        res = load_json(root, name)
        groups: Dict[str, List[Dict]] = OrderedDict()
        for run in res.get("runs") or [res]:
            groups.setdefault(run.get("config") or run.get("code") or "", []).append(run)
        for label, runs in groups.items():
            done = [r for r in runs if r.get("errors") is not None]
            rows.append((link(name, prefix), label.split(" (")[0] or "-", len(runs),
                         num(sum(r["requests"] for r in done)) if done else "-",
                         sum(r["errors"] for r in done), sum(r["leaked_slots"] for r in done),
                         len(runs) - len(done),
                         ", ".join(sorted({short_commit(r.get("commit") or res.get("commit"))
                                           for r in runs if r.get("commit") or res.get("commit")}))
                         or "-"))
    return md_table(("file", "which runs", "runs", "requests", "errors", "leaked slots",
                     "runs that killed the server", "commit"), rows)


SWEEP = ("fidelity-sweep-cpu.json", "fidelity-sweep-lower-cpu.json")


def smallest_matching_budget(results: List[Dict]) -> Dict:
    """The smallest budget fraction at which the calibrated scorer's NLL ratio (engine) is at
    most the window scorer's at 25%, from one sweep's rows; None where none is."""
    window = next(r for r in results if r["variant"] == "window" and r["budget_frac"] == 0.25)
    ok = sorted((r for r in results if r["variant"] == "calibrated"
                 and r["nll_ratio"] <= window["nll_ratio"]), key=lambda r: r["budget_frac"])
    return {"window": window, "calibrated": ok[0] if ok else None}


def budget_sweep_table(root: str = ".", prefix: str = "") -> str:
    """The calibrated scorer below 25% against the window scorer at 25% (engine, one CPU
    session, the full-KV run shared through run_fidelity.py --resume)."""
    runs = [load_json(root, name) for name in SWEEP]
    engine = sorted(((name, r) for name, res in zip(SWEEP, runs) for r in res["results"]
                     if r["impl"] == "engine"),
                    key=lambda nr: (nr[1]["variant"], nr[1]["budget_frac"]))
    rows = [(f"{100 * r['budget_frac']:g}% ({r['budget_tokens']})", r["variant"], _nll(r),
             f"{r['top1_agreement']:.3f}", link(name, prefix)) for name, r in engine]
    best = smallest_matching_budget([r for _, r in engine])
    cfg, cal = runs[0]["config"], best["calibrated"]
    found = (f"the smallest calibrated budget at or below the window scorer's ratio at 25% "
             f"({best['window']['nll_ratio']:.4f}) is {100 * cal['budget_frac']:g}% "
             f"({cal['nll_ratio']:.4f}): a 2048-token window budget's fidelity at "
             f"{round(2048 * cal['budget_frac'] / 0.25)} tokens" if cal else
             "no calibrated budget below 25% reaches the window scorer's ratio at 25%")
    return (md_table(("budget", "scorer", "engine NLL ratio [95% CI]", "top-1 agreement",
                      "file"), rows)
            + f"\n\n{cfg['n_texts']} texts x {cfg['cont_len']} teacher-forced tokens, the engine "
            f"on {runs[0]['device']}, commit "
            f"{', '.join(sorted({short_commit(r['git_sha']) for r in runs}))}; {found}.")
