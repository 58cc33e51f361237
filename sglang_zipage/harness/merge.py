"""Single-engine result files side by side.

First-wave files (bench_throughput.py) hold ``loads``: one entry per (load, sizes, variant),
each with a ``stock`` and/or ``zipage`` result; ``merge_first_wave`` pairs the engines of
several files entry by entry. Steady-state files (steady_state.py) hold one engine's run;
``merge_steady`` puts runs side by side with their ratios, over the window and over other
spans of the same runs (rows.py makes one a row of the throughput table). Every merged file
keeps the command and commit of what it was merged from, and a merged file merges again.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Dict, List, Optional

from sglang_zipage.harness.loads import LoadSpec
from sglang_zipage.harness.record import write_json
from sglang_zipage.harness.windows import rnd, steady_window

# ------------------------------------------------------------- first wave
# Entries written before a key was recorded ran these (fixed was the mode's default until
# issue 17 made it elastic).
VARIANT_DEFAULTS = {"kv_cache_dtype": "auto", "zipage_mode": "fixed"}


def load_entry(results: Dict, label: str, spec: LoadSpec, var: Dict) -> Dict:
    """The entry of ``results["loads"]`` for (load, sizes, variant); a new one if none."""
    for e in results["loads"]:
        if (e["load"] == label and e["spec"] == dataclasses.asdict(spec)
                and all(e.get(k, d) == var[k] for k, d in VARIANT_DEFAULTS.items())):
            return e
    # every load here submits all its requests at t=0: the first wave (steady_state.py
    # measures staggered arrivals)
    e = {"load": label, "spec": dataclasses.asdict(spec), **var, "regime": "first-wave",
         "output_len": spec.output_len}
    results["loads"].append(e)
    return e


def finish_entry(e: Dict) -> None:
    """The entry's headline: both engines' output tok/s, their ratio, the compaction share."""
    s, z = e.get("stock") or {}, e.get("zipage") or {}
    e["stock_output_tok_s"] = s.get("output_tok_s")
    e["zipage_output_tok_s"] = z.get("output_tok_s")
    e["ratio"] = (round(z["output_tok_s"] / s["output_tok_s"], 3)
                  if s.get("output_tok_s") and z.get("output_tok_s") else None)
    e["compaction_share"] = z.get("compaction_share")


def merge_first_wave(paths: List[str], out: str) -> Dict:
    """Combine result files (e.g. one per engine) load by load; later files win."""
    docs = [json.load(open(p)) for p in paths]
    res = {k: v for k, v in docs[0].items() if k not in ("loads", "engines")}
    sources = []  # a merged file passes its own sources on, so provenance survives re-merging
    for p, d in zip(paths, docs):
        sources += d.get("merged_from") or [{"path": p, "command": d.get("command"),
                                             "commit": d.get("commit")}]
    res.update(merged_from=sources, engines={}, loads=[])
    for d in docs:
        res["engines"].update(d.get("engines", {}))
        for e in d.get("loads", []):
            tgt = load_entry(res, e["load"], LoadSpec(**e["spec"]),
                             {k: e.get(k, d) for k, d in VARIANT_DEFAULTS.items()})
            for which in ("stock", "zipage"):
                if which in e:
                    # each engine's numbers keep the command and commit that measured them
                    tgt[which] = {"command": e.get("command", d.get("command")),
                                  "commit": e.get("commit", d.get("commit")), **e[which]}
            finish_entry(tgt)
    write_json(res, out)
    return res


# ----------------------------------------------------------- steady state
BENCH_KEYS = ("completed", "duration", "total_output_tokens", "output_throughput",
              "median_ttft_ms", "p99_ttft_ms", "median_tpot_ms", "p99_tpot_ms",
              "median_itl_ms", "p99_itl_ms", "median_e2e_latency_ms", "concurrency")
WINDOW_KEYS = ("output_tok_s", "mean_running_reqs", "mean_waiting_reqs", "mean_pool_use",
               "retractions_per_min", "finished_per_min", "server_tpot_ms", "compaction_share",
               "spec_accept_length")
SPAN_KEYS = ("start_s", "end_s", "output_tok_s", "finished", "mean_running_reqs",
             "min_running_reqs", "max_running_reqs", "mean_pool_use")
RUN_SPECIFIC = ("--base-url", "--tokenizer", "--output-file")  # a port and temporary paths


def steady_summary(doc: Dict) -> Dict:
    """One steady-state run in a line: its window and bench_serving's report."""
    w, b = doc.get("window") or {}, doc.get("bench_serving") or {}
    return {"engine": doc["engine"], "status": doc["status"],
            **{k: w.get(k) for k in WINDOW_KEYS},
            "compactions": (w.get("zipage") or {}).get("compactions"),
            "bench_serving": {k: rnd(b.get(k)) for k in BENCH_KEYS if k in b}}


