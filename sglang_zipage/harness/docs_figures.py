"""The docs' figures as small hand-written SVG (deterministic text, no plotting library), so
the docs test compares them byte for byte like the tables.

  throughput_svg  every steady-state pair on a GPU: stock and zipage output tok/s side by
                  side, the ratio, the card, and whether both engines ran back to back on
                  one GPU (a paler zipage bar where they did not)
  fidelity_svg    fidelity.json's NLL ratio (compressed / full KV) against the budget, one
                  line per selection variant
"""

from __future__ import annotations

from html import escape
from typing import Dict, List, Sequence

from sglang_zipage.harness.docs_evidence import FIDELITY_VARIANTS
from sglang_zipage.harness.docs_tables import load_json, steady_pairs

FONT = 'font-family="sans-serif" font-size="12"'
STOCK, ZIPAGE, ZIPAGE_APART = "#9a9a9a", "#2563c9", "#a9c3ee"
LINE_COLOURS = ("#1b9e77", "#d95f02", "#7570b3", "#e7298a", "#666666", "#a6761d")


def _text(x: int, y: int, s: str, anchor: str = "start", extra: str = "") -> str:
    return f'<text x="{x}" y="{y}" text-anchor="{anchor}" {FONT}{extra}>{escape(s)}</text>'


def _rect(x: int, y: int, w: int, h: int, fill: str) -> str:
    return f'<rect x="{x}" y="{y}" width="{w}" height="{h}" fill="{fill}"/>'


def _svg(width: int, height: int, body: List[str]) -> str:
    return "\n".join([f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" '
                      f'height="{height}" viewBox="0 0 {width} {height}">',
                      _rect(0, 0, width, height, "white"), *body, "</svg>", ""])


def _pair_label(r: Dict) -> List[str]:
    flags = r["flags"].replace("`", "").replace("--zipage-", "")
    same = "back to back, one GPU" if r["same_session"] else "separate sessions"
    return [f"{r['load'].split(', ')[1]} tokens, {flags}",
            f"{r['card']}, {r['span']}, {same}"]


def throughput_svg(root: str = ".") -> str:
    rows = sorted((r for r in steady_pairs(root) if r["card"] != "CPU"),
                  key=lambda r: (not r["same_session"], r["output_len"], r["ratio"]))
    left, bar_w, row_h, top = 400, 420, 46, 40
    peak = max(max(r["stock_tok_s"], r["zipage_tok_s"]) for r in rows)
    body = [_text(10, 20, "Steady-state output tok/s, stock SGLang (grey) vs zipage (blue; "
                          "pale: zipage run in a later session than stock)", extra=' font-weight="bold"')]
    for i, r in enumerate(rows):
        y = top + i * row_h
        for j, line in enumerate(_pair_label(r)):
            body.append(_text(10, y + 14 + 15 * j, line))
        for k, (value, colour) in enumerate(
                ((r["stock_tok_s"], STOCK),
                 (r["zipage_tok_s"], ZIPAGE if r["same_session"] else ZIPAGE_APART))):
            w = round(bar_w * value / peak)
            body.append(_rect(left, y + 4 + 17 * k, w, 15, colour))
            body.append(_text(left + w + 4, y + 16 + 17 * k, f"{value:,.0f}"))
        body.append(_text(left + bar_w + 70, y + 24, f"{r['ratio']:.2f}x", extra=' font-weight="bold"'))
    return _svg(left + bar_w + 130, top + len(rows) * row_h + 10, body)


def _polyline(points: Sequence, colour: str) -> str:
    pts = " ".join(f"{x},{y}" for x, y in points)
    return f'<polyline points="{pts}" fill="none" stroke="{colour}" stroke-width="2"/>'


def fidelity_svg(root: str = ".") -> str:
    res = load_json(root, "fidelity.json")
    cells = {(r["budget_frac"], r["variant"]): r["nll_ratio"] for r in res["results"]
             if r["impl"] == "engine"}
    fracs = sorted({f for f, _ in cells})
    lo, hi = 1.0, max(cells.values()) * 1.01
    left, top, w, h = 60, 40, 420, 260

    def xy(i: int, v: float):
        return (left + round(w * i / (len(fracs) - 1)), top + round(h * (hi - v) / (hi - lo)))

    body = [_text(10, 20, "Fidelity: NLL ratio, compressed / full KV (lower is better)",
                  extra=' font-weight="bold"'),
            f'<line x1="{left}" y1="{top + h}" x2="{left + w}" y2="{top + h}" stroke="black"/>',
            f'<line x1="{left}" y1="{top}" x2="{left}" y2="{top + h}" stroke="black"/>']
    for step in range(0, 6):
        v = lo + (hi - lo) * step / 5
        body.append(_text(left - 6, xy(0, v)[1] + 4, f"{v:.3f}", anchor="end"))
    for i, f in enumerate(fracs):
        body.append(_text(xy(i, lo)[0], top + h + 18, f"budget {100 * f:g}%", anchor="middle"))
    for n, (variant, colour) in enumerate(zip(FIDELITY_VARIANTS, LINE_COLOURS)):
        body.append(_polyline([xy(i, cells[f, variant]) for i, f in enumerate(fracs)], colour))
        body.append(_rect(left + w + 20, top + 18 * n, 12, 12, colour))
        body.append(_text(left + w + 38, top + 10 + 18 * n, variant))
    return _svg(left + w + 150, top + h + 40, body)
