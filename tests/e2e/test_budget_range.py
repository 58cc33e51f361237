"""A budget range (issue 30) on the 2-layer dummy Qwen3, elastic mode, budget 64 + buffer 16,
--zipage-min-kv-budget 32, a 640-token pool, SGLang's strict memory checker after every step.

Admission books a request with a range at its floor (budget.py A1), and while requests wait
under pressure the running ones take their floor as their budget (A3), each near its
floor's limit once it has a window slot: more requests run at once than their budgets
allow, their squeezes are scored with their windows (none keeps only its recent tokens),
and nothing is retracted. The server's own counters are lifetime maxima, so this module
has a server of its own.
Run: .venv/bin/python -m pytest tests/e2e/test_budget_range.py
"""

import pytest

from zipage_server import assert_healthy, tiny_range_server

FLOOR = 32


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    yield from tiny_range_server(tmp_path_factory, "budget-range", FLOOR)


def _crowd(server, first, **params):
    """Twelve 16-token prompts x 300 tokens at once; the server's counters before and after."""
    server.idle_and_flushed()
    before = server.zipage_state()
    prompts = [list(range(first + 20 * i, first + 20 * i + 16)) for i in range(12)]
    outs = server.generate_ids(prompts, [{"max_new_tokens": 300, "temperature": 0,
                                          "ignore_eos": True, **params}] * 12)
    metas = [o["meta_info"] for o in outs]
    assert [m["completion_tokens"] for m in metas] == [300] * 12
    assert sum(m["num_retractions"] for m in metas) == 0, metas
    return before, server.zipage_state()


def test_a_range_runs_more_requests_at_once_squeezed_with_their_windows(server):
    # the floor is the budget for these (per request): no range, the budget alone
    _, alone = _crowd(server, 1000, zipage_min_kv_budget=64)
    assert alone["squeezed_compactions"] == 0
    before, after = _crowd(server, 3000)
    print({k: (before[k], after[k]) for k in ("most_running_requests", "squeezed_compactions",
                                               "windowless_compactions", "pressure_compactions")})
    # booked at the floor, more run at once than the budget let run (9 against 6 here;
    # booked at the budget they were 6 too)
    assert after["most_running_requests"] > alone["most_running_requests"]
    assert after["squeezed_compactions"] > before["squeezed_compactions"]
    # every squeeze waited for its window (before, a squeeze without a slot kept its most
    # recent tokens)
    assert after["windowless_compactions"] == before["windowless_compactions"]
    assert "KV cache pool is full" not in server.log()
    assert_healthy(server)
