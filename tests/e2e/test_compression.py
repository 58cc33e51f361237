"""Compressed PagedAttention inside SGLang, on the real bundled model (issue 4).

Servers (tests/e2e/conftest.py): `zipage_server` (budget 64 + buffer 16) and `stock_server`
(--zipage-disable), both with a 640-token KV pool and SGLang's strict memory checker on.
Run: .venv/bin/python -m pytest tests/e2e/test_compression.py
"""

import re
import shutil
import time
from concurrent.futures import ThreadPoolExecutor

from sglang_zipage.harness.engines import tiny_model_dir
from sglang_zipage.harness.server import STRICT_MEM_ENV, Server
from zipage_server import (CHUNK_TOKENS, FIXED_MODE, POOL_TOKENS, REFERENCE_PROMPTS, SMALL_BUDGET,
                           assert_healthy, chat_prompt, force, nll_ratio, top1_agreement)

PROMPTS = [*REFERENCE_PROMPTS, "Give advice to a student starting university."]
SYSTEM = ("You are a patient teacher. You explain science to children with short, clear "
          "sentences, friendly examples from daily life, and no jargon. " * 5)


def _parallel(server, prompts, n, **sampling):
    with ThreadPoolExecutor(len(prompts)) as ex:
        return list(ex.map(lambda p: server.generate(p, n, **sampling), prompts))


def _running_counts(log_text):
    return [int(m) for m in re.findall(r"#running-req: (\d+)", log_text)]


def test_outputs_identical_to_stock_when_budget_never_fills(zipage_server, stock_server):
    """Below budget + buffer (80 tokens) zipage changes nothing: the same greedy tokens and
    log-probabilities as stock. Each request runs alone on an idle server with an empty
    cache, so both sides compute with the same batch composition."""
    before = zipage_server.zipage_state()["compactions"]
    for p in PROMPTS:
        zipage_server.idle_and_flushed()
        ours = zipage_server.generate(chat_prompt(p), 64, return_logprob=True)
        stock_server.idle_and_flushed()
        stock = stock_server.generate(chat_prompt(p), 64, return_logprob=True)
        assert ours["text"] == stock["text"]
        assert _logprobs(ours) == _logprobs(stock)
        assert ours["meta_info"]["zipage_compactions"] == 0
        assert "zipage_compactions" not in stock["meta_info"]
    assert zipage_server.zipage_state()["compactions"] == before


def _logprobs(out):
    return [(lp, tok) for lp, tok, _ in out["meta_info"]["output_token_logprobs"]]


