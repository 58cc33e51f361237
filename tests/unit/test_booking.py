"""Admission over plain ints (budget.py A1-A3): the running requests' growth booked at its
peak, what a request gives back when the pool is short, the budget range."""

import random

import pytest

from sglang_zipage.admission import END_LAG
from sglang_zipage.budget import Budget, Budgets, cycle_peak, peak_growth
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


def _cycle(first_drops, period, t):
    """C(t) by definition: a token a step, ``period`` given back at each drop by t."""
    return sum(t - period * sum(1 for k in range(t + 1) if f + k * period <= t)
               for f in first_drops)


@pytest.mark.parametrize("seed", range(40))
def test_the_cycle_peak_is_the_largest_future_growth_of_requests_at_their_budget(seed):
    rng = random.Random(seed)
    period = rng.randint(1, 20)
    drops = [rng.randint(1, period + 3) for _ in range(rng.randint(0, 25))]
    horizon = 3 * (max(drops, default=0) + period)
    assert cycle_peak(drops, period) == max(_cycle(drops, period, t) for t in range(horizon))


def test_spread_drops_book_about_one_drop_where_each_limit_books_half_a_buffer_each():
    period = 16
    spread = [1 + i % period for i in range(64)]  # a long run: every phase of the cycle
    assert cycle_peak(spread, period) <= 64  # n/period drops a step: C stays near 0
    assert sum(f for f in spread) == 64 * 17 // 2  # each one's own peak: what A1 would book
    together = [16] * 64  # a first wave: every request at the same phase
    assert cycle_peak(together, period) == 64 * 15  # one rise together: A1's booking
    assert cycle_peak([], period) == 0


def _run(pool, jobs, budget, rule):
    """Decode ``jobs`` ((prompt, output length) each, run to their length; fixed mode:
    compacted at the limit) through an admission rule; returns (most tokens held at once,
    most requests running at once, requests running at each step).
    Rules: "worst" (each running request's reserve, a new one's prompt + limit), "peak" (the
    running requests' peak, a new one's prompt + limit), "marginal" (a new one's prompt and
    what it adds to the peak: admission.py), "cycle" (marginal, and those that hold their
    budget booked by their cycle: A1c, as admission.py books them), "none" (nothing set
    aside)."""
    waiting, running, most, most_running, counts = list(jobs), [], 0, 0, []
    while waiting or running:
        while waiting:
            held = sum(p + s for p, s, _ in running)
            growths = [(budget.reserve(s, left), left, min(s, budget.limit))
                       for _, s, left in running]
            new = (budget.limit, waiting[0][1], 0)
            cycles = [budget.steps_to_cycle(s, left) for _, s, left in running]
            rising = [g if c is None else (0, left, budget.kv_budget)
                      for c, g, (_, _, left) in zip(cycles, growths, running)]
            drops = [c + END_LAG for c in cycles if c is not None]
            need = {"worst": sum(g for g, _, _ in growths) + budget.limit,
                    "peak": peak_growth(growths) + budget.limit,
                    "marginal": peak_growth([*growths, new]),
                    "cycle": peak_growth([*rising, new]) + cycle_peak(drops, budget.cycle),
                    "none": 0}[rule]
            if held + need + waiting[0][0] + budget.page_size > pool:
                break
            prompt, out_len = waiting.pop(0)
            running.append((prompt, 0, out_len))
        most_running = max(most_running, len(running))
        counts.append(len(running))
        step = []
        for p, s, left in running:  # one decode step: a token each, compacted at the limit
            s += 1
            if s >= budget.limit:
                s = budget.kv_budget
            if left > 1:
                step.append((p, s, left - 1))
        running = step
        most = max(most, sum(p + s for p, s, _ in running))
    return most, most_running, counts


@pytest.mark.parametrize("out_len", [300, 1000])
def test_booking_the_peak_runs_more_requests_and_never_overfills_the_pool(out_len):
    budget, pool = Budget(64, 16, 16), 2000
    jobs = [(random.Random(i).randint(16, 48), out_len) for i in range(200)]
    worst, peak, marginal, cycle, none = (
        _run(pool, jobs, budget, rule)
        for rule in ("worst", "peak", "marginal", "cycle", "none"))
    # A1, A1c: what admission booked is enough
    assert max(worst[0], peak[0], marginal[0], cycle[0]) <= pool
    assert none[0] > pool  # (booking nothing is not)
    assert min(peak[1], marginal[1]) > worst[1]  # ... and less than each one's worst case


