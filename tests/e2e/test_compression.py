"""Compressed PagedAttention inside SGLang, on the real bundled model (issue 4).

Servers (tests/e2e/conftest.py): `zipage_server` (budget 64 + buffer 16), `stock_server`
(--zipage-disable) and `default_server` (budget 2048), all with a 640-token KV pool and
SGLang's strict memory checker on.
Run: .venv/bin/python -m pytest tests/e2e/test_compression.py
"""

import re
import time
from concurrent.futures import ThreadPoolExecutor

from zipage_server import (CHUNK_TOKENS, POOL_TOKENS, SMALL_BUDGET, STRICT_MEM_ENV, Server,
                           assert_healthy, chat_prompt, repetition_rate)

PROMPTS = [
    "Explain how rainbows form.",
    "Describe how a bicycle works.",
    "Give advice to a student starting university.",
]
SYSTEM = ("You are a patient teacher. You explain science to children with short, clear "
          "sentences, friendly examples from daily life, and no jargon. " * 5)


def _parallel(server, prompts, n, **sampling):
    with ThreadPoolExecutor(len(prompts)) as ex:
        return list(ex.map(lambda p: server.generate(p, n, **sampling), prompts))


def _running_counts(log_text):
    return [int(m) for m in re.findall(r"#running-req: (\d+)", log_text)]


def test_outputs_identical_to_stock_when_budget_never_fills(default_server, stock_server):
    for p in PROMPTS:
        ours = default_server.generate(chat_prompt(p), 80)
        stock = stock_server.generate(chat_prompt(p), 80)
        assert ours["text"] == stock["text"]
        assert ours["meta_info"]["zipage_compactions"] == 0
        assert "zipage_compactions" not in stock["meta_info"]
    assert default_server.zipage_state()["compactions"] == 0


def test_compression_keeps_footprint_bounded_and_text_fluent(zipage_server):
    before = zipage_server.zipage_state()
    outs = _parallel(zipage_server, [chat_prompt(p) for p in PROMPTS], 400, ignore_eos=True)
    after = zipage_server.zipage_state()
    assert all(o["meta_info"]["completion_tokens"] == 400 for o in outs)
    # every request compresses once per 16 tokens after its first 80
    assert after["compactions"] - before["compactions"] >= len(PROMPTS) * (400 - 80) // 16 - 3
    assert after["max_suffix_tokens"] <= 80  # I6: suffix <= budget + buffer
    for o in outs:
        meta = o["meta_info"]
        assert meta["zipage_compactions"] >= (400 - 80) // 16
        assert meta["prompt_tokens"] < meta["zipage_kv_len"] <= meta["prompt_tokens"] + 80
        assert repetition_rate(o["text"]) < 0.5, o["text"]
    assert_healthy(zipage_server)


def test_shared_prompt_stays_cached_and_exact(zipage_server, stock_server):
    def scenario(server):
        server.generate(chat_prompt("Hello", SYSTEM), 1)  # the shared prompt enters the tree
        outs = _parallel(server, [chat_prompt(q, SYSTEM) for q in PROMPTS], 200, ignore_eos=True)
        fresh = server.generate(chat_prompt(PROMPTS[0], SYSTEM), 40)
        return outs, fresh

    z_outs, z_fresh = scenario(zipage_server)
    s_outs, s_fresh = scenario(stock_server)
    assert z_fresh["meta_info"]["cached_tokens"] >= s_fresh["meta_info"]["cached_tokens"] - 1
    assert z_fresh["meta_info"]["cached_tokens"] >= z_fresh["meta_info"]["prompt_tokens"] - 40
    assert z_fresh["text"] == s_fresh["text"]  # prompt KV untouched by the compressions
    assert zipage_server.zipage_state()["max_suffix_tokens"] <= 80
    assert_healthy(zipage_server)


def test_budget_lets_requests_run_together_where_stock_queues(zipage_server, stock_server):
    prompts = [chat_prompt(p) for p in PROMPTS + ["Write about the moon."]]
    runs = {}
    for name, server in (("zipage", zipage_server), ("stock", stock_server)):
        start = len(server.log())
        outs = _parallel(server, prompts, 300, ignore_eos=True)
        assert all(o["meta_info"]["completion_tokens"] == 300 for o in outs)
        runs[name] = (max(_running_counts(server.log()[start:]) or [0]),
                      sum(o["meta_info"]["num_retractions"] for o in outs))
    assert runs["zipage"] == (4, 0), runs  # 4 x (prompt + 80) fits the 640-token pool
    stock_running, stock_retractions = runs["stock"]
    assert stock_running < 4 or stock_retractions > 0, runs  # 4 x 330 tokens does not
    assert_healthy(zipage_server)


def test_output_longer_than_the_pool_completes(zipage_server):
    out = zipage_server.generate(chat_prompt(PROMPTS[1]), 700, ignore_eos=True)
    assert out["meta_info"]["completion_tokens"] == 700  # the pool holds 640 tokens
    assert_healthy(zipage_server)


def test_compressed_requests_survive_retraction_and_sigterm_stops_cleanly(tmp_path):
    """SGLang's test hook retracts a running request every 40 forwards; once all are
    compressed, compressed ones are retracted too: they re-prefill their prompt + output
    (exact KV), compress again, and still finish with their full output."""
    env = {**STRICT_MEM_ENV, "SGLANG_TEST_RETRACT": "1", "SGLANG_TEST_RETRACT_INTERVAL": "40"}
    server = Server(["--max-total-tokens", POOL_TOKENS, *SMALL_BUDGET], tmp_path / "r.log", env=env)
    try:
        outs = _parallel(server, [chat_prompt(p) for p in PROMPTS], 300, ignore_eos=True)
        assert all(o["meta_info"]["completion_tokens"] == 300 for o in outs)
        assert sum(o["meta_info"]["num_retractions"] for o in outs) > 0
        assert all(o["meta_info"]["zipage_compactions"] > 0 for o in outs)
        assert all(o["text"].strip() for o in outs)
        assert_healthy(server)
    finally:
        alive = server.stop()
    assert alive == [], f"processes left after SIGTERM: {alive}"


def test_chunked_prefill_of_a_long_prompt_while_others_compress(zipage_server):
    before = zipage_server.zipage_state()["compactions"]
    start = len(zipage_server.log())
    long_prompt = chat_prompt("Summarize: " + "Bees make honey in hives and dance to share news. " * 25)
    with ThreadPoolExecutor(3) as ex:
        busy = [ex.submit(zipage_server.generate, chat_prompt(p), 300, ignore_eos=True)
                for p in PROMPTS[:2]]
        deadline = time.monotonic() + 600  # orchestration only: wait until they compress
        while zipage_server.zipage_state()["compactions"] == before and time.monotonic() < deadline:
            time.sleep(0.5)
        long_out = ex.submit(zipage_server.generate, long_prompt, 24).result()
        outs = [f.result() for f in busy]
    assert all(o["meta_info"]["completion_tokens"] == 300 for o in outs)
    assert long_out["meta_info"]["prompt_tokens"] > 4 * int(CHUNK_TOKENS)
    assert long_out["text"].strip()
    log = zipage_server.log()[start:]
    assert f"#new-token: {CHUNK_TOKENS}," in log  # the prompt went in chunks
    after = zipage_server.zipage_state()
    assert after["compactions"] >= before + 2 * (300 - 80) // 16 - 2
    assert after["max_suffix_tokens"] <= 80
    assert_healthy(zipage_server)
