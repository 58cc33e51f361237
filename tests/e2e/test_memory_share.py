"""Zipage's buffers inside the KV pool's share (issue 28), on a real server (CPU).

- A share that holds one query-window slot: four requests reach their limits at the same
  step; one compacts with the window, the others without (their most recent tokens kept,
  budget W2), counted in /server_info and Prometheus; every request completes, none
  outgrows its limit (I6), SGLang's strict memory checker stays clean, and the buffers stay
  within the share.
- A share that cannot hold one slot: the scheduler refuses to start with a message that
  names the bytes and the share that would fit, never an out-of-memory traceback.
The 2-layer dummy Qwen3 (a window slot costs 128 KiB, a pool token 8 KiB): fast on a CPU.
Run: .venv/bin/python -m pytest tests/e2e/test_memory_share.py
"""

import re

import pytest
import requests

from sglang_zipage.harness.engines import tiny_model_dir
from sglang_zipage.harness.server import STRICT_MEM_ENV, Server
from zipage_server import POOL_TOKENS, assert_healthy

BUDGET, BUFFER = 64, 32  # buffer > W: a slot goes back after each compaction (W1)
ONE_SLOT_SHARE = "0.07"  # 640 tokens x 8 KiB: 7% holds the global scores and one slot
N, PROMPT, OUT = 4, 20, 200


def _args(model, share):
    return ["--model-path", model, "--load-format", "dummy", "--skip-tokenizer-init",
            "--max-total-tokens", POOL_TOKENS, "--zipage-mode", "fixed", "--enable-metrics",
            "--zipage-kv-budget", str(BUDGET), "--zipage-buffer", str(BUFFER),
            "--zipage-memory-fraction", share]


@pytest.fixture(scope="module")
def one_slot_server(tmp_path_factory):
    srv = Server(_args(tiny_model_dir(), ONE_SLOT_SHARE),
                 tmp_path_factory.mktemp("share") / "one-slot.log", env=STRICT_MEM_ENV)
    yield srv
    srv.stop()


def test_requests_without_a_slot_compact_windowless_within_their_limit(one_slot_server):
    srv = one_slot_server
    state = srv.zipage_state()
    plan = state["memory"]
    assert state["window_slots"] == plan["window_slots"] == 1
    assert plan["zipage_bytes"] <= float(ONE_SLOT_SHARE) * plan["stock_kv_pool_bytes"]
    assert state["memory_bytes"] <= plan["zipage_bytes"]
    prompts = [[100 + 7 * i + j for j in range(PROMPT)] for i in range(N)]
    greedy = {"max_new_tokens": OUT, "temperature": 0, "ignore_eos": True}
    outs = srv.generate_ids(prompts, [greedy] * N)  # one batch: all reach the limit together
    assert [o["meta_info"]["completion_tokens"] for o in outs] == [OUT] * N
    state = srv.zipage_state()
    windowless = state["windowless_compactions"]
    # each round of compactions: one request with the slot, the others without
    assert 0 < windowless < state["compactions"]
    assert state["max_suffix_tokens"] <= BUDGET + BUFFER  # I6: no request waited past it
    metrics = requests.get(srv.url + "/metrics", timeout=30).text
    counted = re.search(r"^zipage:windowless_compactions_total (\S+)$", metrics, re.M)
    assert counted and float(counted.group(1)) == windowless
    assert_healthy(srv)


def test_a_share_without_room_for_one_slot_is_refused_by_name(tmp_path):
    with pytest.raises(RuntimeError) as e:
        Server(_args(tiny_model_dir(), "0.01"), tmp_path / "refused.log", env=STRICT_MEM_ENV)
    log = str(e.value)
    assert "cannot fit its buffers" in log and "Qwen3ForCausalLM" in log
    wanted = re.search(r"raise --zipage-memory-fraction to ([0-9.]+)", log)
    assert wanted and 0.01 < float(wanted.group(1)) <= float(ONE_SLOT_SHARE)
    assert "OutOfMemory" not in log and "out of memory" not in log.lower()
