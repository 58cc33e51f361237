#!/usr/bin/env python3
"""Draw fidelity.png from fidelity.json (no engine, no GPU needed).

    .venv/bin/python benchmarks/fidelity/plot_fidelity.py benchmarks/results/fidelity.json \
        benchmarks/results/fidelity.png

Panels: NLL ratio (compressed / full KV) and top-1 agreement against the budget fraction,
one colour per variant, engine solid with 95% bootstrap bars, HF reference dashed; and
the free-running length inflation and repetition rate of the engine.
"""

from __future__ import annotations

import json
import sys

COLORS = {"window": "tab:blue", "+decay": "tab:orange", "+redundancy": "tab:green",
          "+pooling": "tab:red", "random": "tab:gray", "recent": "black",
          "default": "tab:purple", "+lightning": "tab:brown"}


def plot(summary: dict, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = summary["results"]
    fig, axes = plt.subplots(1, 3, figsize=(17, 5.2))
    variants = sorted({r["variant"] for r in rows}, key=lambda v: list(COLORS).index(v)
                      if v in COLORS else 99)
    fracs = sorted({r["budget_frac"] for r in rows})
    single = len(fracs) == 1
    for vi, v in enumerate(variants):
        for impl, style in (("engine", "-"), ("hf", "--")):
            pts = sorted((r["budget_frac"], r) for r in rows if r["variant"] == v and r["impl"] == impl)
            if not pts:
                continue
            # with one budget, spread the variants sideways so they stay readable
            xs = [vi + (0.15 if impl == "hf" else -0.15) for _ in pts] if single else [p[0] for p in pts]
            c = COLORS.get(v)
            for ax, key in ((axes[0], "nll_ratio"), (axes[1], "top1_agreement")):
                ys = [p[1][key] for p in pts]
                kw = dict(color=c, linestyle=style if not single else "none", marker="o" if impl == "engine" else "s",
                          mfc=c if impl == "engine" else "white", label=f"{v} ({impl})")
                if key == "nll_ratio":
                    err = [[y - (p[1]["nll_ratio_ci95"] or [y, y])[0] for y, p in zip(ys, pts)],
                           [(p[1]["nll_ratio_ci95"] or [y, y])[1] - y for y, p in zip(ys, pts)]]
                    ax.errorbar(xs, ys, yerr=err, capsize=3, **kw)
                else:
                    ax.plot(xs, ys, **kw)
    for ax, title in ((axes[0], "NLL ratio, compressed / full KV (lower is better)"),
                      (axes[1], "top-1 agreement with full KV")):
        ax.set_title(title, fontsize=10)
        if single:
            ax.set_xticks(range(len(variants)), variants, rotation=30)
            ax.set_xlabel(f"variant (budget {fracs[0]:g} of the continuation; "
                          "left engine, right HF)")
        else:
            ax.set_xscale("log", base=2)
            ax.set_xticks(fracs, [f"{f:g}" for f in fracs])
            ax.set_xlabel("KV budget / continuation length")
        ax.grid(alpha=0.3)
    axes[0].axhline(1.0, color="k", lw=0.6)
    axes[0].legend(fontsize=7, ncol=2)
    ax = axes[2]
    eng = [r for r in rows if r["impl"] == "engine" and r.get("length_inflation") is not None]
    labels = [f"{r['budget_frac']:g}\n{r['variant']}" for r in eng]
    x = range(len(eng))
    ax.bar([i - 0.2 for i in x], [r["length_inflation"] for r in eng], 0.4,
           color=[COLORS.get(r["variant"]) for r in eng], label="length inflation")
    ax.bar([i + 0.2 for i in x], [r["repetition_rate"] for r in eng], 0.4, color="none",
           edgecolor=[COLORS.get(r["variant"]) for r in eng], hatch="//",
           label="4-gram repetition rate")
    if eng:
        ax.axhline(eng[0]["repetition_rate_full"], color="k", ls=":", lw=1,
                   label="repetition rate, full KV")
    ax.axhline(1.0, color="k", lw=0.6)
    ax.set_xticks(list(x), labels, fontsize=7, rotation=90)
    ax.set_title("free running (engine): length compressed / full KV, repetition", fontsize=10)
    ax.legend(fontsize=7)
    ax.grid(alpha=0.3, axis="y")
    tag = "SUBSET " if summary.get("subset") else ""
    fig.suptitle(f"{tag}fidelity, {summary['label']}\n{summary['device']}, git {summary['git_sha']}",
                 fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


if __name__ == "__main__":
    plot(json.load(open(sys.argv[1])), sys.argv[2])
