"""Fidelity metrics: NLL ratio, top-1 agreement, length inflation, repetition, and their noise.

Per (implementation, budget, variant), over the texts' steps that come after the first
compaction (the compressed run's own `compactions_before` >= 1; the full-KV run of the same
implementation is scored on the same steps):
  nll_ratio       sum of -logprob(reference token), compressed / full-KV, pooled over texts
  nll_ratio_ci95  95% block bootstrap: the scored steps of every text are cut into blocks of
                  BLOCK consecutive steps, and blocks are resampled (2000 draws, seed 0), so
                  that a run of 2 texts still gets an interval; differences between two runs
                  (engine - hf) resample the same blocks for both (paired)
  top1_agreement  share of steps where compressed and full-KV top-1 tokens agree
  top1_acc        share of steps where the compressed top-1 is the reference token
Free running (engine only), per budget and variant, over the free prompts:
  length_inflation  sum of completion tokens, compressed / full-KV
  repetition_rate   mean share of word 4-grams that repeat an earlier one (0 = none)
"""

from __future__ import annotations

import random
from typing import Dict, List, Optional, Sequence

BOOT_DRAWS = 2000
BLOCK = 32


def repetition_rate(text: str, n: int = 4) -> float:
    """Share of word n-grams that repeat an earlier one (as tests/e2e use it)."""
    words = text.split()
    grams = [tuple(words[i:i + n]) for i in range(len(words) - n + 1)]
    return 1 - len(set(grams)) / len(grams) if grams else 0.0


def scored_steps(rec: Dict) -> List[int]:
    return [i for i, n in enumerate(rec["compactions_before"]) if n >= 1]


def from_step(run: Dict[str, Dict], start: int) -> Dict[str, Dict]:
    """The run's records scored only from step ``start`` on (``compare`` scores the steps
    after a compaction)."""
    return {t: {**r, "compactions_before": [n if i >= start else 0
                                            for i, n in enumerate(r["compactions_before"])]}
            for t, r in run.items()}


def scores_from(run: Dict[str, Dict], full: Dict[str, Dict], refs: Dict[str, List[int]],
                start: int, part: str) -> Dict:
    """A row's scores without their per-text parts: ``part`` over the steps from ``start`` on
    (the same for every row), "own" over the steps after its own first compaction."""
    out = {part: compare(from_step(run, start), full, refs), "own": compare(run, full, refs)}
    for scored in out.values():
        scored.pop("per_text")
    return out


def _unit_sums(c: Dict, f: Dict, ref: List[int], steps: Sequence[int]) -> Dict:
    return dict(nll_c=-sum(c["logprob"][i] for i in steps),
                nll_f=-sum(f["logprob"][i] for i in steps),
                agree=sum(c["top1"][i] == f["top1"][i] for i in steps),
                acc=sum(c["top1"][i] == ref[i] for i in steps), n=len(steps))


