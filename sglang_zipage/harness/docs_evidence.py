"""The docs' GPU evidence tables beside throughput, printed from the committed result files:
fidelity, kernels, model coverage, hot-path configurations, one decode step, and the sizing
arithmetic. Each builder reads one file under ``benchmarks/results/`` and returns markdown;
``benchmarks/make_docs.py`` puts it into a page (docs_cpu.py has the CPU runs'). Plain
Python over JSON: no torch, no sglang.
"""

from __future__ import annotations

import glob
import os
from collections import OrderedDict
from typing import Dict, List

from sglang_zipage.harness.docs_tables import RESULTS, link, load_json, md_table, num, short_commit

FIDELITY_VARIANTS = ("window", "+decay", "+redundancy", "+pooling", "random", "recent")


def fidelity_table(root: str = ".", prefix: str = "") -> str:
    """NLL ratio (compressed / full KV) of the integrated engine, budget x variant."""
    res = load_json(root, "fidelity.json")
    cells = {(r["budget_frac"], r["variant"]): r for r in res["results"] if r["impl"] == "engine"}
    rows = []
    for frac in sorted({f for f, _ in cells}):
        tokens = next(r["budget_tokens"] for (f, _), r in cells.items() if f == frac)
        rows.append([f"{100 * frac:g}% ({tokens} tokens)"]
                    + [f"{cells[frac, v]['nll_ratio']:.4f}" if (frac, v) in cells else "-"
                       for v in FIDELITY_VARIANTS])
    header = ("budget", "window attention", "+ decay", "+ redundancy", "+ pooling",
              "random (control)", "recent only (control)")
    cfg = res["config"]
    return (md_table(header, rows) + f"\n\n{cfg['n_texts']} texts x {cfg['cont_len']} "
            f"teacher-forced tokens, {res['device']}, commit {short_commit(res['git_sha'])}: "
            f"{link('fidelity.json', prefix)}.")


CALIBRATED_VARIANTS = ("window", "+redundancy", "calibrated", "calibrated+redundancy", "recent")


def _ci(r) -> str:
    lo, hi = r["nll_ratio_ci95"]
    return f"{r['nll_ratio']:.4f} [{lo:.4f}, {hi:.4f}]"


def calibrated_table(root: str = ".", prefix: str = "") -> str:
    """The calibrated scorer beside the window scorer: NLL ratio of the engine and the HF
    reference per budget with each row's paired difference to the window scorer, the earlier
    K = 64 run, the statistics measured on code only, and a compaction's cost."""
    name = "fidelity-calibrated-k16-h200.json"
    res = load_json(root, name)
    cells = {(r["impl"], r["budget_frac"], r["variant"]): r for r in res["results"]}
    noise = {(e["budget_frac"], e["variant"]): e["within_noise"] for e in res["engine_vs_hf"]}

    def diff(r):
        d = r.get("minus_window") if r else None
        if not d:
            return "-"
        return f"{d['diff']:+.4f} [{d['ci95'][0]:+.4f}, {d['ci95'][1]:+.4f}]"

    rows = []
    for frac in sorted({f for _, f, _ in cells}):
        tokens = next(r["budget_tokens"] for (_, f, _), r in cells.items() if f == frac)
        for v in CALIBRATED_VARIANTS:
            e, h = cells.get(("engine", frac, v)), cells.get(("hf", frac, v))
            rows.append([f"{100 * frac:g}% ({tokens})", v, _ci(e) if e else "-",
                         diff(e), _ci(h) if h else "-", "yes" if noise.get((frac, v)) else "no"])
    cfg = res["config"]
    out = (md_table(("budget", "scorer", "engine NLL ratio [95% CI]",
                     "engine minus window [95% CI]", "HF reference", "engine = HF within noise"),
                    rows)
           + f"\n\n{cfg['n_texts']} texts x {cfg['cont_len']} teacher-forced tokens, K = 16, "
           f"{res['device']}, commit {short_commit(res['git_sha'])}: {link(name, prefix)}.")
    k64 = load_json(root, "fidelity-calibrated-h100.json")
    eng = {r["budget_frac"]: r for r in k64["results"]
           if r["impl"] == "engine" and r["variant"] == "calibrated"}
    out += ("\n\nWith K = 64 (an earlier run, " + k64["device"] + ", commit "
            + short_commit(k64["git_sha"]) + "), the engine's calibrated rows: "
            + ", ".join(f"{100 * f:g}% {_ci(eng[f])}" for f in sorted(eng))
            + f": {link('fidelity-calibrated-h100.json', prefix)}.")
    code = load_json(root, "fidelity-calibrated-code-h100.json")
    rc = code["rows"]
    d = rc["calibrated64"]["minus_window"]
    out += (f"\n\nStatistics measured on code only ({code['calibration']['tokens']} tokens, "
            f"K = 64), HF reference at budget {code['settings']['budget']}: calibrated "
            f"{rc['calibrated64']['nll_ratio']:.4f}, window {rc['window']['nll_ratio']:.4f} "
            f"(difference {d['diff']:+.4f}, 95% CI [{d['ci95'][0]:+.4f}, {d['ci95'][1]:+.4f}]): "
            f"{link('fidelity-calibrated-code-h100.json', prefix)}.")
    out += "\n\n" + _cost_table(root, prefix, "scorer-cost-h200.json")
    old = load_json(root, "scorer-cost-h100.json")
    k = {r["queries_per_head"]: r for r in old["rows"] if r["scorer"] == "calibrated"}
    w = next(r for r in old["rows"] if r["scorer"] == "window")
    out += (f"\n\nBefore the rotation ran once per launch (the rotation inside the attention "
            f"kernel, {old['gpu']}, commit {short_commit(old['commit'])}), 8 requests' whole "
            f"compaction took {w['batch8_compress_ms']:.2f} ms with the window scorer, "
            + ", ".join(f"{k[q]['batch8_compress_ms']:.2f} ms at K = {q}" for q in sorted(k))
            + f": {link('scorer-cost-h100.json', prefix)}.")
    return out


