"""The warm start of steady-state loads (sglang_zipage.harness.warm_start): its requests are a
long run's running set, checked against a simulation of one, and the rows bench_serving sends
are rewritten as it says; the burst comes before the paced stream."""

import asyncio
from dataclasses import dataclass

import numpy as np
import pytest

from sglang_zipage.harness import sizing, warm_start


def running_set_of_a_long_run(places, full_len, range_ratio, steps, seed):
    """(length, age) of every running request after ``steps`` steps of ``places`` places,
    each refilled at once with a fresh request (uniform length) when its request ends."""
    rng = np.random.default_rng(seed)
    lengths = sizing.output_lengths(full_len, range_ratio)
    out = []
    for _ in range(places):
        t = 0
        while True:
            length = int(rng.choice(lengths))
            if t + length > steps:
                out.append((length, steps - t))
                break
            t += length
    return out


def test_the_warm_set_is_drawn_as_a_long_runs_running_set():
    full_len, ratio = 400, 0.5
    sim = running_set_of_a_long_run(4000, full_len, ratio, steps=20 * full_len, seed=1)
    warm = warm_start.draw(4000, full_len, ratio, seed=2)
    for k in (0, 1):  # length and age
        a = np.array([x[k] for x in sim], dtype=float)
        b = np.array([x[k] for x in warm], dtype=float)
        assert abs(a.mean() - b.mean()) < 0.02 * a.mean(), (k, a.mean(), b.mean())
        assert abs(np.median(a) - np.median(b)) < 0.04 * np.median(a), k
    # (a cold start's first running set has every age 0 and unbiased lengths)
    assert np.mean([age for _, age in sim]) == pytest.approx(warm_start.mean_age(full_len, ratio),
                                                             rel=0.03)
    assert all(0 <= age < length for length, age in warm)
    lengths = [length for length, _ in warm]
    assert np.mean(lengths) > np.mean(sizing.output_lengths(full_len, ratio)) + 10  # biased


def test_a_warm_start_is_as_large_as_the_engines_own_long_run_running_set():
    # uniform over [4096, 8192]: mean age E[l^2] / 2E[l] - 1/2 = 39147.5k / 12288 - 0.5
    assert warm_start.mean_age(8192, 0.5) == pytest.approx(3185.3, abs=0.5)
    pool = 749_782
    stock = {"max_total_num_tokens": pool}
    # prompts are spread as outputs are: uniform over [256, 512], mean 384
    assert warm_start.own_count(stock, 512, 8192, 0.5) == int(pool // (384 + 3185.3))
    config = {"enabled": True, "kv_budget": 2048, "buffer": 256, "min_kv_budget": 0,
              "compress_prompt": False}
    zipage = {"max_total_num_tokens": pool, "zipage": {"config": config}}
    kept = warm_start.own_count(zipage, 512, 8192, 0.5)
    # a suffix climbs to 2304 in its first 2304 steps, then cycles around 2176
    assert pool // (384 + 2176) < kept < pool // (384 + 1700)
    squeezed = warm_start.own_count(
        {**zipage, "zipage": {"config": {**config, "min_kv_budget": 1024}}}, 512, 8192, 0.5)
    compressed = warm_start.own_count(
        {**zipage, "zipage": {"config": {**config, "compress_prompt": True}}}, 512, 8192, 0.5)
    assert kept < compressed < squeezed
    assert pool // (384 + 1024 + 128) <= squeezed < pool // (384 + 1000)
    # stock SGLang serves /server_info without a zipage state; --zipage-disable says enabled off
    off = {"max_total_num_tokens": pool, "zipage": {"config": {**config, "enabled": False}}}
    assert warm_start.own_count(off, 512, 8192, 0.5) == warm_start.own_count(stock, 512, 8192, 0.5)


def test_zipage_below_its_running_cap_warms_up_as_stock_does():
    """Elastic mode compresses only under pressure: where the running cap (SGLang's 48 under
    speculative decoding) lets fewer requests run than the pool holds uncompressed, zipage's
    long run is stock's, so its warm requests carry their ages in their prompts."""
    pool = 331_381  # the H100's Qwen3-8B pool of speculative-steady-cap48-h100.json
    config = {"enabled": True, "kv_budget": 2048, "buffer": 256, "min_kv_budget": 1024,
              "compress_prompt": True, "mode": "elastic"}
    stock = {"max_total_num_tokens": pool, "max_running_requests": 48}
    capped = {**stock, "zipage": {"config": config}}
    full = int(pool // (384 + 3185.3))  # 92 requests at prompt + mean age
    assert not warm_start.compresses(capped, 512, 8192, 0.5)
    assert warm_start.own_count(capped, 512, 8192, 0.5) == full
    assert warm_start.own_count(stock, 512, 8192, 0.5) == full
    roomy = {**capped, "max_running_requests": 4096}
    assert warm_start.compresses(roomy, 512, 8192, 0.5)
    assert warm_start.own_count(roomy, 512, 8192, 0.5) > 2 * full
    fixed = {**capped, "zipage": {"config": {**config, "mode": "fixed"}}}
    assert warm_start.compresses(fixed, 512, 8192, 0.5)
    assert not warm_start.compresses(stock, 512, 8192, 0.5)


@dataclass
class Row:  # bench_serving's DatasetRow, the fields warm_rows touches
    prompt: list
    prompt_len: int
    output_len: int
    text_prompt_len: int = 0


def rows(n, vocab):
    return [Row(prompt=[(7 * i + j) % vocab for j in range(32)], prompt_len=32, output_len=400)
            for i in range(n)]


@pytest.mark.parametrize("ages_in_prompt", [True, False])
def test_warm_rows_ask_for_the_remaining_tokens_and_carry_the_age_where_asked(ages_in_prompt):
    vocab = 1000
    load = rows(10, vocab)
    made = warm_start.warm_rows(load, 6, 400, 0.5, seed=3, ages_in_prompt=ages_in_prompt,
                                vocab=vocab)
    drawn = warm_start.draw(6, 400, 0.5, seed=3)
    assert [(m["length"], m["age"]) for m in made] == drawn
    for row, (length, age) in zip(load[:6], drawn):
        assert row.output_len == length - age >= 1
        extra = age if ages_in_prompt else 0
        assert row.prompt_len == len(row.prompt) == 32 + extra
        if extra:
            assert row.text_prompt_len == row.prompt_len  # the run of consecutive ids goes on, within the vocabulary
            assert np.all(np.diff(np.array(row.prompt) % vocab) % vocab == 1)
    assert all(r.output_len == 400 and r.prompt_len == 32 for r in load[6:])  # the stream
    texts = [Row(prompt="t1 t2", prompt_len=2, output_len=400)]
    with pytest.raises(ValueError, match="token ids"):
        warm_start.warm_rows(texts, 1, 400, 0.5, 0, True, vocab)
    with pytest.raises(ValueError, match="at least as many prompts"):
        warm_start.warm_rows(rows(3, vocab), 4, 400, 0.5, 0, True, vocab)


def test_the_warm_set_arrives_at_once_before_the_paced_stream():
    sent = []

    async def paced(input_requests, rate):
        for r in input_requests:
            sent.append(("paced", r))
            yield r

    async def collect():
        return [r async for r in warm_start.burst_then(paced, 3)(list(range(7)), 8.0)]

    assert asyncio.run(collect()) == list(range(7))
    assert [r for how, r in sent] == [3, 4, 5, 6]  # the first three never waited for the pace