def _sums(comp: Dict[str, Dict], full: Dict[str, Dict], ids: Sequence[str], refs: Dict,
          block: Optional[int] = None):
    """Sums over the compressed run's scored steps, per text (block None) or per
    (text, block of `block` scored steps)."""
    out = {}
    for tid in ids:
        steps = scored_steps(comp[tid])
        if block is None:
            out[tid] = _unit_sums(comp[tid], full[tid], refs[tid], steps)
            continue
        for j in range(0, len(steps), block):
            out[(tid, j // block)] = _unit_sums(comp[tid], full[tid], refs[tid], steps[j:j + block])
    return out


def _ratio(per: Dict[str, Dict], ids: Sequence[str]) -> Optional[float]:
    den = sum(per[t]["nll_f"] for t in ids)
    return sum(per[t]["nll_c"] for t in ids) / den if den > 0 else None


def bootstrap(ids: List, stat, draws: int = BOOT_DRAWS, seed: int = 0):
    """95% percentile interval of stat(resampled units); None for fewer than 2 units."""
    if len(ids) < 2:
        return None
    rng = random.Random(seed)
    vals = sorted(v for v in (stat([rng.choice(ids) for _ in ids]) for _ in range(draws))
                  if v is not None)
    return [vals[int(0.025 * len(vals))], vals[int(0.975 * len(vals)) - 1]]


def compare(comp: Dict[str, Dict], full: Dict[str, Dict], refs: Dict[str, List[int]]) -> Dict:
    ids = sorted(comp)
    per = _sums(comp, full, ids, refs)
    blocks = _sums(comp, full, ids, refs, BLOCK)
    units = sorted(blocks)
    n = sum(p["n"] for p in per.values())
    return {
        "nll_ratio": _ratio(per, ids),
        "nll_ratio_ci95": bootstrap(units, lambda s: _ratio(blocks, s)),
        "top1_agreement": sum(p["agree"] for p in per.values()) / n if n else None,
        "top1_acc": sum(p["acc"] for p in per.values()) / n if n else None,
        "nll_per_token": sum(p["nll_c"] for p in per.values()) / n if n else None,
        "nll_per_token_full": sum(p["nll_f"] for p in per.values()) / n if n else None,
        "scored_tokens": n,
        "per_text": {t: {"nll_ratio": per[t]["nll_c"] / per[t]["nll_f"] if per[t]["nll_f"] else None,
                         "top1_agreement": per[t]["agree"] / per[t]["n"] if per[t]["n"] else None,
                         "scored_tokens": per[t]["n"]} for t in ids},
    }


def paired_ratio_difference(a_comp, a_full, b_comp, b_full, refs) -> Dict:
    """Pooled nll_ratio of run a minus run b on the same texts and the same scored steps
    (same budget), with a paired block bootstrap (the same resampled blocks for both)."""
    ids = sorted(a_comp)
    pa, pb = _sums(a_comp, a_full, ids, refs, BLOCK), _sums(b_comp, b_full, ids, refs, BLOCK)
    units = sorted(pa)
    assert units == sorted(pb), "paired runs must score the same steps"

    def stat(s):
        ra, rb = _ratio(pa, s), _ratio(pb, s)
        return None if ra is None or rb is None else ra - rb

    diff = stat(units)
    ci = bootstrap(units, stat)
    return {"diff": diff, "ci95": ci,
            "ci_contains_0": (ci[0] <= 0 <= ci[1]) if ci else None}


def full_kv_agreement(a: Dict[str, Dict], b: Dict[str, Dict]) -> Dict:
    """Two full-KV runs (engine, HF): the numerical noise floor, over every step."""
    ids = sorted(a)
    n = sum(len(a[t]["logprob"]) for t in ids)
    nll_a = -sum(sum(a[t]["logprob"]) for t in ids)
    nll_b = -sum(sum(b[t]["logprob"]) for t in ids)
    agree = sum(x == y for t in ids for x, y in zip(a[t]["top1"], b[t]["top1"]))
    dlp = [abs(x - y) for t in ids for x, y in zip(a[t]["logprob"], b[t]["logprob"])]
    return {"nll_per_token_a": nll_a / n, "nll_per_token_b": nll_b / n,
            "nll_ratio_a_over_b": nll_a / nll_b, "top1_agreement": agree / n,
            "mean_abs_logprob_diff": sum(dlp) / n, "max_abs_logprob_diff": max(dlp),
            "tokens": n}


def _stopped(out: Dict) -> bool:
    fr = out.get("finish_reason")
    return isinstance(fr, dict) and fr.get("type") == "stop"


def free_running(comp: Dict[str, Dict], full: Dict[str, Dict]) -> Dict:
    ids = sorted(comp)
    lc = sum(comp[t]["completion_tokens"] for t in ids)
    lf = sum(full[t]["completion_tokens"] for t in ids)
    return {"length_inflation": lc / lf if lf else None,
            "mean_completion_tokens": lc / len(ids), "mean_completion_tokens_full": lf / len(ids),
            "repetition_rate": sum(repetition_rate(comp[t]["text"]) for t in ids) / len(ids),
            "repetition_rate_full": sum(repetition_rate(full[t]["text"]) for t in ids) / len(ids),
            "stopped_by_eos": sum(_stopped(comp[t]) for t in ids),
            "stopped_by_eos_full": sum(_stopped(full[t]) for t in ids),
            "prompts": len(ids)}