def test_where_ends_are_staggered_booking_the_cycle_runs_more_and_never_overfills():
    """Outputs of 8-16 budgets (as 8k-16k at budget 1024), prompts compressed (a few
    tokens): requests start at every phase of their cycle, so those at their budget give
    back about as much each step as they add (A1c), and the pool fills with them instead of
    with what their rise to the limit would book."""
    budget, pool, rng = Budget(256, 64, 32), 30000, random.Random(0)
    jobs = [(rng.randint(0, 32), rng.randint(2048, 4096)) for _ in range(500)]
    marginal, cycle = (_run(pool, jobs, budget, rule) for rule in ("marginal", "cycle"))
    assert max(marginal[0], cycle[0]) <= pool

    def busy(counts):  # the mean over the middle half of the run: past the fill, before the drain
        mid = counts[len(counts) // 4: len(counts) * 3 // 4]
        return sum(mid) / len(mid)

    assert busy(cycle[2]) > busy(marginal[2]) * 1.04  # more requests running (measured 1.06x)


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
    swa = Budgets(Budget(64, 16, 16), least_kv_budget=48, min_kv_budget=48)
    assert swa.floor(None) == 48 and swa.problem(None, None) is None
    # a request's own budget or floor below the sliding window is refused (HTTP 400), and
    # never raised to it in silence: it does not compress
    assert swa.problem(32, None) == ("zipage_kv_budget", 32)
    assert swa.problem(64, 32) == ("zipage_min_kv_budget", 32)
    assert swa.of(32) is None and swa.of(64).kv_budget == 64
    with pytest.raises(AssertionError, match="refused at startup"):
        Budgets(Budget(64, 16, 16), least_kv_budget=48, min_kv_budget=32)


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


def _speculative_run(pool, jobs, budget, admission, k, reserve, seed):
    """Decode ``jobs`` ((prompt, output length) each) with speculative steps, admitted by
    ``admission`` (admission.Admission) as the hooks use it: the first waiting request joins
    while what the running ones hold, their booked growth and its need fit the pool. A step:
    requests at or past their limit compact to their budget; each holds ``reserve`` columns
    past its committed ones while the step runs; the step commits 1 .. k tokens each (seeded);
    finished ones leave. Returns (most columns held at once, most requests running)."""
    from types import SimpleNamespace

    from sglang_zipage.request_state import ReqState

    rng = random.Random(seed)
    waiting = [SimpleNamespace(origin_input_ids=[0] * p, output_ids=[], kv_committed_len=p,
                               kv=SimpleNamespace(kv_allocated_len=p), zipage=ReqState(c0=p),
                               sampling_params=SimpleNamespace(max_new_tokens=n),
                               finished=lambda: False) for p, n in jobs]
    running, most, most_running = [], 0, 0
    while waiting or running:
        while waiting:
            growths = admission.growths(running)
            held = sum(r.kv.kv_allocated_len for r in running)
            if (held + admission.reserved(running, growths, 1.0)
                    + admission.need(waiting[0], growths, budget.page_size) > pool):
                break
            running.append(waiting.pop(0))
        most_running = max(most_running, len(running))
        for r in running:
            suffix = r.kv_committed_len - r.zipage.c0
            if suffix >= budget.limit:  # compacted, the columns in flight shifted with it
                evicted = suffix - budget.kv_budget
                r.kv_committed_len -= evicted
                r.kv.kv_allocated_len -= evicted
            r.kv.kv_allocated_len = max(r.kv.kv_allocated_len, r.kv_committed_len + reserve)
        most = max(most, sum(r.kv.kv_allocated_len for r in running))
        for r in running:
            left = r.sampling_params.max_new_tokens - len(r.output_ids)
            accepted = min(left, rng.randint(1, k))
            r.output_ids += [1] * accepted
            r.kv_committed_len += accepted
        running = [r for r in running if len(r.output_ids) < r.sampling_params.max_new_tokens]
    return most, most_running


@pytest.mark.parametrize("seed", range(3))
def test_speculative_steps_are_booked_in_token_time_and_never_overfill_the_pool(seed):
    """A step that commits up to k tokens and a reserve held past the committed ones: the
    booking in token time (fast growth, late ends, the limit passed by k - 1, the reserve
    charged at once) keeps the pool from overfilling; the booking of one token a step does
    not."""
    from sglang_zipage.admission import Admission

    budget, pool, k, reserve = Budget(64, 16, 16), 3000, 4, 8
    rng = random.Random(seed)
    jobs = [(rng.randint(16, 48), rng.randint(200, 600)) for _ in range(150)]
    speculative = Admission(lambda req: budget, speculative_reserve=reserve, tokens_per_step=k)
    plain = Admission(lambda req: budget)
    most, running = _speculative_run(pool, jobs, budget, speculative, k, reserve, seed)
    assert most <= pool
    assert most > 0.8 * pool and running > 20  # and it still fills the pool
    assert _speculative_run(pool, jobs, budget, plain, k, reserve, seed)[0] > pool


def test_a_booked_peak_covers_steps_that_commit_several_tokens():
    """Old requests near their end that accept one token a step (so end late) beside new
    ones that accept 4 (so grow fast): booked one token a step, the new ones' growth before
    the old ones leave is a quarter of what they grow; booked in token time it is covered."""
    from types import SimpleNamespace

    from sglang_zipage.admission import Admission
    from sglang_zipage.request_state import ReqState

    budget, k, reserve = Budget(64, 16, 16), 4, 8

    def req(suffix, remaining, rate):
        n = suffix + remaining
        return SimpleNamespace(origin_input_ids=[0] * 32, output_ids=[1] * suffix, rate=rate,
                               kv_committed_len=32 + suffix,
                               kv=SimpleNamespace(kv_allocated_len=32 + suffix + reserve),
                               zipage=ReqState(c0=32), finished=lambda: False,
                               sampling_params=SimpleNamespace(max_new_tokens=n))

    def reqs():
        return [req(70, 6, 1) for _ in range(10)] + [req(1, 500, k) for _ in range(10)]

    def most_growth(running):  # each step commits each request's rate
        start = most = sum(r.kv.kv_allocated_len for r in running)
        for _ in range(40):
            for r in running:
                left = r.sampling_params.max_new_tokens - len(r.output_ids)
                r.output_ids += [1] * min(r.rate, left)
                r.kv_committed_len += min(r.rate, left)
                if r.kv_committed_len - r.zipage.c0 >= budget.limit:
                    evicted = r.kv_committed_len - r.zipage.c0 - budget.kv_budget
                    r.kv_committed_len -= evicted
                    r.kv.kv_allocated_len -= evicted
                r.kv.kv_allocated_len = max(r.kv.kv_allocated_len, r.kv_committed_len + reserve)
            running = [r for r in running
                       if len(r.output_ids) < r.sampling_params.max_new_tokens]
            most = max(most, sum(r.kv.kv_allocated_len for r in running))
        return most - start

    grown = most_growth(reqs())
    in_tokens = Admission(lambda r: budget, speculative_reserve=reserve, tokens_per_step=k)
    in_steps = Admission(lambda r: budget, speculative_reserve=reserve)
    assert in_tokens.growths(reqs()).peak() >= grown
    assert in_steps.growths(reqs()).peak() < grown


def test_a_speculative_step_needs_what_sglang_allocates_for_it(monkeypatch):
    """Elastic mode makes room for the slots the next decode step allocates: a page per
    request, or with speculative decoding what tops each request's reserve up, as SGLang's
    own estimate (ScheduleBatch._new_tokens_required_next_decode_spec_v2, page size 1)."""
    from types import SimpleNamespace

    from sglang.srt.managers import schedule_batch

    from sglang_zipage.admission import Admission

    reserve = 10
    monkeypatch.setattr(schedule_batch, "get_alloc_reserve_per_decode", lambda *a: reserve)
    rng = random.Random(0)
    reqs = [SimpleNamespace(kv_committed_len=c,
                            kv=SimpleNamespace(kv_allocated_len=c + rng.randint(0, 2 * reserve)))
            for c in (rng.randint(50, 500) for _ in range(40))]
    sglang = schedule_batch.ScheduleBatch._new_tokens_required_next_decode_spec_v2(None, reqs, 1)
    assert 0 < Admission(None, speculative_reserve=reserve).step_slots(reqs, 1) == sglang
    assert Admission(None).step_slots(reqs, 16) == 40 * 16


def test_a_decode_server_keeps_room_for_its_largest_request_to_end_alone_at_its_limit():
    """SGLang's PD decode server admits a newcomer only beside room for its largest running
    request to end alone, the others retracted (DecodePreallocQueue._need_space_for_single_req:
    prompt + min(max_new_tokens, 4096), less what they all hold). A request that does not
    compress keeps SGLang's number; a compressing one needs the columns it holds plus what it
    may still add before its limit, and each holds its columns, not its logical length."""
    from types import SimpleNamespace

    from sglang.srt.disaggregation.decode import DecodePreallocQueue

    from sglang_zipage.admission import Admission
    from sglang_zipage.request_state import ReqState

    budget = Budget(64, 16, 16)  # limit 80

    def req(prompt, out, max_new, columns=None):
        return SimpleNamespace(origin_input_ids=[0] * prompt, output_ids=[1] * out,
                               kv_committed_len=prompt + out if columns is None else columns,
                               zipage=ReqState(c0=prompt), finished=lambda: False,
                               sampling_params=SimpleNamespace(max_new_tokens=max_new))

    def sglang(reqs):
        queue = SimpleNamespace(scheduler=SimpleNamespace(running_batch=SimpleNamespace(reqs=reqs)))
        held = sum(len(r.origin_input_ids) + len(r.output_ids) for r in reqs)
        return DecodePreallocQueue._need_space_for_single_req(queue, held)

    plain = [req(17, 30, 1100), req(17, 5, 200)]
    assert Admission(lambda r: None).single_request_room(plain) == sglang(plain) == 1117 - 69
    # the first has written 300 tokens and holds 17 + 50 columns: it may add 30 more before
    # its compaction, the second (5 written) 75; both end within 17 + 80
    running = [req(17, 300, 1100, columns=67), req(17, 5, 200)]
    assert Admission(lambda r: budget).single_request_room(running) == 97 - (67 + 22)
    assert sglang(running) == 1117 - 339  # SGLang's: the first's 1100 tokens, logically
    # a short request ends before its limit: its need is its own end
    short = [req(17, 5, 20)]
    assert Admission(lambda r: budget).single_request_room(short) == 17 + 20 - 22
    assert Admission(lambda r: budget).single_request_room([]) == 0