def ratio(z, s) -> Optional[float]:
    return round(z / s, 3) if isinstance(z, (int, float)) and isinstance(s, (int, float)) and s else None


def same_load(a: Optional[Dict], b: Optional[Dict]) -> Optional[bool]:
    """Whether two runs had the same load, bench_serving's run-specific arguments aside."""
    if not a or not b:
        return None

    def norm(load):
        argv = list(load.get("bench_serving_argv") or [])
        for flag in RUN_SPECIFIC:
            if flag in argv and argv.index(flag) + 1 < len(argv):
                argv[argv.index(flag) + 1] = "*"
        return {**load, "bench_serving_argv": argv}
    return norm(a) == norm(b)


def compare(stock: Dict, zipage: Dict) -> Dict:
    """zipage / stock for the window metrics and bench_serving's report."""
    out = {}
    for name, keys in (("window", WINDOW_KEYS), ("bench_serving", BENCH_KEYS)):
        for k in keys:
            s, z = (stock.get(name) or {}).get(k), (zipage.get(name) or {}).get(k)
            out[f"{name}.{k}"] = {"stock": s, "zipage": z, "ratio": ratio(z, s)}
    if same_load(stock.get("load"), zipage.get("load")) is False:
        out["warning"] = "the two runs had different load arguments"
    return out


def until_abort(run: Dict) -> List[Dict]:
    """The run's samples up to its window end (later ones see the abort: all "finished")."""
    end = (run.get("load") or {}).get("window_end_s", float("inf"))
    return [x for x in run.get("samples") or [] if x.get("t_s") is not None and x["t_s"] <= end]


def compare_spans(stock: Dict, zipage: Dict, spans: List[List[float]]) -> List[Dict]:
    """Both engines over other spans of the same runs (the window is one span of a run that
    may move in waves; these say how much the ratio depends on where it is taken)."""
    samples = [until_abort(stock), until_abort(zipage)]
    rows = []
    for start, end in spans:
        s, z = ({k: m.get(k) for k in SPAN_KEYS} if "error" not in m else m
                for m in (steady_window(smp, start, end) for smp in samples))
        rows.append(dict(span_s=[start, end], stock=s, zipage=z,
                         ratio=ratio(z.get("output_tok_s"), s.get("output_tok_s"))))
    return rows


def turnover_s(run: Dict) -> Optional[float]:
    """When the run's first running set has turned over once: the first sample at which the
    requests finished since the load started reach the number that ran just before the first
    of them finished (the first wave, all admitted at once, has left). None if that never
    happens before the window end. A span that starts later is "long-run": requests of every
    age run in it, not only the first wave's."""
    end = (run.get("load") or {}).get("window_end_s", float("inf"))
    samples = [x for x in run.get("samples") or [] if x.get("t_s") is not None
               and 0 <= x["t_s"] <= end and x.get("finished_requests") is not None]
    if not samples:
        return None
    f0, first_wave = samples[0]["finished_requests"], None
    for x in samples:
        if x["finished_requests"] == f0:
            first_wave = x.get("running_reqs")
        elif first_wave and x["finished_requests"] - f0 >= first_wave:
            return x["t_s"]
    return None