def _cost_table(root: str, prefix: str, name: str) -> str:
    cost = load_json(root, name)
    dims = cost["dims"]
    crow = [[r["scorer"], r["queries_per_head"],
             "-" if r["scorer"] == "window" else f"{r['stats_bytes'] / 2**20:.1f}",
             f"{r['batch8_attention_ms']:.2f}", f"{r['batch8_compress_ms']:.2f}",
             f"{r['batch32_attention_ms']:.2f}", f"{r['batch32_compress_ms']:.2f}"]
            for r in cost["rows"]]
    return (md_table(("scorer", "queries per head", "statistics MiB",
                      "8 requests: attention ms", "8: whole compaction ms",
                      "32: attention ms", "32: whole compaction ms"), crow)
            + f"\n\n{dims['layers']} layers, {dims['q_heads']} query and {dims['kv_heads']} "
            f"KV heads, head_dim {dims['head_dim']}, {dims['suffix']} -> {dims['kept']} tokens "
            f"per request, bf16; {cost['gpu']}, commit {short_commit(cost['commit'])}: "
            f"{link(name, prefix)}.")


SPECULATIVE_RUNS = (("speculative-standalone-h200.json", "STANDALONE (the model as its own draft)"),
                    ("speculative-standalone-unmoved-h200.json",
                     "STANDALONE, the draft's KV left unmoved (broken on purpose)"),
                    ("speculative-ngram-h200.json", "NGRAM"))


def speculative_table(root: str = ".", prefix: str = "") -> str:
    """Speculative decoding with compression: the same engine's accept length with and
    without compression on the same prompts (speculative_check.py)."""
    rows = []
    for name, what in SPECULATIVE_RUNS:
        res = load_json(root, name)
        s, e = res["summary"], res["engine"]
        rows.append([what, f"{s['accept_length_full']:.3f}", f"{s['accept_length_compressed']:.3f}",
                     f"{s['ratio']:.3f}", f"{s['compactions_per_request']:.1f}",
                     f"{s['most_kv_len']} ({e['zipage_kv_budget']} + {e['zipage_buffer']} + prompt)",
                     e["attention_backend"], res["gpu"], short_commit(res["commit"]),
                     link(name, prefix)])
    return md_table(("algorithm", "accept length, not compressed", "compressed", "ratio",
                     "compactions per request", "most KV a request held", "attention",
                     "card", "commit", "file"), rows)


