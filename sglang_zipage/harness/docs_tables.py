"""The throughput tables of the docs, printed from the committed result files.

``steady_pairs`` reads every merged steady-state file (``benchmarks/results/steady-*.json``
with ``merged_from``: both engines side by side) into one flat record per pair;
``first_wave_pairs`` reads the first-wave rows of ``throughput-h200.json``. The table
builders turn those records into markdown; ``benchmarks/make_docs.py`` puts them into the
pages, and ``tests/unit/test_docs.py`` fails when a page differs from what they print now.
Plain Python over JSON: no torch, no sglang.
"""

from __future__ import annotations

import glob
import json
import os
import re
import shlex
from typing import Dict, List, Optional, Sequence

from sglang_zipage.harness.rows import throughput_row

RESULTS = "benchmarks/results"


# ---------------------------------------------------------------- markdown helpers
def md_table(header: Sequence[str], rows: Sequence[Sequence]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join("-" if c is None else str(c) for c in r) + " |" for r in rows]
    return "\n".join(lines)


def num(x, digits: int = 0) -> str:
    """A number with thousands separators, or "-" where the file has none."""
    return "-" if x is None else f"{x:,.{digits}f}"


def pair(a, b, digits: int = 0) -> str:
    return f"{num(a, digits)} / {num(b, digits)}"


def ratio(x, digits: int = 2) -> str:
    return "-" if x is None else f"**{x:.{digits}f}x**"


def link(name: str, prefix: str) -> str:
    """A link to a result file, relative to the page (``prefix`` leads from it to the repo)."""
    return f"[{name}]({prefix}{RESULTS}/{name})"


def load_json(root: str, name: str) -> Dict:
    with open(os.path.join(root, RESULTS, name)) as f:
        return json.load(f)


def short_commit(sha: Optional[str]) -> str:
    return (sha or "?")[:7]


def commits(a: Optional[str], b: Optional[str]) -> str:
    a, b = short_commit(a), short_commit(b)
    return a if a == b else f"{a} / {b}"


def card(name: str, *gpus: Optional[str]) -> str:
    """H200 / H100 / CPU: the recorded GPU name, else the file name's suffix."""
    for g in gpus:
        m = re.search(r"\b([A-Z]{1,2}\d{2,3}[A-Z]?)\b", g or "")
        if m:
            return m.group(1)
    for tag, what in (("-h200", "H200"), ("-h100", "H100"), ("-cpu", "CPU")):
        if tag in name:
            return what
    return "?"


def last_flag(command: str, flag: str) -> Optional[str]:
    """The value of the last ``flag`` in a command line (argparse keeps the last)."""
    words = shlex.split(command or "")
    hits = [i for i, w in enumerate(words[:-1]) if w == flag]
    return words[hits[-1] + 1] if hits else None


def tokens(n: int) -> str:
    return f"{n // 1024}k" if n % 1024 == 0 else str(n)


# ---------------------------------------------------------------- steady-state pairs
def zipage_flags(command: str) -> str:
    """The zipage flags of a server command that differ from the launcher's defaults."""
    out = []
    budget, buffer = last_flag(command, "--zipage-kv-budget"), last_flag(command, "--zipage-buffer")
    if (budget, buffer) != ("2048", "256"):
        out.append(f"budget {budget} + {buffer}")
    if "--zipage-compress-prompt" in shlex.split(command or ""):
        out.append("`--zipage-compress-prompt`")
    floor = last_flag(command, "--zipage-min-kv-budget")
    if floor:
        out.append(f"`--zipage-min-kv-budget {floor}`")
    return ", ".join(out) or "defaults"


def steady_pairs(root: str = ".") -> List[Dict]:
    """One record per merged steady-state file, in file-name order."""
    out = []
    for path in sorted(glob.glob(os.path.join(root, RESULTS, "steady-*.json"))):
        with open(path) as f:
            merged = json.load(f)
        if "merged_from" not in merged or merged.get("output_tok_s_ratio") is None:
            continue  # a single run, or a failed attempt kept as evidence (no ratio)
        name = os.path.basename(path)
        row = throughput_row(merged, name)
        s, z = row["stock"], row["zipage"]
        load = merged["engines"]["stock"]["load"]
        spread = load.get("range_ratio", 1.0)
        low = int(load["output_len"] * spread)
        z_window = merged["engines"]["zipage"]["window"]
        out.append(dict(
            name=name,
            load=(f"Poisson {load['request_rate']:g}/s, {load['input_len']} -> "
                  + (f"{tokens(low)}-{tokens(load['output_len'])}" if spread < 1
                     else tokens(load["output_len"]))),
            output_len=load["output_len"], flags=zipage_flags(z["server_command"]),
            span=row["span"], window=f"{z['window_start_s']:.0f}-{z['window_end_s']:.0f} s",
            backend=row["attention_backend"], stock_tok_s=row["stock_output_tok_s"],
            zipage_tok_s=row["zipage_output_tok_s"], ratio=row["ratio"],
            tpot_p50=(s["bench_serving"].get("median_tpot_ms"),
                      z["bench_serving"].get("median_tpot_ms")),
            tpot_p99=(s["bench_serving"].get("p99_tpot_ms"), z["bench_serving"].get("p99_tpot_ms")),
            retractions=(s["retractions_per_min"], z["retractions_per_min"]),
            running=(s["mean_running_reqs"], z["mean_running_reqs"]),
            squeezes=(z_window.get("zipage") or {}).get("squeezed_compactions"),
            other_spans=[f"{a:g}-{b:g} s: {r:.2f}x" for (a, b), r in
                         ((x["span_s"], x["ratio"]) for x in merged.get("spans") or [])
                         if r != row["ratio"]],
            card=card(name, merged.get("gpu"), merged["engines"]["zipage"].get("gpu")),
            commits=commits(s["commit"], z["commit"]),
            date=(merged["engines"]["zipage"].get("started") or "")[:10],
            same_session=merged.get("same_session")))
    return out


