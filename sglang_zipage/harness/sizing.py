"""What a running request holds on average in a long run, and how many a pool runs at once.

Arithmetic over the output lengths of a load, not a measurement. A request counts in
proportion to how long it runs (each output token is one decode step), so the mean of a
quantity over the running set is its step-weighted mean over every request's steps t < l.
Stock holds prompt + t. Zipage under pressure: its suffix (the output, plus the prompt where
it is compressed too) grows to budget + buffer, then cycles between budget and budget +
buffer (mean budget + buffer / 2); a kept prompt stays beside it.

Used by benchmarks/sizing_arithmetic.py (docs/results.md's sizing table) and by a warm start's size
(warm_start.py: an engine's own long-run running count).
"""

from __future__ import annotations

from typing import Callable, Iterable, Optional

import numpy as np


def output_lengths(full_len: int, range_ratio: float) -> np.ndarray:
    """The output lengths bench_serving's random datasets draw uniformly from
    (sglang.benchmark.datasets.common.compute_random_lens)."""
    return np.arange(max(int(full_len * range_ratio), 1), full_len + 1)


def mean_held(lengths: Iterable[int], held: Callable[[np.ndarray], np.ndarray]) -> float:
    """Step-weighted mean of held(t) over every request's steps t < length; ``held`` maps an
    array of steps to what a request holds at each."""
    lengths = np.asarray(list(lengths), dtype=np.int64)
    upto = np.concatenate([[0.0], np.cumsum(held(np.arange(lengths.max()))
                                            .astype(np.float64))])  # upto[n] = sum_{t<n}
    return float(upto[lengths].sum() / lengths.sum())


def long_run_tokens(prompt_lens: Iterable[int], lengths: Iterable[int],
                    held_of: Callable[[int], Callable[[np.ndarray], np.ndarray]]) -> float:
    """What a running request holds on average where prompt and output lengths are drawn
    independently (bench_serving's random datasets): the mean over prompt lengths of the
    step-weighted mean over output lengths (``held_of(prompt)`` gives held)."""
    lengths = list(lengths)
    prompt_lens = list(prompt_lens)
    return sum(mean_held(lengths, held_of(int(p))) for p in prompt_lens) / len(prompt_lens)


def stock_held(prompt: int) -> Callable[[np.ndarray], np.ndarray]:
    return lambda t: prompt + t


def zipage_held(prompt: int, budget: int, buffer: int,
                own_prompt: bool) -> Callable[[np.ndarray], np.ndarray]:
    limit = budget + buffer

    def held(t: np.ndarray) -> np.ndarray:
        suffix = t + (prompt if own_prompt else 0)
        cycling = np.where(suffix >= limit, budget + buffer / 2, suffix)  # once reached
        return cycling + (0 if own_prompt else prompt)
    return held


def running_count(pool_tokens: int, mean_tokens: float) -> int:
    """Requests a full pool holds at ``mean_tokens`` each."""
    return int(pool_tokens // mean_tokens)


def zipage_config(info: dict) -> Optional[dict]:
    """The zipage configuration in a result file's server info, None where compression is off
    (stock SGLang serves no zipage state; --zipage-disable says enabled false)."""
    config = (info.get("zipage") or {}).get("config") or {}
    return config if config.get("enabled", bool(config)) else None


def engine_held(info: dict) -> Callable[[int], Callable[[np.ndarray], np.ndarray]]:
    """held_of(prompt) for the engine described by a result file's server info (probe.
    info_summary): stock's, or zipage's at its configuration (its floor where it has a budget
    range: a long run above capacity squeezes every request to it)."""
    config = zipage_config(info)
    if config is None:
        return stock_held
    budget = config.get("min_kv_budget") or config["kv_budget"]
    return lambda prompt: zipage_held(prompt, budget, config["buffer"],
                                      bool(config.get("compress_prompt")))