def coverage_run_line(res: Dict, name: str, prefix: str, more: str = "") -> str:
    """A coverage.py run under its table: its verdicts, card and commit (``more`` after the
    commit), and its file."""
    s = res["summary"]
    return (f"**{s['pass']} pass, {s['refused']} refused, {s['fail']} fail** "
            f"({res['gpu']}, commit {short_commit(res['commit'])}{more}): {link(name, prefix)}")


def speculative_coverage_table(root: str = ".", prefix: str = "") -> str:
    """Coverage rows with speculative decoding on (coverage.py --speculative), bf16 and FP8 KV:
    the judge's verdict and the accept length with and without compression on the same
    prompts; one line per run under the table (its card and commit)."""
    rows, runs = [], []
    for name in ("coverage-speculative-h100.json", "coverage-speculative-fp8-h100.json"):
        res = load_json(root, name)
        for r in res["rows"]:
            acc = (r.get("evidence") or {}).get("accept_length") or {}
            rows.append([r["family"], r["speculative"], r["draft"] or "its MTP layer",
                         r["kv_dtype"], r["attention_backend"], r["page_size"], r["status"],
                         acc.get("full", ""), acc.get("compressed", ""), acc.get("ratio", ""),
                         acc.get("compactions_per_request", "")])
        # a row rerun in another device session says so (its "rerun": command, commit, card)
        again = "".join(f"; the {r['family']} {r['kv_dtype']} row rerun in another session "
                        f"({r['rerun']['gpu']}, commit {short_commit(r['rerun']['commit'])})"
                        for r in res["rows"] if r.get("rerun"))
        runs.append(coverage_run_line(res, name, prefix, again))
    return (md_table(("family", "algorithm", "draft", "KV dtype", "attention", "page", "status",
                      "accept length, not compressed", "compressed", "ratio",
                      "compactions per request"), rows)
            + "\n\n" + ";\n".join(runs) + ".")


def kernels_table(root: str = ".", prefix: str = "") -> str:
    """The compaction pipeline per batch (milliseconds, CUDA events) and its bandwidth."""
    res = load_json(root, "kernels-h200.json")
    cols = (("window_scores_ms", "window scores"), ("global_scores_ms", "global_scores"),
            ("select_topk_ms", "top-k"), ("in_place_order_ms", "in-place order"),
            ("compact_kv_ms", "compact_kv"), ("total_ms", "whole pipeline"),
            ("score_tokens_ms", "scoring"), ("score_tokens_full_ms", "scoring, full redundancy"),
            ("score_tokens_lightning_ms", "scoring, lightning redundancy"))
    rows = [[p["batch"]] + [f"{p[k]:.2f}" for k, _ in cols]
            + [f"{p['score_tokens_full_ms'] / p['score_tokens_ms']:.1f}x"] for p in res["pipeline"]]
    cfg = res["config"]
    return (md_table(("requests",) + tuple(c for _, c in cols) + ("full / none",), rows)
            + f"\n\nms per call; {cfg['layers']} layers, {cfg['hq']} query and {cfg['hkv']} KV "
            f"heads, head_dim {cfg['d']}, {cfg['s']} -> {cfg['k']} tokens per request. "
            f"compact_kv moves {res['compaction_GBps'] / 1000:.2f} TB/s, "
            f"{res['compaction_vs_copy']:.2f}x a device-to-device copy "
            f"({res['copy_GBps'] / 1000:.2f} TB/s); the query window's write takes "
            f"{res['qwindow_write_us_per_step']:.0f} us a decode step. {res['gpu']}, commit "
            f"{short_commit(res['commit'])}: {link('kernels-h200.json', prefix)}.")


CALIBRATED_COVERAGE = ("coverage-calibrated-h200.json", "coverage-calibrated-h100.json")


