"""Scale-out on SGLang's own engine, on CPU (issue 16).

- Data parallel: ``--dp-size 2`` starts two schedulers under SGLang's data-parallel
  controller (round robin). Each replica compresses on its own, /server_info lists both
  replicas' zipage state, and a per-request ``zipage_kv_budget`` reaches the replica that
  serves the request. Runs on the 2-layer dummy Qwen3 of the soak test (fast on a CPU).
Not covered here yet: tensor parallel and sglang-router (issue 16 stays open for them).
Run: .venv/bin/python -m pytest tests/e2e/test_scale_out.py
"""

import shutil
from concurrent.futures import ThreadPoolExecutor

import requests

from zipage_server import (POOL_TOKENS, SMALL_BUDGET, STRICT_MEM_ENV, Server, assert_healthy,
                           tiny_model_dir)

TOKENS = 160  # twice past budget + buffer (80)


def _states(server):
    info = requests.get(server.url + "/server_info", timeout=60).json()
    return [s.get("zipage") for s in info["internal_states"]]


def test_data_parallel_replicas_compress_on_their_own(tmp_path):
    model = tiny_model_dir()
    server = Server(["--model-path", model, "--load-format", "dummy", "--skip-tokenizer-init",
                     "--dp-size", "2", "--max-total-tokens", POOL_TOKENS, *SMALL_BUDGET],
                    tmp_path / "dp.log", env=STRICT_MEM_ENV)
    try:
        limit = _states(server)[0]["budget_limit_tokens"]
        # Round robin over 8 requests gives each replica 4, at most 2 of them opted out.
        budgets = [None] * 6 + [0, 0]

        def run(i):
            params = {"max_new_tokens": TOKENS, "temperature": 0, "ignore_eos": True}
            if budgets[i] is not None:
                params["zipage_kv_budget"] = budgets[i]
            return server.generate_ids([list(range(300 + 20 * i, 316 + 20 * i))], [params])[0]

        with ThreadPoolExecutor(8) as ex:
            outs = list(ex.map(run, range(8)))
        for out, budget in zip(outs, budgets):
            meta = out["meta_info"]
            assert meta["completion_tokens"] == TOKENS
            if budget == 0:  # the replica that served it saw the request's own budget
                assert meta["zipage_compactions"] == 0
                assert meta["zipage_kv_len"] >= meta["prompt_tokens"] + TOKENS - 1
            else:
                assert meta["zipage_compactions"] >= 1
                assert meta["zipage_kv_len"] <= meta["prompt_tokens"] + limit
        states = _states(server)
        assert len(states) == 2 and all(s["active"] for s in states)
        assert all(s["compactions"] >= 2 for s in states), states  # both replicas compressed
        assert all(s["max_suffix_tokens"] <= limit for s in states)
        assert_healthy(server)
    finally:
        assert server.stop() == []
        shutil.rmtree(model, ignore_errors=True)
