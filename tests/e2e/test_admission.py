"""Admission under load (issue 30) on the 2-layer dummy Qwen3, elastic mode (the default),
budget 64 + buffer 16, a 640-token pool, SGLang's strict memory checker after every step.

Booking the running requests' growth at its peak (budget.py A1) admits more than each
request's worst case; a budget range (--zipage-min-kv-budget 32 here) squeezes the largest
running requests when others wait (A2, A3); neither retracts anything, and the soak (client
aborts, per-request budgets) leaves nothing behind.
Run: .venv/bin/python -m pytest tests/e2e/test_admission.py
"""

import json
import subprocess
import sys

import pytest

from zipage_server import REPO, assert_healthy, tiny_range_server

PROMPT, LIMIT, FLOOR = 16, 64 + 16, 32
WORST_CASE_RUNNING = 6  # 640 // (prompt + limit + a page + the allocator's page)


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    yield from tiny_range_server(tmp_path_factory, "admission", FLOOR)


def _prompts(n, first):
    return [list(range(first + 20 * i, first + 20 * i + PROMPT)) for i in range(n)]


def _crowd(server):
    """Eight 300-token requests at once, more than the pool holds at full KV: each finishes,
    none is retracted. Their meta_info."""
    outs = server.generate_ids(_prompts(8, 3000), [
        {"max_new_tokens": 300, "temperature": 0, "ignore_eos": True}] * 8)
    metas = [o["meta_info"] for o in outs]
    assert all(m["completion_tokens"] == 300 for m in metas)
    assert sum(m["num_retractions"] for m in metas) == 0, metas
    return metas


def test_booking_the_peak_runs_more_requests_than_their_worst_cases_fit(server):
    """Twelve requests (160 to 270 tokens) arrive at once. Reserving for each what it may
    still add (prompt + budget + buffer for a new one), six run at a time; booked at their
    peak, the running ones that end soon pay for the young ones' growth, so more run (ten in
    an int simulation of both rules), none is retracted. Their floor is their budget: this
    is booking alone, no squeeze."""
    before = server.zipage_state()
    lens = [160 + 10 * i for i in range(12)]
    outs = server.generate_ids(_prompts(12, 1000), [
        {"max_new_tokens": n, "temperature": 0, "ignore_eos": True, "zipage_min_kv_budget": 64}
        for n in lens])
    metas = [o["meta_info"] for o in outs]
    assert [m["completion_tokens"] for m in metas] == lens
    assert sum(m["num_retractions"] for m in metas) == 0, metas
    after = server.zipage_state()
    assert after["most_running_requests"] >= WORST_CASE_RUNNING + 2, after
    assert after["squeezed_compactions"] == before["squeezed_compactions"]
    assert "KV cache pool is full" not in server.log()
    assert_healthy(server)


def test_waiting_requests_squeeze_the_largest_running_ones_then_budgets_return(server):
    server.idle_and_flushed()
    before = server.zipage_state()
    _crowd(server)
    after = server.zipage_state()
    assert after["squeezed_compactions"] > before["squeezed_compactions"], after
    # the pressure ends once nothing waits: nobody stays squeezed, a lone request keeps
    # its full KV again
    (alone,) = server.generate_ids(_prompts(1, 5000), [
        {"max_new_tokens": 200, "temperature": 0, "ignore_eos": True}])
    assert alone["meta_info"]["zipage_compactions"] == 0
    state = server.zipage_state()
    assert state["running_squeezed_requests"] == 0 and state["elastic_pressure"] is False
    assert "KV cache pool is full" not in server.log()
    assert_healthy(server)


def test_soak_under_booking_and_squeeze_leaves_nothing_behind(server, tmp_path):
    out = tmp_path / "soak.json"
    run = subprocess.run([sys.executable, str(REPO / "benchmarks" / "soak.py"), "--url", server.url,
                          "--input-ids", "--num-requests", "60", "--concurrency", "10",
                          "--seed", "3", "--out", str(out)], capture_output=True, text=True,
                         timeout=1800)
    assert out.exists(), run.stderr[-3000:]
    res = json.loads(out.read_text())
    print({k: res[k] for k in ("requests", "aborted", "completed", "errors", "leaked_slots",
                               "zipage_delta")})
    assert run.returncode == 0, run.stderr[-3000:]
    assert res["errors"] == 0, res["error_samples"]  # completed ones have their max_new_tokens
    assert res["aborted"] > 0 and res["aborted"] + res["completed"] == 60
    assert res["zipage_delta"]["pressure_compactions"] > 0
    assert res["retractions_of_completed"] == 0
    assert res["leaked_slots"] == 0 and res["idle_after"]["idle"]
    assert res["healthy"]
    assert_healthy(server)


def test_a_step_short_of_pages_takes_back_the_loop_guards_raise_before_retracting(server):
    """Greedy outputs of the dummy model repeat themselves, so the loop guard raises the
    budget of every compacted request (up to 4 x 64), past what admission booked for it: a
    decode step then finds the pool short. No budget range here (the floor is the budget, as
    by default), yet the raised requests give back down to it before SGLang retracts anything
    (A2): every request completes, none retracted."""
    server.idle_and_flushed()
    before = server.zipage_state()
    outs = server.generate_ids(_prompts(8, 7000), [
        {"max_new_tokens": 700, "temperature": 0, "ignore_eos": True,
         "zipage_min_kv_budget": 64}] * 8)
    metas = [o["meta_info"] for o in outs]
    after = server.zipage_state()
    print({k: after[k] - before[k] for k in ("loop_guard_triggers", "squeezed_compactions",
                                              "pressure_compactions")})
    assert all(m["completion_tokens"] == 700 for m in metas)
    assert sum(m["zipage_loop_guard"] for m in metas) >= 4, metas  # the raises happened
    assert sum(m["num_retractions"] for m in metas) == 0, metas
    assert after["squeezed_compactions"] > before["squeezed_compactions"]
    assert "KV cache pool is full" not in server.log()
    assert_healthy(server)


@pytest.fixture(scope="module")
def capped_server(tmp_path_factory):
    yield from tiny_range_server(tmp_path_factory, "admission-capped", FLOOR,
                                 extra=("--max-running-requests", "4"))


def test_a_users_running_request_cap_holds_and_squeezes_nobody(capped_server):
    """SGLang's --max-running-requests is how a user trades throughput for a shorter step (a
    step grows with the batch). The crowd that squeezes above runs here four at a time: the
    cap, not memory, keeps the rest waiting, so nothing is squeezed for them (room.py: a
    squeeze would lose fidelity and admit nobody), every request finishes, none retracted."""
    before = capped_server.zipage_state()
    metas = _crowd(capped_server)
    assert all(m["zipage_compactions"] > 0 for m in metas), metas  # the pool was short
    after = capped_server.zipage_state()
    assert after["most_running_requests"] == 4, after
    assert after["squeezed_compactions"] == before["squeezed_compactions"], after
    assert "KV cache pool is full" not in capped_server.log()
    assert_healthy(capped_server)