def calibrated_coverage_table(root: str = ".", prefix: str = "") -> str:
    """Coverage rows run with the calibrated scorer (coverage.py --scorer calibrated), one per
    layout: the verdict, the compactions and the largest suffix against its limit, and the
    query window it did not allocate; one line per run under the table (its card and commit)."""
    rows, runs = [], []
    for name in CALIBRATED_COVERAGE:
        res = load_json(root, name)
        for r in sorted(res["rows"], key=lambda r: r["family"]):
            ev_ = r.get("evidence") or {}
            mem = ev_.get("memory") or {}
            layout = (ev_.get("layout") or {}).get("layout", "")
            rows.append([r["family"], layout, r["kv_dtype"], r["attention_backend"],
                         r["page_size"], r["status"], ev_.get("compactions", ""),
                         f"{ev_.get('max_suffix_tokens', '')} of {ev_.get('limit', '')}",
                         mem.get("window_slots", ""), mem.get("windowless_compactions", ""),
                         "yes" if ev_.get("short_equal_stock") else "no", res["gpu"]])
        runs.append(coverage_run_line(res, name, prefix))
    return (md_table(("family", "layout", "KV dtype", "attention", "page", "status",
                      "compactions", "largest suffix, of its limit", "query-window slots",
                      "windowless compactions", "short outputs equal stock", "card"), rows)
            + "\n\n" + ";\n".join(runs) + ".")


COVERAGE_COLUMNS = (("bfloat16", "triton", 1), ("fp8_e4m3", "triton", 1),
                    ("bfloat16", "flashinfer", 1), ("bfloat16", "triton", 16))


def coverage_table(root: str = ".", prefix: str = "") -> str:
    """Model family x (KV dtype, backend, page size): pass or refused, on one H200."""
    res = load_json(root, "coverage-h200.json")
    families: Dict[str, List[Dict]] = OrderedDict()
    for row in sorted(res["rows"], key=lambda r: r["family"]):
        families.setdefault(row["family"], []).append(row)
    rows = []
    for family, runs in families.items():
        cells, more = {}, []
        for r in runs:
            key = (r["kv_dtype"], r["attention_backend"], r["page_size"])
            if key in COVERAGE_COLUMNS and key not in cells:
                cells[key] = r["status"]
            else:
                more.append(f"{r['kv_dtype']} {r['attention_backend']} p{r['page_size']}: "
                            f"{r['status']}")
        rows.append([family] + [cells.get(k, "") for k in COVERAGE_COLUMNS]
                    + ["; ".join(more) or "", ", ".join(sorted({short_commit(r["commit"])
                                                                for r in runs}))])
    header = ("family",) + tuple(f"{d} {b} p{p}" for d, b, p in COVERAGE_COLUMNS) + (
        "other rows", "commits")
    s = res["summary"]
    return (md_table(header, rows) + f"\n\n**{s['pass']} pass, {s['refused']} refused by "
            f"design, {s['fail']} fail** ({res['gpu']}): {link('coverage-h200.json', prefix)}.")


def coverage_summary(root: str = ".", prefix: str = "") -> str:
    """One line per family for the README: how many rows pass, and what was refused."""
    res = load_json(root, "coverage-h200.json")
    families: Dict[str, List[Dict]] = OrderedDict()
    for row in sorted(res["rows"], key=lambda r: r["family"]):
        families.setdefault(row["family"], []).append(row)
    rows = []
    for family, runs in families.items():
        passed = sum(r["status"] == "pass" for r in runs)
        refused = [f"{r['attention_backend']} p{r['page_size']}" for r in runs
                   if r["status"] == "refused"]
        rows.append((family, f"{passed} of {len(runs)}",
                     "every row (the model)" if len(refused) == len(runs)
                     else ", ".join(sorted(set(refused))) or "-"))
    s = res["summary"]
    return (md_table(("family (dummy weights, public config)", "rows that pass",
                      "refused by design"), rows)
            + f"\n\nIn all {s['pass']} pass, {s['refused']} refused by design, {s['fail']} fail: "
            f"{link('coverage-h200.json', prefix)}.")


def composability_table(root: str = ".", prefix: str = "") -> str:
    res = load_json(root, "composability-h200.json")
    rows = []
    for c in res["configs"] + res["configs_other"]:
        commit = c["command"].split("--commit ")[-1].split()[0] if "--commit" in c["command"] else ""
        rows.append((c["config"], num(c["mean_running_reqs"]), num(c["output_tok_s"]),
                     num(c["p50_tpot_ms"], 2), f"{100 * c['compaction_share']:.2f}%",
                     short_commit(commit)))
    return (md_table(("configuration", "running", "zipage tok/s", "TPOT p50 ms",
                      "compaction GPU share", "commit"), rows)
            + f"\n\nQwen3-1.7B shape, {res['gpu']}: {link('composability-h200.json', prefix)}.")


