"""--zipage-compress-prompt (own_prompt.py) on the bundled model: fixed mode, budget 64 +
buffer 16, a 640-token pool, prompts prefilled in chunks of 64, SGLang's strict memory checker
after every step, the loop guard off (a raised budget would blur the KV bounds).

A prompt no other running request holds compresses with the output: the request ends holding
at most its limit, not prompt + limit, and the radix cache keeps the prompt for the next
request. A prefix another running request holds stays shared: only the rest is copied.
Run: .venv/bin/python -m pytest tests/e2e/test_compress_prompt.py
"""

import shutil
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from sglang_zipage.harness.engines import tiny_model_dir
from sglang_zipage.harness.probe import loads
from sglang_zipage.harness.server import STRICT_MEM_ENV, Server
from zipage_server import (CHUNK_TOKENS, COMMON_ARGS, FIXED_MODE, POOL_TOKENS, SMALL_BUDGET,
                           assert_healthy)

LIMIT = 64 + 16
PROMPT = 160  # two budgets: kept whole, the prompt alone would outgrow the limit


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    srv = Server([*COMMON_ARGS, *SMALL_BUDGET, *FIXED_MODE, "--zipage-no-loop-guard",
                  "--zipage-compress-prompt",
                  # the window scorer: its first compaction waits for a full window, which
                  # gives test_the_copied_prompt_reads_as_the_original its steps before it
                  "--zipage-scorer", "window"],
                 tmp_path_factory.mktemp("compress-prompt") / "server.log", env=STRICT_MEM_ENV)
    yield srv
    srv.stop()


def _ids(first, n):
    return list(range(first, first + n))


def _greedy(n, **extra):
    return {"max_new_tokens": n, "temperature": 0, "ignore_eos": True, **extra}


def test_an_unshared_prompt_compresses_with_the_output_and_stays_cached(server):
    server.idle_and_flushed()
    before = server.zipage_state()
    (out,) = server.generate_ids([_ids(1000, PROMPT)], [_greedy(200)])
    meta = out["meta_info"]
    assert meta["completion_tokens"] == 200 and meta["zipage_compactions"] >= 2, meta
    # prompt + output = 360 tokens; the prompt's own copy compressed with the output
    assert meta["zipage_kv_len"] <= LIMIT, meta
    after = server.zipage_state()
    assert after["prompt_copies"] == before["prompt_copies"] + 1, after
    assert after["prompt_tokens_owned"] == before["prompt_tokens_owned"] + PROMPT, after
    # the tree kept the prompt (evictable): the same prompt again hits the cache
    (again,) = server.generate_ids([_ids(1000, PROMPT)], [_greedy(20)])
    assert again["meta_info"]["cached_tokens"] >= PROMPT - 1, again["meta_info"]
    assert "KV cache pool is full" not in server.log()
    assert_healthy(server)


def test_a_prompt_whose_last_chunk_adds_no_full_page(tmp_path):
    """Pages of 16, chunks of 64 and 2 x 64 + 7 prompt tokens: the tree has every full page
    of the prompt before its last chunk's result, which the overlap scheduler processes after
    the request's first decode step was planned, where its prompt is copied. That late insert
    must not take the copy back (it freed the copy, and compactions then freed tree pages):
    the strict memory checker, the request's limit and the prompt cached after it say so."""
    model = tiny_model_dir()
    srv = Server(["--model-path", model, "--load-format", "dummy", "--skip-tokenizer-init",
                  "--max-total-tokens", POOL_TOKENS, "--chunked-prefill-size", CHUNK_TOKENS,
                  "--page-size", "16", *SMALL_BUDGET, *FIXED_MODE, "--zipage-no-loop-guard",
                  "--zipage-compress-prompt"], tmp_path / "p.log", env=STRICT_MEM_ENV)
    try:
        prompt = _ids(900, 2 * int(CHUNK_TOKENS) + 7)
        (out,) = srv.generate_ids([prompt], [_greedy(200)])
        meta = out["meta_info"]
        assert meta["completion_tokens"] == 200 and meta["zipage_compactions"] >= 2, meta
        assert meta["zipage_kv_len"] <= LIMIT, meta
        state = srv.zipage_state()
        assert (state["prompt_copies"], state["prompt_tokens_owned"]) == (1, 128), state
        (again,) = srv.generate_ids([prompt], [_greedy(20)])
        assert again["meta_info"]["cached_tokens"] >= 128, again["meta_info"]
        assert_healthy(srv)
    finally:
        srv.stop()
        shutil.rmtree(model, ignore_errors=True)


