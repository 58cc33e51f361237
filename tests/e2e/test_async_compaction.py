"""--zipage-async on the real bundled model (issue 5), with page_size 16 and chunked prefill.

On CPU there is no side stream: a shadow compaction runs when it is launched (before the
next forward), and the request keeps decoding on its old pages until the scheduler commits
it at its next step. So everything except the overlap in time is exercised: fresh-slot
allocation, the admission reserve, the commit (column swap + tail move), frees at commit
and at abort, and the strict memory checker watches every step.
Run: .venv/bin/python -m pytest tests/e2e/test_async_compaction.py
"""

import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
import requests

from sglang_zipage.harness.server import STRICT_MEM_ENV, Server
from zipage_server import (CHUNK_TOKENS, POOL_SHARE, POOL_TOKENS, REFERENCE_PROMPTS, assert_healthy, chat_prompt,
                           force, nll_ratio, top1_agreement)

PAGE = 16
BUDGET, BUFFER, LAG = 64, 32, 16  # lag = async_lag(16): a compaction starts at suffix 80
LIMIT = BUDGET + BUFFER
PROMPTS = [*REFERENCE_PROMPTS, "Give advice to a student starting university."]


@pytest.fixture(scope="module")
def async_server(tmp_path_factory):
    log = tmp_path_factory.mktemp("servers") / "async.log"
    srv = Server(["--max-total-tokens", POOL_TOKENS, "--chunked-prefill-size", CHUNK_TOKENS,
                  "--enable-custom-logit-processor", "--page-size", str(PAGE), "--zipage-mode", "fixed",
                  "--zipage-async", "--zipage-kv-budget", str(BUDGET),
                  "--zipage-buffer", str(BUFFER), *POOL_SHARE,
                  # the window scorer, whose NLL bound below this test was written against
                  # (the calibrated scorer exceeds it on one of the two prompts; both scorers
                  # on the model's own text: fidelity-self-forced-cpu.json)
                  "--zipage-scorer", "window"], log, env=STRICT_MEM_ENV)
    yield srv
    alive = srv.stop()
    assert alive == [], f"processes left after SIGTERM: {alive}"


def _gen(server, prompt, n, **sampling):
    return server.generate(prompt, n, **sampling)


def test_async_compresses_with_bounded_footprint_while_a_long_prompt_prefills(
        async_server, references, tmp_path):
    """Two requests decode the model's full-KV greedy continuations (teacher forcing) and
    compress asynchronously while a long prompt is prefilled in chunks: the KV stays within
    budget + buffer and the compressed model still predicts most reference tokens."""
    before = async_server.zipage_state()
    long_prompt = chat_prompt("Summarize: " + "Bees make honey in hives and dance to share news. " * 25)
    prompts, refs, full = zip(*(references[p] for p in REFERENCE_PROMPTS))
    n = len(refs[0])
    with ThreadPoolExecutor(2) as ex:
        busy = ex.submit(force, async_server, list(prompts), list(refs), tmp_path)
        deadline = time.monotonic() + 600  # orchestration only: wait until they compress
        while (async_server.zipage_state()["compactions"] == before["compactions"]
               and time.monotonic() < deadline):
            time.sleep(0.5)
        long_out = ex.submit(_gen, async_server, long_prompt, 24).result()
        records = busy.result()
    after = async_server.zipage_state()
    assert after["config"]["async_compaction"] is True
    assert long_out["meta_info"]["prompt_tokens"] > 4 * int(CHUNK_TOKENS)
    assert long_out["text"].strip()
    assert after["async_compactions"] > before["async_compactions"]
    assert after["compactions"] - before["compactions"] >= 2 * ((n - LIMIT) // BUFFER)
    assert after["max_suffix_tokens"] <= LIMIT  # I6 holds while compactions are in flight
    for rec, ref, full_rec in zip(records, refs, full):
        meta = rec["meta_info"]
        assert meta["completion_tokens"] == n
        assert meta["zipage_compactions"] >= (n - LIMIT) // BUFFER
        # compacted to 64 plus the tokens decoded since: never more than the limit
        assert meta["prompt_tokens"] - PAGE < meta["zipage_kv_len"] <= meta["prompt_tokens"] + LIMIT
        assert top1_agreement(rec, ref) >= 0.5, top1_agreement(rec, ref)
        # teacher-forced cost of compression against full KV, both measured in this run
        assert nll_ratio(rec, full_rec) <= 2.0, nll_ratio(rec, full_rec)
    assert_healthy(async_server)


def test_async_output_equals_stock_until_its_first_compaction(async_server, stock_server):
    """Up to the first compaction's snapshot nothing is evicted, so greedy tokens match
    (each server idle with an empty cache: the same batch composition on both sides)."""
    prompt = chat_prompt(PROMPTS[2])

    def run(server):
        server.idle_and_flushed()
        body = {"text": prompt, "return_logprob": True,
                "sampling_params": {"max_new_tokens": 120, "ignore_eos": True, "temperature": 0}}
        r = requests.post(server.url + "/generate", json=body, timeout=600)
        r.raise_for_status()
        return r.json()

    ours, stock = run(async_server), run(stock_server)
    ids = lambda o: [t[1] for t in o["meta_info"]["output_token_logprobs"]]
    prompt_len = ours["meta_info"]["prompt_tokens"]
    exact = LIMIT - LAG - (prompt_len % PAGE)  # the first snapshot ends at this output token
    assert ids(ours)[:exact] == ids(stock)[:exact]
    assert ours["meta_info"]["zipage_compactions"] >= 1


def test_abort_with_compactions_in_flight_frees_everything(async_server):
    """Streaming clients disconnect at staggered points around their compactions; the
    strict checker sees every step and the idle check, and later requests still run."""
    stop_after = [70, 77, 81, 84, 90, 110]  # chunks of 1 token: around the 80-token trigger

    def stream_then_drop(n_chunks, prompt):
        body = {"text": chat_prompt(prompt), "stream": True,
                "sampling_params": {"max_new_tokens": 400, "ignore_eos": True, "temperature": 0}}
        seen = 0
        with requests.post(async_server.url + "/generate", json=body, stream=True, timeout=600) as r:
            for line in r.iter_lines():
                if line.startswith(b"data:") and b"[DONE]" not in line:
                    seen += 1
                    if seen >= n_chunks:
                        break  # closing the connection aborts the request
        return seen

    threads = [threading.Thread(target=stream_then_drop, args=(n, PROMPTS[i % 3]))
               for i, n in enumerate(stop_after)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    deadline = time.monotonic() + 120  # orchestration: wait for the aborts to reach the scheduler
    state = async_server.zipage_state()
    while (state["running_compressed_requests"] or state["shadow_tokens_held"]) and time.monotonic() < deadline:
        time.sleep(1)
        state = async_server.zipage_state()
    assert state["shadow_tokens_held"] == 0  # every in-flight compaction's fresh slots freed
    out = async_server.generate(chat_prompt(PROMPTS[0]), 150, ignore_eos=True)
    assert out["meta_info"]["completion_tokens"] == 150
    assert out["meta_info"]["zipage_compactions"] >= 1
    time.sleep(3)  # orchestration: let the scheduler run its idle memory check
    assert_healthy(async_server)