def step_profile_table(root: str = ".", prefix: str = "") -> str:
    res = load_json(root, "step-profile-h200.json")
    rows = [(name, f"{s['step_ms']:.2f}", f"{s['gpu_busy_ms_per_step']:.2f}",
             f"{s['attention']:.2f}", f"{s['gemm']:.2f}", f"{s['other']:.2f}")
            for name, s in res["summary"].items()]
    return (md_table(("backend, engine", "step ms", "GPU busy ms", "attention ms", "GEMM ms",
                      "other ms"), rows)
            + f"\n\n{res['gpu']}, commit {short_commit(res['commit'])}: "
            f"{link('step-profile-h200.json', prefix)}.")


SIZING_ROWS = (("kept", "at the budget, prompt kept"),
               ("compressed", "at the budget, prompt compressed"),
               ("kept_floor", "squeezed to the floor, prompt kept"),
               ("compressed_floor", "squeezed to the floor, prompt compressed"))


def sizing_table(root: str = ".", prefix: str = "") -> str:
    """Arithmetic, not a measurement: what a running request holds in a long run, and the
    running requests and tok/s ratio that gives (sizing_arithmetic.py)."""
    res = load_json(root, "sizing-arithmetic.json")
    rows = []
    for length, r in res["rows"].items():
        rows.append((f"{int(length) // 1024}k", "stock", num(r["stock_tokens"]), "-", "-", "-"))
        for key, what in SIZING_ROWS:
            z, p = r[key], r[key]["predicted"]
            rows.append((f"{int(length) // 1024}k", what, num(z["tokens"]),
                         f"{z['running_vs_stock']:.2f}x", num(p["running"]),
                         f"{p['tok_s_vs_stock']:.2f}x"))
    line, st = res["step_line"], res["settings"]
    return (md_table(("outputs (uniform in [L/2, L])", "zipage", "tokens a request holds",
                      "running vs stock", "predicted running", "predicted tok/s vs stock"), rows)
            + f"\n\nBudget {st['budget']} + {st['buffer']}, floor {st['floor']}, prompts "
            f"uniform in [{st['prompt'] // 2}, {st['prompt']}]; a pool of {num(st['pool'])} "
            f"tokens at {100 * st['pool_use']:.0f}% use (stock: {num(st['stock_pool'])} at "
            f"{100 * st['stock_pool_use']:.0f}%). A step at a full pool: {line['a_ms']} ms + "
            f"{line['b_ms_per_request']} ms a running request (a line through the long-run "
            f"rows, largest residual {line['largest_residual_ms']} ms). "
            f"{link('sizing-arithmetic.json', prefix)}.")


def _commands(res: Dict) -> List[str]:
    """The commands a result file records, in its own order, each once."""
    found: List[str] = []
    for m in res.get("merged_from") or []:
        found.append((f"# {m['engine']}\n" if m.get("engine") else "") + m["command"])
    if isinstance(res.get("command"), str) and res["command"] != "per load (loads[].command)":
        found.append(res["command"])
    for key in ("runs", "rows"):  # lists of runs (dicts of runs hold their own commands)
        runs = res.get(key) if isinstance(res.get(key), list) else []
        found += [r["command"] for r in runs
                  if isinstance(r, dict) and isinstance(r.get("command"), str)]
    if res.get("device_command"):
        found.append("# device calls: " + res["device_command"])
    return list(dict.fromkeys(found))


def commands_list(root: str = ".", prefix: str = "") -> str:
    """Every result file with the commands it records (fenced), for docs/benchmarks.md."""
    out = []
    for path in sorted(glob.glob(os.path.join(root, RESULTS, "*.json"))):
        name = os.path.basename(path)
        if name.endswith("_raw.json"):
            continue
        commands = _commands(load_json(root, name))
        out.append(f"- {link(name, prefix)}" + (":" if commands else ": the commands are in "
                                                 "its notes"))
        if commands:
            out += ["", "  ```"] + [f"  {line}" for c in commands for line in c.splitlines()]
            out += ["  ```", ""]
    return "\n".join(out)