# What a reader must know to read a row (its file's "caveat" has the whole story).
NOTES = {
    "steady-16k-h200.json": "one output length: the window is the tail of stock's first wave",
    "steady-8k-h200.json": "one output length: both engines run in waves",
    "steady-8k-r05-prompt-min1024-h200.json": "the first budget-range rule (booked at the budget)",
    "steady-8k-r05-warm-prompt-min1024-h200.json":
        "zipage past its 512 decode graphs ran eagerly; rerun with graphs: the -graphs row",
    "steady-16k-r05-warm-prompt-min1024-h200.json": "before A1c's cycle booking; the -a1c row "
                                                    "replaces it",
    "steady-8k-r05-warm-prompt-min1024-spec-pair-h100.json":
        "speculative decoding on both (STANDALONE, a 2-layer dummy draft: accept length 1.0 on "
        "both), `--max-running-requests 512 --cuda-graph-max-bs-decode 192` on both",
    "steady-pair-cpu-tiny.json": "2-layer tiny model on a 2-core CPU (a step costs per request)",
    "steady-pair-cpu-tiny-min32.json": "2-layer tiny model on a 2-core CPU (a step costs per "
                                       "request)",
    "steady-pd-cpu-tiny.json": "PD pair (decode server measured), tiny model and pool on a "
                               "2-core CPU: stock's 512 tokens reserved per request bind",
}


def same_gpu(same_session: Optional[bool]) -> str:
    return {True: "yes", False: "**no**: zipage from a later session"}.get(same_session, "?")


def steady_table(records: Sequence[Dict], prefix: str) -> str:
    header = ("load (prompt -> output tokens)", "zipage flags", "span, window", "backend",
              "stock tok/s", "zipage tok/s", "ratio", "other spans", "TPOT p50 ms (stock / zipage)",
              "TPOT p99 ms", "retractions/min", "running (mean)", "squeezes in window",
              "card", "commit(s)", "date", "back to back on one GPU", "note", "evidence")
    rows = [(r["load"], r["flags"], f"{r['span']}, {r['window']}", r["backend"],
             num(r["stock_tok_s"]), num(r["zipage_tok_s"]), ratio(r["ratio"]),
             "; ".join(r["other_spans"]) or "-", pair(*r["tpot_p50"], 1), pair(*r["tpot_p99"], 1),
             pair(*r["retractions"], 1), pair(*r["running"]), num(r["squeezes"]), r["card"],
             r["commits"], r["date"], same_gpu(r["same_session"]), NOTES.get(r["name"], ""),
             link(r["name"], prefix)) for r in records]
    return md_table(header, rows)


# ---------------------------------------------------------------- first-wave rows
def first_wave_pairs(root: str = ".") -> List[Dict]:
    """The first-wave rows of throughput-h200.json (all requests submitted at t=0)."""
    res = load_json(root, "throughput-h200.json")
    out = []
    for row in res["loads"]:
        if row.get("regime") == "steady-state":
            continue
        spec, s, z = row["spec"], row["stock"], row["zipage"]
        until = (f"window {s['window_start_s']:.0f}-{s['window_end_s']:.0f} s"
                 if spec["until"] == "window" else "to completion")
        parallel = "--parallel" in s["command"].split()
        out.append(dict(
            label=row["load"],
            load=(f"{spec['num_requests']} x {spec['input_len']} -> {tokens(spec['output_len'])}"
                  + (f", shared {spec['shared_prefix_len']}-token prefix"
                     if spec["shared_prefix_len"] else "")),
            until=until, kv=row["kv_cache_dtype"], mode=row.get("zipage_mode"),
            stock_tok_s=row["stock_output_tok_s"], zipage_tok_s=row["zipage_output_tok_s"],
            ratio=row["ratio"], tpot_p50=(s.get("p50_tpot_ms"), z.get("p50_tpot_ms")),
            tpot_p99=(s.get("p99_tpot_ms"), z.get("p99_tpot_ms")),
            retractions=(s.get("window_retractions"), z.get("window_retractions")),
            running=(s.get("mean_running_reqs"), z.get("mean_running_reqs")),
            compaction_share=row.get("compaction_share"), card=card("-h200", res.get("gpu")),
            commits=commits(s["commit"], z["commit"]), parallel=parallel))
    return out