def test_the_copied_prompt_reads_as_the_original(server):
    """Before its first compaction (12 tokens: its window of 16 is not full yet) a request
    that copied its prompt decodes what the same request does without compression
    (zipage_kv_budget 0), each alone on an empty cache: the same batches, the same KV."""
    outs = []
    for extra in ({"zipage_kv_budget": 0}, {}):
        server.idle_and_flushed()
        before = server.zipage_state()
        (out,) = server.generate_ids([_ids(7000, PROMPT)], [_greedy(12, **extra)],
                                     return_logprob=True)
        meta = out["meta_info"]
        copies = server.zipage_state()["prompt_copies"] - before["prompt_copies"]
        assert copies == (0 if extra else 1) and meta["zipage_compactions"] == 0
        outs.append(meta["output_token_logprobs"])
    assert outs[0] == outs[1]  # (logprob, token id) of every output token


def test_a_prefix_a_running_request_holds_stays_shared(server):
    """A request that never compresses (zipage_kv_budget 0) holds a 96-token prefix while
    another with the same prefix starts: that one copies its own 32 tokens only."""
    server.idle_and_flushed()
    prefix = _ids(3000, 96)
    holder = threading.Thread(target=server.generate_ids, args=(
        [prefix + _ids(5000, 32)], [_greedy(250, zipage_kv_budget=0)]))
    holder.start()
    deadline = time.monotonic() + 600
    while loads(server.url)["num_running_reqs"] == 0:
        assert time.monotonic() < deadline, "the holder never started"
        time.sleep(0.2)
    before = server.zipage_state()
    (out,) = server.generate_ids([prefix + _ids(6000, 32)], [_greedy(150)])
    after = server.zipage_state()
    holder.join()
    meta = out["meta_info"]
    assert meta["cached_tokens"] >= 96, meta
    assert after["prompt_tokens_owned"] - before["prompt_tokens_owned"] == 32, after
    assert meta["zipage_compactions"] >= 1 and meta["zipage_kv_len"] <= 96 + LIMIT, meta
    assert_healthy(server)


def test_a_retracted_request_copies_its_prompt_again(tmp_path):
    """SGLang's test hook retracts a running request every 40 forwards: its lock and pages go
    back as SGLang releases them, it re-prefills and copies its prompt again, and every
    request completes within its limit (the 2-layer dummy Qwen3: bookkeeping only)."""
    model = tiny_model_dir()
    env = {**STRICT_MEM_ENV, "SGLANG_TEST_RETRACT": "1", "SGLANG_TEST_RETRACT_INTERVAL": "40"}
    srv = Server(["--model-path", model, "--load-format", "dummy", "--skip-tokenizer-init",
                  "--max-total-tokens", POOL_TOKENS, "--chunked-prefill-size", CHUNK_TOKENS,
                  *SMALL_BUDGET, *FIXED_MODE, "--zipage-no-loop-guard",
                  "--zipage-compress-prompt"], tmp_path / "r.log", env=env)
    try:
        before = srv.zipage_state()["prompt_copies"]
        with ThreadPoolExecutor(3) as ex:
            outs = list(ex.map(lambda i: srv.generate_ids(
                [_ids(300 + 200 * i, 100)], [_greedy(200)])[0], range(3)))
        metas = [o["meta_info"] for o in outs]
        assert all(m["completion_tokens"] == 200 for m in metas), metas
        retractions = sum(m["num_retractions"] for m in metas)
        assert retractions > 0, metas
        assert all(m["zipage_compactions"] > 0 and m["zipage_kv_len"] <= LIMIT for m in metas), metas
        assert srv.zipage_state()["prompt_copies"] - before > 3, metas
        assert_healthy(srv)
    finally:
        srv.stop()
        shutil.rmtree(model, ignore_errors=True)