def test_compression_keeps_footprint_bounded_and_predictions_close_to_full_kv(
        zipage_server, references, tmp_path):
    """Two requests decode the model's own full-KV greedy continuations (teacher forcing)
    while compressing, and a long prompt is prefilled in chunks meanwhile: the KV stays within
    budget + buffer, and the compressed model still predicts most of those tokens as its
    top-1 (full KV: all of them)."""
    before = zipage_server.zipage_state()
    start = len(zipage_server.log())
    prompts, refs, full = zip(*(references[p] for p in REFERENCE_PROMPTS))
    long_prompt = chat_prompt("Summarize: " + "Bees make honey in hives and dance to share news. " * 25)
    with ThreadPoolExecutor(2) as ex:
        busy = ex.submit(force, zipage_server, list(prompts), list(refs), tmp_path)
        deadline = time.monotonic() + 600  # orchestration only: wait until they compress
        while zipage_server.zipage_state()["compactions"] == before["compactions"] and time.monotonic() < deadline:
            time.sleep(0.5)
        long_out = ex.submit(zipage_server.generate, long_prompt, 24).result()
        records = busy.result()
    after = zipage_server.zipage_state()
    n = len(refs[0])
    assert long_out["meta_info"]["prompt_tokens"] > 4 * int(CHUNK_TOKENS)
    assert long_out["text"].strip()
    assert f"#new-token: {CHUNK_TOKENS}," in zipage_server.log()[start:]  # the prompt went in chunks
    # every request compresses once per 16 tokens after its first 80
    assert after["compactions"] - before["compactions"] >= len(refs) * ((n - 80) // 16)
    assert after["max_suffix_tokens"] <= 80  # I6: suffix <= budget + buffer
    for rec, ref, full_rec in zip(records, refs, full):
        meta = rec["meta_info"]
        assert meta["completion_tokens"] == n
        assert meta["zipage_compactions"] >= (n - 80) // 16
        assert rec["compactions_before"][-1] >= (n - 80) // 16 - 1  # decoded under compression
        assert meta["prompt_tokens"] < meta["zipage_kv_len"] <= meta["prompt_tokens"] + 80
        assert top1_agreement(rec, ref) >= 0.5, top1_agreement(rec, ref)
        # teacher-forced cost of compression against full KV, both measured in this run
        assert nll_ratio(rec, full_rec) <= 2.0, nll_ratio(rec, full_rec)
    assert_healthy(zipage_server)


def test_compaction_leaves_the_cached_prompt_untouched(zipage_server):
    """A prompt in the radix tree is read by requests that compress; afterwards a request on
    that prompt gets exactly the tokens and log-probabilities it got before (same server,
    alone both times, same cache hit), so no compaction wrote into a prompt page."""
    zipage_server.idle_and_flushed()
    prompt = chat_prompt(PROMPTS[0], SYSTEM)
    zipage_server.generate(prompt, 1)  # the prompt enters the tree
    before = zipage_server.generate(prompt, 40, return_logprob=True)
    outs = _parallel(zipage_server, [chat_prompt(q, SYSTEM) for q in PROMPTS], 200, ignore_eos=True)
    after = zipage_server.generate(prompt, 40, return_logprob=True)
    assert all(o["meta_info"]["zipage_compactions"] >= (200 - 80) // 16 for o in outs)
    # the compressing requests read the shared prompt from the tree
    assert all(o["meta_info"]["cached_tokens"] >= before["meta_info"]["prompt_tokens"] - 40
               for o in outs)
    hit = before["meta_info"]["cached_tokens"]
    assert hit >= before["meta_info"]["prompt_tokens"] - 1
    assert after["meta_info"]["cached_tokens"] == hit  # the prompt stayed in the tree
    assert _logprobs(after) == _logprobs(before)
    assert zipage_server.zipage_state()["max_suffix_tokens"] <= 80
    assert_healthy(zipage_server)


def test_budget_lets_requests_run_together_where_stock_queues(zipage_server, stock_server):
    prompts = [chat_prompt(p) for p in PROMPTS + ["Write about the moon."]]
    runs = {}
    for name, server in (("zipage", zipage_server), ("stock", stock_server)):
        start = len(server.log())
        outs = _parallel(server, prompts, 170, ignore_eos=True)
        assert all(o["meta_info"]["completion_tokens"] == 170 for o in outs)
        runs[name] = (max(_running_counts(server.log()[start:]) or [0]),
                      sum(o["meta_info"]["num_retractions"] for o in outs))
    assert runs["zipage"] == (4, 0), runs  # 4 x (prompt + 80) fits the 640-token pool
    stock_running, stock_retractions = runs["stock"]
    assert stock_running < 4 or stock_retractions > 0, runs  # 4 x 185 tokens does not
    assert_healthy(zipage_server)


def test_compressed_requests_survive_retraction_and_sigterm_stops_cleanly(tmp_path):
    """SGLang's test hook retracts a running request every 40 forwards (uncompressed ones
    first). A retracted request re-prefills prompt + output in 64-token chunks (exact KV);
    its output KV stays its own, so it compresses again and ends within prompt + budget +
    buffer, like every other request, with its full output. Model-agnostic bookkeeping, so
    it runs on the 2-layer dummy Qwen3 of the soak test (fast on a CPU)."""
    model = tiny_model_dir()
    env = {**STRICT_MEM_ENV, "SGLANG_TEST_RETRACT": "1", "SGLANG_TEST_RETRACT_INTERVAL": "40"}
    server = Server(["--model-path", model, "--load-format", "dummy", "--skip-tokenizer-init",
                     "--max-total-tokens", POOL_TOKENS, "--chunked-prefill-size", CHUNK_TOKENS,
                     *SMALL_BUDGET, *FIXED_MODE], tmp_path / "r.log", env=env)
    try:
        limit = server.zipage_state()["budget_limit_tokens"]
        prompts = [list(range(300 + 20 * i, 317 + 20 * i)) for i in range(3)]
        with ThreadPoolExecutor(3) as ex:
            outs = list(ex.map(lambda p: server.generate_ids(
                [p], [{"max_new_tokens": 200, "temperature": 0, "ignore_eos": True}])[0], prompts))
        facts = [{k: o["meta_info"][k] for k in ("completion_tokens", "num_retractions",
                                                 "zipage_compactions", "zipage_kv_len",
                                                 "prompt_tokens")} for o in outs]
        assert all(f["completion_tokens"] == 200 for f in facts), facts
        assert sum(f["num_retractions"] for f in facts) > 0, facts
        assert all(f["zipage_compactions"] > 0 for f in facts), facts
        assert all(f["zipage_kv_len"] <= f["prompt_tokens"] + limit for f in facts), facts
        assert_healthy(server)
    finally:
        alive = server.stop()
        shutil.rmtree(model, ignore_errors=True)
    assert alive == [], f"processes left after SIGTERM: {alive}"
