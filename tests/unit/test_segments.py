"""Think segments over plain values (issue 31): finding the marker in the output as it grows,
the answer's first column (I5), and the thinking segment's one last compaction.
Run: .venv/bin/python -m pytest tests/unit/test_segments.py
"""

from types import SimpleNamespace

from sglang_zipage.budget import Budget
from sglang_zipage.counters import Counters
from sglang_zipage.request_state import ReqState
from sglang_zipage.segments import Segments, find

MARKER = [9, 8, 7]


def request(output, answer_budget=None, prompt=20, kv_len=None, idx=100):
    custom = {"zipage_think_end": MARKER}
    if answer_budget is not None:
        custom["zipage_answer_budget"] = answer_budget
    return SimpleNamespace(output_ids=output, origin_input_ids=list(range(prompt)),
                           sampling_params=SimpleNamespace(custom_params=custom),
                           kv_committed_len=kv_len, req_pool_idx=3, decode_batch_idx=idx)


def test_find_the_marker_from_where_the_last_scan_stopped():
    assert find([1, 9, 8, 7, 2], MARKER) == 1 and find([9, 8, 1, 9, 8, 7], MARKER, 1) == 3
    assert find([9, 8], MARKER) == -1 and find([1, 9, 8, 7], MARKER, 2) == -1
    seg, st = Segments(), ReqState(c0=16, pos_offset=50)
    out = [1] * 40 + [9, 8]
    assert not seg.scan(request(out), st) and st.think_scanned == 42
    out += [7, 4, 4]  # the marker completes across two scans
    assert seg.scan(request(out), st)
    assert st.answer_col == 20 + 40 - 50  # prompt + its output index, in columns (I5)


def test_the_thinking_segment_compacts_once_down_to_the_answer_budget_keeping_the_answer():
    stats, budget = Counters(), Budget(64, 16, 16)
    st = ReqState(c0=16, answer_col=16 + 70, window_since=90)  # 70 thinking columns
    seg = Segments(answer_budget=32)
    req = request([], kv_len=16 + 70 + 12, idx=100)
    assert seg.answer_cut(req, st, budget, 1, stats) is None  # window filling
    req.decode_batch_idx = 106
    # (thinking columns, kept, answer columns behind them)
    assert seg.answer_cut(req, st, budget, 1, stats) == (70, 32, 12)
    assert st.answer_done and seg.answer_cut(req, st, budget, 1, stats) is None
    # no answer budget: the thinking segment stays unless it outgrew its limit
    st = ReqState(c0=16, answer_col=16 + 70)
    assert Segments().answer_cut(request([], kv_len=200), st, budget, 1, stats) is None
    assert st.answer_done
    st = ReqState(c0=0, answer_col=500)  # grown past the limit (elastic): down to the budget
    assert Segments().answer_cut(request([], kv_len=520), st, budget, 16, stats) == (496, 64, 24)
    assert stats["answer_compactions"] == 2
    # a request's own answer budget of 0 turns the last compaction off
    st = ReqState(c0=16, answer_col=16 + 70)
    assert seg.answer_cut(request([], 0, kv_len=100), st, budget, 1, stats) is None
