"""Reasoning segments on a real server (issue 31): the thinking segment compresses, the answer
never does.

The server runs the bundled model with --reasoning-parser deepseek-r1 and no
--zipage-think-end, so its marker is the parser's ``</think>`` (several tokens of this
tokenizer), and --zipage-answer-budget 32 (budget 64 + buffer 16, fixed mode). Each request is
teacher-forced (zipage_server.force): THINK tokens of thinking, the marker, then ANSWER tokens.
Per request, from meta_info's zipage_kv_len (the physical KV it holds at the end):
  default                 the thinking segment ends compacted to 32 tokens and every token
                          from the marker on is still there: kv_len = prompt + 32 + (out - 1
                          - marker index), + 1 where the last token's KV was written too
  zipage_answer_budget 0  the thinking segment stays as it was when the answer started
                          (64-80 tokens), the answer whole
  zipage_think_end ""     no protection: the answer compresses like the thinking did
Run: .venv/bin/python -m pytest tests/e2e/test_reasoning_segments.py
"""

import random

import pytest

from sglang_zipage.harness.server import STRICT_MEM_ENV, Server
from zipage_server import (CHUNK_TOKENS, POOL_SHARE, POOL_TOKENS, SMALL_BUDGET, _tokenizer,
                           assert_healthy, force, token_ids)

THINK, ANSWER, ANSWER_BUDGET = 300, 150, 32


@pytest.fixture(scope="module")
def reasoning_server(tmp_path_factory):
    srv = Server(["--max-total-tokens", POOL_TOKENS, "--chunked-prefill-size", CHUNK_TOKENS,
                  "--enable-custom-logit-processor", "--reasoning-parser", "deepseek-r1",
                  *SMALL_BUDGET, *POOL_SHARE, "--zipage-mode", "fixed",
                  "--zipage-answer-budget", str(ANSWER_BUDGET)],
                 tmp_path_factory.mktemp("servers") / "reasoning.log", env=STRICT_MEM_ENV)
    yield srv
    srv.stop()


def _reference(marker, seed):
    rng = random.Random(seed)
    return ([rng.randrange(1000, 40000) for _ in range(THINK)] + marker
            + [rng.randrange(1000, 40000) for _ in range(ANSWER)])


def test_the_answer_is_never_evicted_while_the_thinking_compresses(reasoning_server, tmp_path):
    srv = reasoning_server
    srv.idle_and_flushed()
    marker = _tokenizer().encode("</think>", add_special_tokens=False)
    prompt = token_ids("Think step by step: what is 17 times 23?")
    refs = [_reference(marker, seed) for seed in range(3)]
    out = len(refs[0])
    # answer columns written, marker included: all but the last token, whose KV the overlap
    # scheduler may write too (one more forward runs as the request finishes)
    answer = out - 1 - THINK
    recs = force(srv, [prompt] * 3, refs, tmp_path,
                 per_request=[{}, {"zipage_answer_budget": 0}, {"zipage_think_end": ""}])
    default, kept, unprotected = (r["meta_info"] for r in recs)
    limit = srv.zipage_state()["budget_limit_tokens"]  # 64 + 16
    for meta in (default, kept, unprotected):
        assert meta["zipage_compactions"] >= (THINK - limit) // 16  # the thinking compressed
    assert 0 <= default["zipage_kv_len"] - (len(prompt) + ANSWER_BUDGET + answer) <= 1
    thinking = kept["zipage_kv_len"] - len(prompt) - answer
    assert limit - 16 <= thinking <= limit + 1
    assert unprotected["zipage_kv_len"] <= len(prompt) + limit + 1
    state = srv.zipage_state()
    assert state["answers_started"] == 2 and state["answer_compactions"] == 1
    assert_healthy(srv)