LONG_RUN_RULE = ("both windows from stock's turnover (turnover_s) to the earlier window end, "
                 "set by the merge: runs of one engine per session cannot know it in advance")


def long_run_windows(engines: Dict[str, Dict]) -> float:
    """Move every engine's window to [stock's turnover, the earliest window end] (the rule
    fixed before the runs: the window starts once stock's first running set has left);
    the window each run measured stays as "window_as_run". Returns the start."""
    start = turnover_s(engines["stock"])
    end = min(e["load"]["window_end_s"] for e in engines.values())
    if start is None or start >= end:
        raise SystemExit(f"no long-run window: stock turned over at {start}, windows end at {end} s")
    for e in engines.values():
        e.setdefault("window_as_run", e["window"])
        e["window"] = steady_window([x for x in until_abort(e) if x["t_s"] >= start], start, end)
    return start


def default_spans(stock: Dict) -> List[List[float]]:
    """The whole load and the window."""
    load = stock.get("load") or {}
    start, end = load.get("window_start_s"), load.get("window_end_s")
    return [[0.0, end], [start, end]] if end else []


def parse_spans(text: Optional[str]) -> Optional[List[List[float]]]:
    """'0-480,60-270' -> [[0, 480], [60, 270]]."""
    if not text:
        return None
    return [[float(x) for x in part.split("-")] for part in text.split(",")]


def merge_steady(paths: List[str], out: str, spans: Optional[List[List[float]]] = None,
                 long_run: bool = False) -> Dict:
    """Single-engine files (or merged ones, whose engines are taken again) side by side, the
    last run of each engine counting; ``long_run``: over the long-run window (``long_run_windows``) instead of each run's own."""
    sources = []  # (path, single-engine doc)
    for p in paths:
        d = json.load(open(p))
        if "engine" in d:
            sources.append((p, d))
        else:
            origin = {m["engine"]: m["path"] for m in d.get("merged_from", [])}
            sources += [(origin.get(name, p), e) for name, e in d.get("engines", {}).items()]
    # one run an engine: a later file's run replaces an earlier one's (a merged file standing
    # for its stock run beside a new zipage run)
    sources = list({d["engine"]: (p, d) for p, d in sources}.values())
    docs = [d for _, d in sources]
    failed = [f"{p} ({d['engine']}): {((d.get('error') or '').strip().splitlines() or [''])[-1]}"
              for p, d in sources if d.get("status") == "failed"]
    if failed:
        raise SystemExit("failed runs measure no steady state: " + "; ".join(failed))
    cards = {d["gpu"] for d in docs if d.get("gpu")}  # (older runs do not say)
    if len(cards) > 1:
        raise SystemExit("the runs ran on different cards (" + ", ".join(
            f"{p}: {d.get('gpu')}" for p, d in sources) + "): a ratio needs both engines on one "
            "kind of card; rerun the other engine there")
    engines = {d["engine"]: d for d in docs}
    res = dict(benchmark="steady_state (merged)",
               merged_from=[dict(path=p, engine=d["engine"], command=d.get("command"),
                                 commit=d.get("commit"), status=d.get("status"))
                            for p, d in sources],
               gpu=cards.pop() if cards else None,
               summary=[steady_summary(d) for d in docs], engines=engines)
    if long_run:
        res["window_rule"] = LONG_RUN_RULE
        long_run_windows(engines)
        res["summary"] = [steady_summary(d) for d in docs]
    if "stock" in engines and "zipage" in engines:
        res["comparison"] = compare(engines["stock"], engines["zipage"])
        res["output_tok_s_ratio"] = res["comparison"]["window.output_tok_s"]["ratio"]
        res["spans"] = compare_spans(engines["stock"], engines["zipage"],
                                     spans or default_spans(engines["stock"]))
    write_json(res, out)
    print("MERGED " + json.dumps({k: res.get(k) for k in ("summary", "output_tok_s_ratio")}), flush=True)
    return res
