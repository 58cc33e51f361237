"""Zipage's buffers inside their share (issue 28), on a real server (CPU).

A share that holds fewer query-window slots than requests reach their limits at the same
step: those with a slot compact with the window, the others without (their most recent
tokens kept, budget W2), counted in /server_info and Prometheus; every request completes,
none outgrows its limit (I6), SGLang's strict memory checker stays clean, and the buffers
stay within the share of the memory SGLang could give the pool (M1).
The share is the memory of N slots (the ring's dump row is one of them) out of all of this
machine's memory, more than SGLang ever gives the pool (memory.py M5), so never N slots; with
no global scores (--zipage-decay 0: W2 does not depend on them) at least one slot fits while
SGLang can give the pool 1/16 of the machine's memory or more, which leaves room for whatever
else runs beside the test. Refusals: test_clean_start.py.
The 2-layer dummy Qwen3 (a window slot costs 16 KiB, a pool token 1 KiB): fast on a CPU.
Run: .venv/bin/python -m pytest tests/e2e/test_memory_share.py
"""

import re

import pytest
import requests

from sglang_zipage import memory, model_support, server_args
from sglang_zipage.harness.engines import tiny_model_dir
from sglang_zipage.harness.server import STRICT_MEM_ENV, Server
from zipage_server import assert_healthy

BUDGET, BUFFER, WINDOW = 64, 32, 16  # buffer > W: a slot goes back after each compaction (W1)
N, PROMPT, OUT = 32, 20, 120  # each request compacts once, all at the same step
POOL, RUNNING = 4096, 32  # all N run at once; M2 alone would give each a slot


def _share(model) -> float:
    """N slots and the slot table out of all of this machine's memory."""
    f = model_support.model_facts(model)
    shapes = memory.BufferShapes(f["layers"], f["kv_heads"], f["query_heads"], f["head_dim"],
                                 f["dtype_bytes"], global_scores=False)
    need = shapes.table_bytes(RUNNING) + N * shapes.slot_bytes(WINDOW)
    return need / server_args.device_memory_bytes("cpu")


@pytest.fixture(scope="module")
def few_slots_server(tmp_path_factory):
    model = tiny_model_dir()
    share = _share(model)
    srv = Server(["--model-path", model, "--load-format", "dummy", "--skip-tokenizer-init",
                  "--max-total-tokens", str(POOL), "--max-running-requests", str(RUNNING),
                  "--zipage-mode", "fixed", "--enable-metrics", "--zipage-decay", "0",
                  "--zipage-kv-budget",
                  str(BUDGET), "--zipage-buffer", str(BUFFER), "--zipage-window", str(WINDOW),
                  "--zipage-memory-fraction", repr(share)],
                 tmp_path_factory.mktemp("share") / "few-slots.log", env=STRICT_MEM_ENV)
    yield srv, share
    srv.stop()


def test_requests_without_a_slot_compact_windowless_within_their_limit(few_slots_server):
    srv, share = few_slots_server
    state = srv.zipage_state()
    plan = state["memory"]
    assert 1 <= state["window_slots"] == plan["window_slots"] < N <= plan["slots_wanted"]
    assert plan["zipage_bytes"] <= share * plan["available_bytes"]  # M1
    assert state["memory_bytes"] <= plan["zipage_bytes"]
    prompts = [[100 + 7 * i + j for j in range(PROMPT)] for i in range(N)]
    greedy = {"max_new_tokens": OUT, "temperature": 0, "ignore_eos": True}
    outs = srv.generate_ids(prompts, [greedy] * N)  # one batch: all reach the limit together
    assert [o["meta_info"]["completion_tokens"] for o in outs] == [OUT] * N
    state = srv.zipage_state()
    windowless = state["windowless_compactions"]
    # each round of compactions: the requests with a slot compact with it, the others without
    assert 0 < windowless < state["compactions"]
    assert state["max_suffix_tokens"] <= BUDGET + BUFFER  # I6: no request waited past it
    metrics = requests.get(srv.url + "/metrics", timeout=30).text
    counted = re.search(r"^zipage:windowless_compactions_total (\S+)$", metrics, re.M)
    assert counted and float(counted.group(1)) == windowless
    assert_healthy(srv)
