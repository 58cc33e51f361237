"""Elastic budget (``--zipage-mode elastic``, issue 17) on the 2-layer dummy Qwen3.

The budget is a floor: a request alone keeps its full KV (no compaction, the same tokens as
with compression off for it, under the same batch composition: alone); when more requests
run than the pool holds at full length, over-budget requests are compacted down to their
budget on demand (a decode step's pages, or the first waiting request), so nobody is
retracted and every request completes.
Run: .venv/bin/python -m pytest tests/e2e/test_elastic.py
"""

import shutil

import pytest

from sglang_zipage.harness.engines import tiny_model_dir
from sglang_zipage.harness.server import STRICT_MEM_ENV, Server
from zipage_server import POOL_TOKENS, SMALL_BUDGET, assert_healthy

ALONE_TOKENS = 500  # 16 + 500 columns: fits the 640-token pool, 6x the budget + buffer
CROWD, CROWD_TOKENS = 8, 300  # 8 x 316 columns: four times the pool


@pytest.fixture(scope="module")
def elastic_server(tmp_path_factory):
    model = tiny_model_dir()
    srv = Server(["--model-path", model, "--load-format", "dummy", "--skip-tokenizer-init",
                  "--max-total-tokens", POOL_TOKENS, "--zipage-mode", "elastic", *SMALL_BUDGET],
                 tmp_path_factory.mktemp("elastic") / "elastic.log", env=STRICT_MEM_ENV)
    yield srv
    srv.stop()
    shutil.rmtree(model, ignore_errors=True)


def _params(tokens, budget=None):
    p = {"max_new_tokens": tokens, "temperature": 0, "ignore_eos": True}
    return p if budget is None else {**p, "zipage_kv_budget": budget}


def test_alone_it_keeps_full_kv_and_the_tokens_of_no_compression(elastic_server):
    prompt = [list(range(500, 516))]
    outs = {}
    before = elastic_server.zipage_state()
    for budget in (None, 0):  # the server's budget (64), then compression off for it
        elastic_server.idle_and_flushed()
        (out,) = elastic_server.generate_ids(prompt, [_params(ALONE_TOKENS, budget)])
        outs[budget] = out
        assert out["meta_info"]["zipage_compactions"] == 0
        assert out["meta_info"]["zipage_kv_len"] >= 16 + ALONE_TOKENS - 1
    assert outs[None]["output_ids"] == outs[0]["output_ids"]
    after = elastic_server.zipage_state()
    assert after["compactions"] == 0
    # every decoded token (the first comes from prefill) came from full KV
    decoded = after["decode_tokens"] - before["decode_tokens"]
    assert 2 * (ALONE_TOKENS - 1) <= decoded <= 2 * ALONE_TOKENS
    assert after["compressed_decode_tokens"] == before["compressed_decode_tokens"]


def test_under_pressure_it_compresses_instead_of_retracting(elastic_server):
    elastic_server.idle_and_flushed()
    before = elastic_server.zipage_state()
    prompts = [list(range(600 + 20 * i, 616 + 20 * i)) for i in range(CROWD)]
    outs = elastic_server.generate_ids(prompts, [_params(CROWD_TOKENS)] * CROWD)
    metas = [o["meta_info"] for o in outs]
    assert all(m["completion_tokens"] == CROWD_TOKENS for m in metas)
    assert sum(m["num_retractions"] for m in metas) == 0, metas
    assert sum(m["zipage_compactions"] > 0 for m in metas) >= CROWD // 2, metas
    assert all(m["zipage_pressure_compactions"] == m["zipage_compactions"] for m in metas)
    after = elastic_server.zipage_state()
    pressure = after["pressure_compactions"] - before["pressure_compactions"]
    assert pressure == after["compactions"] - before["compactions"] > 0  # all on demand
    # a share of the tokens came from compressed KV: not none (the crowd is 4x the pool),
    # not all (every request starts with full KV)
    decoded = after["decode_tokens"] - before["decode_tokens"]
    compressed = after["compressed_decode_tokens"] - before["compressed_decode_tokens"]
    assert CROWD * (CROWD_TOKENS - 1) <= decoded <= CROWD * CROWD_TOKENS
    assert 0 < compressed < decoded
    assert after["pressure_episodes"] > before["pressure_episodes"]
    # Pressure ends once nothing waits and the pool holds what runs: alone again, a request
    # keeps its full KV (it would compress at its limit, as in fixed mode, if it did not).
    (out,) = elastic_server.generate_ids([list(range(700, 716))], [_params(ALONE_TOKENS)])
    assert out["meta_info"]["zipage_compactions"] == 0
    assert out["meta_info"]["zipage_kv_len"] >= 16 + ALONE_TOKENS - 1
    assert elastic_server.zipage_state()["elastic_pressure"] is False
    assert "KV cache pool is full" not in elastic_server.log()
    assert_healthy(elastic_server)
