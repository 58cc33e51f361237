"""Budget policy over plain ints (when a request compresses, fixed and elastic) and the
scratch bound of a compaction launch."""

from sglang_zipage.budget import Budget, Budgets, Pressure
from sglang_zipage.request_state import ReqState


def _ready(window=16):
    return ReqState(c0=0, window_since=0), window  # window slot held for `window` steps


def test_fixed_mode_compresses_at_the_limit_elastic_never_on_its_own():
    fixed = Budget(64, 16, 16)
    elastic = Budget(64, 16, 16, elastic=True)
    st, idx = _ready()
    assert fixed.needs_compaction(st, 80, idx)
    assert not fixed.needs_compaction(st, 79, idx)
    assert not elastic.needs_compaction(st, 80, idx)
    assert not elastic.needs_compaction(st, 5000, idx)


def test_fixed_mode_asks_for_a_slot_once_so_it_fills_before_the_limit():
    b = Budget(64, 32, 16)  # trigger 96: the window must start at 80
    st = ReqState(c0=0)
    assert not b.wants_window(st, 79)
    assert b.wants_window(st, 80)
    assert not b.wants_window(st, 81)  # too late to fill W=16 queries by 96 (W1)
    st.window_since = 3
    assert not b.wants_window(st, 80)  # holds one
    asynchronous = Budget(64, 16, 16, page_size=8, lag=8)  # trigger 72
    assert asynchronous.wants_window(ReqState(c0=0), 56)
    # the next start lies within W of a compaction: keep the slot rather than miss it
    assert asynchronous.keeps_window and Budget(64, 16, 16).keeps_window
    assert not b.keeps_window and not Budget(64, 48, 16, page_size=8, lag=8).keeps_window


def test_elastic_asks_for_a_slot_every_step_past_the_start():
    b = Budget(64, 16, 16, elastic=True)
    st = ReqState(c0=0)
    assert not b.wants_window(st, 63)
    assert b.wants_window(st, 64) and b.wants_window(st, 5000)


def test_a_request_without_a_slot_compacts_at_its_limit_windowless():
    fixed = Budget(64, 16, 16)
    no_slot = ReqState(c0=0)
    assert fixed.needs_compaction(no_slot, 80, 7)  # W2: never past its limit
    assert not fixed.needs_compaction(no_slot, 79, 7)
    filling = ReqState(c0=0, window_since=5)
    assert not fixed.needs_compaction(filling, 80, 20)  # a slot still filling is waited for
    assert fixed.needs_compaction(filling, 80, 21)


def test_a_request_past_its_limit_reserves_nothing_more():
    b = Budget(64, 16, 16, elastic=True)
    assert b.reserve(40, 1000) == 40
    assert b.reserve(80, 1000) == 0
    assert b.reserve(3000, 1000) == 0  # what it holds past the limit can be reclaimed


def test_long_suffixes_compact_in_launches_of_bounded_scratch():
    from sglang_zipage.compaction import CompactionItem
    from sglang_zipage.planner import MAX_REQS_PER_LAUNCH, SCRATCH_LIMITS, Planner
    from sglang_zipage.policy import RequestBudgets

    planner = Planner(RequestBudgets(Budgets(Budget(64, 16, 16, elastic=True))), None,
                      layout=None, window=None, shadows=None, allocator=None, stats=None,
                      decisions=None, pending=[])
    suffixes = [12000, 80, 3000, 80, 900] + [80] * 40
    items = [CompactionItem(i, 0, s, 0, True, i, 64) for i, s in enumerate(suffixes)]
    groups = list(planner._launch_groups(items))
    assert sorted(it.req_pool_idx for g in groups for it in g) == list(range(len(items)))
    for g in groups:  # padded scratch: requests x longest suffix
        assert len(g) <= MAX_REQS_PER_LAUNCH
        assert len(g) == 1 or len(g) * max(it.suffix for it in g) <= SCRATCH_LIMITS * 80
    assert [it.suffix for it in groups[0]] == [12000]  # alone: more than the cap by itself


def test_elastic_compresses_at_the_limit_only_under_pressure():
    b = Budget(64, 16, 16, elastic=True)
    st, idx = _ready()
    assert not b.needs_compaction(st, 80, idx, pressed=False)
    assert b.needs_compaction(st, 80, idx, pressed=True)
    assert b.needs_compaction(st, 5000, idx, pressed=True)  # grown past it before: down now
    assert not b.needs_compaction(st, 79, idx, pressed=True)
    assert not b.needs_compaction(st, 80, idx - 1, pressed=True)  # window not yet filled


def test_pressure_holds_until_nothing_waits_and_the_pool_covers_what_runs():
    p = Pressure()
    assert not p.settle(room=0, demand=10**6, waiting=5)  # never entered: stays in room
    p.ran_short()
    p.ran_short()  # one episode, however many shortfalls it holds
    assert p.on and p.episodes == 1
    assert p.settle(room=1000, demand=999, waiting=1)  # a request still waits
    assert p.settle(room=1000, demand=1001, waiting=0)  # the running ones could run short
    assert not p.settle(room=1000, demand=1000, waiting=0)
    assert not p.on
    p.ran_short()
    assert p.on and p.episodes == 2
