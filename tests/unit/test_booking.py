"""Admission over plain ints (budget.py A1-A3): the running requests' growth booked at its
peak, what a request gives back when the pool is short, the budget range."""

import random

import pytest

from sglang_zipage.budget import Budget, Budgets, peak_growth
from sglang_zipage.config import ZipageConfig, ZipageConfigError
from sglang_zipage.request_options import MIN_BUDGET, move_to_custom_params


def _future(requests, t):
    """F(t) by definition: growth of those still running, minus what the ended give back."""
    return sum(min(t, g) if t < r else -d for g, r, d in requests)


@pytest.mark.parametrize("seed", range(40))
def test_the_peak_is_the_largest_future_growth(seed):
    rng = random.Random(seed)
    requests = []
    for _ in range(rng.randint(0, 30)):
        r = rng.randint(1, 400)
        requests.append((rng.randint(0, r), r, rng.randint(0, 300)))
    horizon = max((r for _, r, _ in requests), default=0) + 2
    assert peak_growth(requests) == max(_future(requests, t) for t in range(horizon))


def test_old_requests_ending_first_pay_for_young_ones_growth():
    young = [(80, 500, 0)] * 4  # may add 80 each, end late
    old = [(0, 10, 96)] * 4  # at their limit, end in 10 steps, give back 96 each
    assert peak_growth(young) == 320  # nothing ends before they grew: the worst case
    assert peak_growth(young + old) == 4 * 9  # 9 steps of growth, then the old ones end
    assert peak_growth([]) == 0 and peak_growth([(0, 5, 10)]) == 0


def _run(pool, prompts, out_len, budget, rule):
    """Decode requests that all run to out_len (fixed mode: compacted at the limit) through
    an admission rule; returns (most tokens held at once, most requests running at once).
    Rules: "worst" (each running request's reserve, a new one's prompt + limit), "peak" (the
    running requests' peak, a new one's prompt + limit), "marginal" (a new one's prompt and
    what it adds to the peak: admission.py), "none" (nothing set aside)."""
    waiting, running, most, most_running = list(prompts), [], 0, 0
    while waiting or running:
        while waiting:
            held = sum(p + s for p, s, _ in running)
            growths = [(budget.reserve(s, out_len - n), out_len - n, min(s, budget.limit))
                       for _, s, n in running]
            new = (budget.limit, out_len, 0)
            need = {"worst": sum(g for g, _, _ in growths) + budget.limit,
                    "peak": peak_growth(growths) + budget.limit,
                    "marginal": peak_growth([*growths, new]), "none": 0}[rule]
            if held + need + waiting[0] + budget.page_size > pool:
                break
            running.append((waiting.pop(0), 0, 0))
        most_running = max(most_running, len(running))
        step = []
        for p, s, n in running:  # one decode step: a token each, compacted at the limit
            s += 1
            if s >= budget.limit:
                s = budget.kv_budget
            if n + 1 < out_len:
                step.append((p, s, n + 1))
        running = step
        most = max(most, sum(p + s for p, s, _ in running))
    return most, most_running


@pytest.mark.parametrize("out_len", [300, 1000])
def test_booking_the_peak_runs_more_requests_and_never_overfills_the_pool(out_len):
    budget, pool = Budget(64, 16, 16), 2000
    prompts = [random.Random(i).randint(16, 48) for i in range(200)]
    worst, peak, marginal, none = (_run(pool, prompts, out_len, budget, rule)
                                   for rule in ("worst", "peak", "marginal", "none"))
    assert max(worst[0], peak[0], marginal[0]) <= pool  # A1: what admission booked is enough
    assert none[0] > pool  # (booking nothing is not)
    assert min(peak[1], marginal[1]) > worst[1]  # ... and less than each one's worst case


def test_a_request_gives_back_down_to_its_budget_then_its_floor():
    b = Budget(64, 16, 16, page_size=8)
    assert b.give_back(80) == 64 and b.give_back(5000) == 64  # past the limit
    assert b.give_back(72) == 64  # a page over the budget (before the limit: A2's second)
    assert b.give_back(71) is None and b.give_back(64) is None  # at its budget
    assert b.squeeze_to(72, 32) == 32 and b.squeeze_to(40, 32) == 32
    assert b.squeeze_to(39, 32) is None  # under a page over the floor
    assert b.squeeze_to(5000, 64) is None  # no range


def test_the_floor_of_a_request():
    budgets = Budgets(Budget(64, 16, 16), least_kv_budget=1, min_kv_budget=32)
    assert budgets.floor(None) == 32 and budgets.floor(None, 48) == 48
    assert budgets.floor(40) == 32 and budgets.floor(24) == 24  # never above its budget
    assert Budgets(Budget(64, 16, 16)).floor(None) == 64  # no range: the budget
    squeezed = budgets.of(None, squeezed_to=32)
    assert squeezed.kv_budget == 32 and squeezed.limit == 48  # A3: its budget while squeezed
    assert budgets.of(None, boost=2).kv_budget == 128  # the loop guard's raise ...
    assert budgets.of(None, boost=2, squeezed_to=32).kv_budget == 32  # ... not while squeezed
    swa = Budgets(Budget(64, 16, 16), least_kv_budget=48, min_kv_budget=32)
    assert swa.floor(None) == 48  # the sliding window holds


def test_a_budget_range_is_checked_once_where_it_is_set():
    ZipageConfig(kv_budget=64, buffer=16, min_kv_budget=32).validate(page_size=16)
    with pytest.raises(ZipageConfigError, match="--zipage-min-kv-budget.*at most the budget"):
        ZipageConfig(kv_budget=64, buffer=16, min_kv_budget=128).validate()
    with pytest.raises(ZipageConfigError, match="--zipage-min-kv-budget.*elastic"):
        ZipageConfig(kv_budget=64, buffer=16, min_kv_budget=32, mode="fixed").validate()
    with pytest.raises(ZipageConfigError, match="--zipage-min-kv-budget.*--page-size 16"):
        ZipageConfig(kv_budget=64, buffer=16, min_kv_budget=40).validate(page_size=16)
    with pytest.raises(ZipageConfigError, match="--zipage-min-kv-budget.*window"):
        ZipageConfig(kv_budget=64, buffer=16, min_kv_budget=8).validate()
    ZipageConfig(kv_budget=64, buffer=16, min_kv_budget=32, compress_prompt=True).validate()


def test_a_requests_floor_rides_in_custom_params_and_is_checked_against_its_budget():
    cfg = ZipageConfig(kv_budget=64, buffer=16)
    params = move_to_custom_params({MIN_BUDGET: 32, "zipage_kv_budget": 48}, cfg, 16)
    assert params["custom_params"] == {MIN_BUDGET: 32, "zipage_kv_budget": 48}
    with pytest.raises(ValueError, match="zipage_min_kv_budget.*at most the budget \\(48\\)"):
        move_to_custom_params({MIN_BUDGET: 64, "zipage_kv_budget": 48}, cfg, 16)
    with pytest.raises(ValueError, match="zipage_min_kv_budget.*page size 16"):
        move_to_custom_params({MIN_BUDGET: 40}, cfg, 16)
    squeezing_prompts = ZipageConfig(kv_budget=64, buffer=16, compress_prompt=True)
    assert move_to_custom_params({MIN_BUDGET: 32}, squeezing_prompts, 16)["custom_params"] == {
        MIN_BUDGET: 32}