def pairing(parallel: bool) -> str:
    return ("**no**: at the same time on two H200s of one host (`--parallel`)" if parallel
            else "**no**: one engine per device call")


def first_wave_table(records: Sequence[Dict], prefix: str) -> str:
    header = ("load (requests x prompt -> output)", "measured", "KV dtype", "zipage mode",
              "stock tok/s", "zipage tok/s", "ratio", "TPOT p50 ms (stock / zipage)",
              "TPOT p99 ms", "retractions", "running (mean)", "compaction GPU share",
              "card", "commit(s)", "back to back on one GPU", "evidence")
    rows = [(r["load"], r["until"], r["kv"], r["mode"], num(r["stock_tok_s"]),
             num(r["zipage_tok_s"]), ratio(r["ratio"]), pair(*r["tpot_p50"], 1),
             pair(*r["tpot_p99"], 1), pair(*r["retractions"]), pair(*r["running"]),
             f"{100 * r['compaction_share']:.2f}%" if r["compaction_share"] else "0",
             r["card"], r["commits"], pairing(r["parallel"]),
             link("throughput-h200.json", prefix)) for r in records]
    return md_table(header, rows)


# ---------------------------------------------------------------- the README's rows
# (kind, key): "steady" rows by file name, "first-wave" rows by load label and KV dtype.
# Same-session pairs first; the others say why they are not.
README_ROWS = (
    ("steady", "steady-8k-r05-warm-prompt-min1024-pair-h100.json"),
    ("steady", "steady-16k-r05-warm-h200.json"),
    ("steady", "steady-8k-r05-long-run-h200.json"),
    ("steady", "steady-16k-r05-warm-prompt-min1024-a1c-h200.json"),
    ("first-wave", ("steady", "auto")),
    ("first-wave", ("short", "auto")),
)


def readme_table(root: str = ".", prefix: str = "") -> str:
    steady = {r["name"]: r for r in steady_pairs(root)}
    first = {(r["label"], r["kv"]): r for r in first_wave_pairs(root)}
    rows = []
    for kind, key in README_ROWS:
        if kind == "steady":
            r = steady[key]
            what = f"{r['load']}, {r['span']}"
            same, evidence = same_gpu(r["same_session"]), link(key, prefix)
            retracted = pair(*r["retractions"], 1) + " a min"
        else:
            r = first[key]
            what = f"{r['load']}, all at t=0, {r['until']}"
            same, evidence = pairing(r["parallel"]), link("throughput-h200.json", prefix)
            retracted = pair(*r["retractions"]) + (" in the window" if "window" in r["until"]
                                                   else " in the run")
        flags = r.get("flags") or ("defaults" if r.get("mode") == "elastic" else
                                   f"`--zipage-mode {r.get('mode')}`")
        rows.append((what, flags, num(r["stock_tok_s"]), num(r["zipage_tok_s"]),
                     ratio(r["ratio"]), pair(*r["tpot_p50"], 1), pair(*r["tpot_p99"], 1),
                     retracted, f"{r['card']}, {r['commits']}", same, evidence))
    header = ("load", "zipage flags", "stock tok/s", "zipage tok/s", "ratio",
              "TPOT p50 ms (stock / zipage)", "TPOT p99 ms", "retractions", "card, commit(s)",
              "both engines back to back on one GPU", "evidence")
    return md_table(header, rows)


# ---------------------------------------------------------------- elastic mode
def elastic_table(root: str = ".", prefix: str = "") -> str:
    res = load_json(root, "elastic-h200.json")
    rows = []
    for row in res["loads"]:
        z = row["zipage"]
        vs_fixed = row.get("vs_fixed_mode")
        if isinstance(vs_fixed, dict):
            vs_fixed = vs_fixed.get("ratio")
        rows.append((row["load"], row["zipage_mode"], num(row.get("stock_output_tok_s")),
                     num(row["zipage_output_tok_s"]), ratio(row.get("ratio"), 3), ratio(vs_fixed, 3),
                     num(z.get("p50_tpot_ms"), 1), short_commit(z.get("commit"))))
    header = ("load (bench_throughput label)", "zipage mode", "stock tok/s", "zipage tok/s",
              "vs stock", "vs fixed mode", "zipage TPOT p50 ms", "zipage commit")
    return md_table(header, rows) + f"\n\nEvidence: {link('elastic-h200.json', prefix)} (H200)."
