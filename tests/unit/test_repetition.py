"""The loop guard's measure over token lists (issue 31): repeated n-grams in the last window,
when the guard checks, what it raises, and that outputs without repetition never trigger it.
Run: .venv/bin/python -m pytest tests/unit/test_repetition.py
"""

import random

import pytest

from sglang_zipage.budget import Budget, Budgets
from sglang_zipage.repetition import LoopGuard, repeated_share
from sglang_zipage.request_state import ReqState


def test_repeated_share_counts_ngrams_seen_before():
    assert repeated_share([], 8) == 0.0 and repeated_share(list(range(5)), 8) == 0.0
    assert repeated_share(list(range(100)), 8) == 0.0
    loop = [1, 2, 3, 4] * 25  # 100 tokens, period 4: only the first 4 trigrams are new
    assert repeated_share(loop, 3) == (98 - 4) / 98
    half = list(range(50)) + list(range(50))
    assert abs(repeated_share(half, 8) - 43 / 93) < 1e-12  # the second copy's 8-grams


def test_text_without_repetition_never_triggers_the_guard():
    guard, rng = LoopGuard(), random.Random(0)
    st = ReqState(c0=0)
    out = []
    for _ in range(4000):  # a vocabulary-wide random walk: n-grams practically never repeat
        out.append(rng.randrange(49152))
        assert not guard.watch(st, out)
    assert st.loop_boost == 1 and st.loop_guard == 0


@pytest.mark.parametrize("per_step", [1, 4])  # 4: speculative decoding accepts several
def test_a_loop_doubles_the_budget_once_per_window_up_to_the_cap(per_step):
    guard = LoopGuard(window=400, n=8, threshold=0.5, every=32, max_boost=4)
    rng = random.Random(1)
    out = [rng.randrange(1000, 2000) for _ in range(500)]  # no repetition yet
    st = ReqState(c0=0)
    triggers = []
    for step in range(1200 // per_step):
        for _ in range(per_step):
            out.append(out[-37])  # from here on the text repeats with period 37
        if guard.watch(st, out):
            triggers.append(len(out))
    assert st.loop_boost == 4 and st.loop_guard == 2  # 1 -> 2 -> 4, then capped
    assert triggers[1] - triggers[0] >= guard.window  # one trigger per window of loop
    budgets = Budgets(Budget(64, 16, 16))
    assert budgets.of(None, st.loop_boost).kv_budget == 256
    assert budgets.of(128, 2).kv_budget == 256 and budgets.of(0, 4) is None
    assert budgets.of(None) is budgets.server
