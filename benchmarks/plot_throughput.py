#!/usr/bin/env python3
"""Draw the PNG of a bench_throughput.py result JSON (no GPU, no SGLang needed).

One row per load: output tok/s over time (5 s moving rate), running requests, and KV token
usage, stock vs zipage on shared axes; the measurement window is shaded and the title gives
both window rates and their ratio. Needs matplotlib (`pip install matplotlib`).

usage: python benchmarks/plot_throughput.py RESULT.json [OUT.png]   (default: RESULT.png)
"""

from __future__ import annotations

import json
import os
import sys
from typing import Dict, List, Tuple

COLORS = {"stock": "tab:gray", "zipage": "tab:blue"}


def rate_series(samples: List[Dict], span_s: float = 5.0) -> Tuple[List[float], List[float]]:
    """Output tok/s over the trailing span_s at each sample."""
    ts, rates, j = [], [], 0
    for i, s in enumerate(samples):
        while samples[j]["t_s"] < s["t_s"] - span_s:
            j += 1
        a = samples[j] if j < i else (samples[i - 1] if i else None)
        if a is None or s["t_s"] <= a["t_s"]:
            continue
        ts.append(s["t_s"])
        rates.append((s["output_tokens"] - a["output_tokens"]) / (s["t_s"] - a["t_s"]))
    return ts, rates


def series(samples: List[Dict], key: str) -> Tuple[List[float], List[float]]:
    pts = [(s["t_s"], s[key]) for s in samples if s.get(key) is not None]
    return [p[0] for p in pts], [p[1] for p in pts]


def title_of(entry: Dict) -> str:
    spec = entry["spec"]
    prefix = f" + {spec['shared_prefix_len']} shared" if spec.get("shared_prefix_len") else ""
    head = (f"{entry['load']}: {spec['num_requests']} x {spec['input_len']}{prefix} -> "
            f"{spec['output_len']}")
    parts = []
    for which in ("stock", "zipage"):
        r = entry.get(which) or {}
        if r.get("output_tok_s") is not None:
            parts.append(f"{which} {r['output_tok_s']:.0f} tok/s")
    if entry.get("ratio"):
        parts.append(f"x{entry['ratio']:.2f}")
    if entry.get("compaction_share") is not None:
        parts.append(f"compaction GPU share {100 * entry['compaction_share']:.1f}%")
    return head + "\n" + ", ".join(parts)


def draw_row(axes, entry: Dict) -> None:
    ax_rate, ax_run, ax_use = axes
    for which in ("stock", "zipage"):
        r = entry.get(which)
        if not r or not r.get("samples"):
            continue
        smp, c = r["samples"], COLORS[which]
        ax_rate.plot(*rate_series(smp), color=c, label=which)
        ax_run.plot(*series(smp, "running_reqs"), color=c, label=which)
        ax_use.plot(*series(smp, "token_usage"), color=c, label=which)
        if entry["spec"]["until"] == "window" and r.get("window_start_s") is not None:
            for ax in axes:
                ax.axvspan(r["window_start_s"], r["window_end_s"], color=c, alpha=0.08)
    ax_rate.set_title(title_of(entry), fontsize=9)
    ax_rate.set_ylabel("output tok/s (5 s)")
    ax_run.set_ylabel("running requests")
    ax_use.set_ylabel("KV token usage")
    ax_use.set_ylim(0, 1.05)
    for ax in axes:
        ax.set_xlabel("s after submission")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)


def plot(json_path: str, png_path: str) -> str:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    with open(json_path) as f:
        res = json.load(f)
    # rows with time series (steady-state rows keep theirs in their own file, "source")
    loads = [e for e in res.get("loads") or []
             if any((e.get(w) or {}).get("samples") for w in ("stock", "zipage"))]
    rows = max(1, len(loads))
    fig, axes = plt.subplots(rows, 3, figsize=(16, 3.8 * rows), squeeze=False)
    for row, entry in zip(axes, loads):
        draw_row(row, entry)
    fig.suptitle(f"sglang-zipage vs stock SGLang {res.get('versions', {}).get('sglang', '')} "
                 f"on {res.get('gpu')} (commit {str(res.get('commit'))[:10]})", fontsize=10)
    fig.tight_layout()
    fig.savefig(png_path, dpi=110)
    plt.close(fig)
    return png_path


def main() -> None:
    if len(sys.argv) < 2:
        raise SystemExit(__doc__)
    src = sys.argv[1]
    out = sys.argv[2] if len(sys.argv) > 2 else os.path.splitext(src)[0] + ".png"
    print(plot(src, out))


if __name__ == "__main__":
    main()
