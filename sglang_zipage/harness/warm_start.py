"""A warm start for steady-state loads: the first requests arrive as a long-run running set.

Above capacity, a long run keeps each place of an engine's running set busy: when a request
ends, a waiting one takes its place. Seen at a random time, a place holds a request of total
output length l with probability l f(l) / E[l] (long requests hold their place longer:
length-biased sampling) and of an age a uniform over its l steps, so of remaining length
r = l - a. A load that starts empty instead admits its first running set all at age 0; those
requests grow together and leave together, and the running set takes a whole longest
lifetime to turn over (at 16k outputs on an H200, ~800 s of a session's ~1,700).

The warm start sends ``n`` requests at once before the Poisson stream, drawn from that
distribution: each asks for its remaining r tokens and, where an engine's KV at age a is its
prompt plus a tokens (stock SGLang: ``ages_in_prompt``), carries its age as a tokens more of
prompt, so it holds from its first decode step what the aged request holds. Zipage's KV at age
a is its prompt plus at most budget + buffer tokens of suffix (the pretend age would stay in
the radix tree as prompt, never compressed), so its warm requests carry the prompt alone and
reach the long-run holding within budget + buffer steps. ``n`` is the engine's own long-run
running count (``own_count``, ``--warm-start auto``): with fewer, the places left are filled
at age 0 and start cold; with more, aged requests queue where a long run queues new ones.
Both engines draw from one seeded sequence, so their first min(n) warm requests ask for the
same tokens. What stays of the cold start is each engine's admission settling on its warm set
(stock's retraction cycle included), not a first wave.

Pure functions over the load's rows (bench_serving's DatasetRow, duck-typed: ``prompt`` a list
of token ids, ``prompt_len``, ``output_len``) and a seeded numpy generator.
"""

from __future__ import annotations

from typing import List, Sequence, Tuple

import numpy as np

from sglang_zipage.harness import sizing


def draw(n: int, full_len: int, range_ratio: float, seed: int) -> List[Tuple[int, int]]:
    """``n`` (length, age) pairs of a long run's running set: length-biased, age uniform over
    [0, length) (so at least one token remains)."""
    rng = np.random.default_rng(seed)
    lengths = sizing.output_lengths(full_len, range_ratio)
    picked = rng.choice(lengths, size=n, p=lengths / lengths.sum())
    return [(int(l), int(rng.integers(0, l))) for l in picked]


def mean_age(full_len: int, range_ratio: float) -> float:
    """The mean age of a long-run running request (steps)."""
    return sizing.mean_held(sizing.output_lengths(full_len, range_ratio), lambda t: t)


def own_count(info: dict, input_len: int, full_len: int, range_ratio: float) -> int:
    """The warm start's size for an engine (``--warm-start auto``): the requests its pool
    (``info``: a result file's server info, probe.info_summary) holds at what one of its
    requests holds on average in a long run (sizing.py; prompt and output lengths both spread
    by ``range_ratio``, as bench_serving draws them): stock's prompt + age, zipage's at its
    budget, or its floor where it has a budget range (prompt + age where it never compresses)."""
    held = sizing.engine_held(info) if compresses(info, input_len, full_len, range_ratio) \
        else sizing.stock_held
    return _count(info, input_len, full_len, range_ratio, held)


def compresses(info: dict, input_len: int, full_len: int, range_ratio: float) -> bool:
    """Whether an engine's requests compress in a long run above capacity (else its warm
    requests carry their ages in their prompts, as stock's do): zipage's in fixed mode always;
    in elastic mode only where its running cap (``max_running_requests``) lets more requests
    run than its pool holds uncompressed. SGLang caps speculative decoding at 48 requests,
    which a pool of 8k outputs on an H100 holds whole (speculative-steady-cap48-h100.json)."""
    config = sizing.zipage_config(info)
    if config is None:
        return False
    if config.get("mode", "elastic") != "elastic":
        return True
    cap = info.get("max_running_requests")
    return not cap or cap > _count(info, input_len, full_len, range_ratio, sizing.stock_held)


def _count(info, input_len, full_len, range_ratio, held_of) -> int:
    held = sizing.long_run_tokens(sizing.output_lengths(input_len, range_ratio),
                                  sizing.output_lengths(full_len, range_ratio), held_of)
    return sizing.running_count(info["max_total_num_tokens"], held)


def pretend_ids(prompt: Sequence[int], n: int, vocab: int) -> List[int]:
    """``n`` more token ids after ``prompt``, continuing its run of consecutive ids as
    bench_serving's random-ids prompts do (``(offset + i + j) % vocab``)."""
    last = prompt[-1] if len(prompt) else 0
    return [int((last + 1 + j) % vocab) for j in range(n)]


def warm_rows(rows: list, n: int, full_len: int, range_ratio: float, seed: int,
              ages_in_prompt: bool, vocab: int) -> List[dict]:
    """Make the first ``n`` rows the warm set, in place: output_len = remaining length and,
    with ``ages_in_prompt``, the age as pretend prompt tokens. Returns what each became
    (length, age, prompt_len, output_len) for the result file."""
    if n > len(rows):
        raise ValueError(f"a warm start of {n} requests needs at least as many prompts; "
                         f"the load has {len(rows)}")
    if ages_in_prompt and any(isinstance(row.prompt, str) for row in rows[:n]):
        raise ValueError("ages go into prompts of token ids (bench_serving --tokenize-prompt)")
    made = []
    for row, (length, age) in zip(rows[:n], draw(n, full_len, range_ratio, seed)):
        if ages_in_prompt and age:
            row.prompt = list(row.prompt) + pretend_ids(row.prompt, age, vocab)
            row.prompt_len = len(row.prompt)
            row.text_prompt_len = row.prompt_len
        row.output_len = length - age
        made.append(dict(length=length, age=age, prompt_len=row.prompt_len,
                         output_len=row.output_len))
    return made


def burst_then(get_request, n: int):
    """bench_serving's arrival generator with its first ``n`` requests sent at once, the rest
    at its own rate (wraps ``sglang.benchmark.serving.get_request``)."""
    async def arrivals(input_requests, *a, **kw):
        for row in input_requests[:n]:
            yield row
        async for row in get_request(input_requests[n:], *a, **kw):
            yield row
    return arrivals
