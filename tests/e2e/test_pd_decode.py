"""A PD-disaggregated decode server with compression, on SGLang's CPU path (issue 47).

SGLang's ``fake`` transfer backend runs a decode server alone: it admits each request as if
its prompt's KV had arrived from a prefill server (the preallocated slots keep whatever the
pool held), then decodes it: the same prompt KV on two fresh servers, so two servers' runs
compare without a prefill server (the deployment with one, mooncake and the router is
test_pd_pair.py). This covers the decode server's own work: admission through its
preallocation queue, its request pool giving back query-window slots, and its retraction, which copies a request's KV to host and copies
it back instead of re-prefilling (a compressed request holds its columns, not its logical
length). The bundled model (real weights: a request's KV decides what it writes), fixed mode
at 64 + 16, SGLang's strict memory checker on. Run: .venv/bin/python -m pytest tests/e2e/test_pd_decode.py
"""

import time
from concurrent.futures import ThreadPoolExecutor

import requests

from sglang_zipage.harness.probe import loads
from sglang_zipage.harness.server import STRICT_MEM_ENV, Server
from zipage_server import FIXED_MODE, SMALL_BUDGET, assert_healthy

DECODE = ["--disaggregation-mode", "decode", "--disaggregation-transfer-backend", "fake"]
OUT = 140
LENGTHS = [OUT + 60, OUT]  # the retraction test's batch (see there)
# (servers are stopped with a short grace: SIGTERM, then SIGKILL; their shutdown is not
# what these tests check)
# a decode server books 512 tokens per request it holds before it runs (SGLang's reserved
# decode tokens): a pool for both requests of one batch at once
POOL_TOKENS = "2048"


def _decode_server(log, scorer, env=None, pool=POOL_TOKENS):
    return Server(["--max-total-tokens", pool, "--zipage-scorer", scorer, *DECODE,
                   *SMALL_BUDGET, *FIXED_MODE], log, env={**STRICT_MEM_ENV, **(env or {})})


def _run(server, lengths):
    """Requests of ``lengths`` output tokens in one batch (one admission step: the same batch
    composition on every server), as a router would send them: each with the prefill
    server's bootstrap address (the fake backend's) and room."""
    n = len(lengths)
    prompts = [list(range(300 + 20 * i, 317 + 20 * i)) for i in range(n)]
    params = [{"max_new_tokens": k, "temperature": 0, "ignore_eos": True} for k in lengths]
    return server.generate_ids(prompts, params, bootstrap_host=["2.2.2.2"] * n,
                               bootstrap_room=list(range(7, 7 + n)))


def _facts(out):
    return {k: out["meta_info"][k] for k in ("completion_tokens", "num_retractions",
                                             "zipage_compactions", "zipage_kv_len",
                                             "prompt_tokens")}


def _compressed_within(outs, limit, lengths):
    facts = [_facts(o) for o in outs]
    assert [f["completion_tokens"] for f in facts] == lengths, facts
    assert all(f["zipage_compactions"] > 0 for f in facts), facts
    assert all(f["zipage_kv_len"] <= f["prompt_tokens"] + limit for f in facts), facts
    return facts


def test_retraction_on_a_decode_server_loses_nothing(tmp_path):
    """Both servers fresh, the same batch, the calibrated scorer (no per-request query
    state, so a request's compactions depend on its KV alone): where SGLang's test hook
    retracts a request every 30 forwards, the retracted request writes the same tokens as
    on the server that never retracted (its KV and positions came back as they were).
    SGLang retracts the request with the fewest output tokens, the second (ties keep the
    batch order, and once behind it stays behind); the first writes 60 tokens more, so the
    second ends before it on both servers and decodes every step beside it: the same batch
    composition for each of its tokens."""
    env = {"SGLANG_TEST_RETRACT": "1", "SGLANG_TEST_RETRACT_INTERVAL": "30"}
    # (both at once, one core each: separate processes, the same batch on each)
    with ThreadPoolExecutor(2) as ex:
        starting = [ex.submit(_decode_server, tmp_path / "plain.log", "calibrated"),
                    ex.submit(_decode_server, tmp_path / "retract.log", "calibrated", env)]
    servers = [f.result() for f in starting if f.exception() is None]
    try:
        assert len(servers) == 2, [f.exception() for f in starting]
        plain, retracting = servers
        limit = plain.zipage_state()["budget_limit_tokens"]
        with ThreadPoolExecutor(2) as ex:
            base, outs = ex.map(lambda s: _run(s, LENGTHS), servers)
        assert_healthy(plain)
        assert_healthy(retracting)
    finally:
        for s in servers:
            s.stop(grace=5)
    facts = _compressed_within(outs, limit, LENGTHS)
    assert [bool(f["num_retractions"]) for f in facts] == [False, True], facts
    assert outs[1]["output_ids"] == base[1]["output_ids"], facts


def test_a_decode_server_admits_longer_than_its_pool_and_beside_a_compressing_one(tmp_path):
    """SGLang's decode server admits a request once its prompt + min(max_new_tokens, 4096)
    fits the pool beside 512 tokens kept free for each request it holds: in a 1024-token
    pool a request of 1100 output tokens would never start, and a second one would wait until
    the first ends. A compressing request grows at most to its limit (prompt + 80 here)
    before a compaction frees room, so a newcomer is charged that and a running one booked at
    it, and the room SGLang keeps for the first to end alone is its limit's, not its 1100
    tokens' (with those, the second would wait until the first had written about 700): both
    run at once, the second sent once the first compresses. The second compresses within
    prompt + budget + buffer; the first,
    aborted, gives back its slots and the window scorer's slot, tied to a row of the decode
    server's own request pool (DecodeReqToTokenPool)."""
    server = _decode_server(tmp_path / "admit.log", "window", pool="1024")
    try:
        limit = server.zipage_state()["budget_limit_tokens"]
        rid = f"long-{time.monotonic_ns()}"
        ex = ThreadPoolExecutor(1)  # (not waited for on failure: the server's stop ends it)
        first = ex.submit(_run_one, server, 0, 1100, rid=[rid])
        deadline = time.monotonic() + 240
        while server.zipage_state()["compactions"] == 0:  # the first one compresses
            assert time.monotonic() < deadline, "the first request never started"
            time.sleep(0.2)
        second = _run_one(server, 1, OUT)
        requests.post(server.url + "/abort_request", json={"rid": rid},
                      timeout=60).raise_for_status()
        first = first.result(timeout=300)
        ex.shutdown()
        state = server.zipage_state()
        assert state["most_running_requests"] == 2, state
        _compressed_within([second], limit, [OUT])
        assert first["meta_info"]["finish_reason"]["type"] == "abort", first["meta_info"]
        # (the second's 140 tokens ran beside the first's from its ~80th on)
        assert 0 < first["meta_info"]["completion_tokens"] < 600, first["meta_info"]
        server.idle_and_flushed()  # a leaked slot fails the strict checker once the server idles
        assert loads(server.url)["num_used_tokens"] == 0
        state = server.zipage_state()
        assert state["window_slots"] > 0 and state["free_window_slots"] == state["window_slots"]
        assert_healthy(server)
    finally:
        server.stop(grace=5)


def test_in_elastic_mode_running_requests_make_room_for_a_transferred_one(tmp_path):
    """Elastic mode (the default): a request keeps its full KV while the pool has room. A
    decode server admits a transferred request in its own queue, not through the admission a
    single server makes room before, so there the running requests make room for the first
    request waiting in that queue. Here the first request (17 + 700 tokens) never runs the
    1024-token pool short by itself, so it compresses only if the second makes it: sent once
    the first holds 520 tokens, the second needs its prompt plus SGLang's 512 reserved tokens,
    more than the 504 left. Then both run at once."""
    server = Server(["--max-total-tokens", "1024", *DECODE, "--zipage-kv-budget", "64",
                     "--zipage-buffer", "16"], tmp_path / "elastic.log", env=STRICT_MEM_ENV)
    try:
        assert server.zipage_state()["config"]["mode"] == "elastic"
        ex = ThreadPoolExecutor(1)  # (not waited for on failure: the server's stop ends it)
        first = ex.submit(lambda: _run_one(server, 0, 700))
        deadline = time.monotonic() + 240
        while loads(server.url)["num_used_tokens"] < 520:
            assert time.monotonic() < deadline and not first.done(), "the first never grew"
            time.sleep(0.2)
        assert server.zipage_state()["compactions"] == 0  # full KV while there was room
        second = _run_one(server, 1, 100)
        first = first.result(timeout=300)
        ex.shutdown()
        state = server.zipage_state()
        assert state["most_running_requests"] == 2, state
        assert first["meta_info"]["zipage_compactions"] > 0, first["meta_info"]
        assert [first["meta_info"]["completion_tokens"],
                second["meta_info"]["completion_tokens"]] == [700, 100]
        server.idle_and_flushed()
        assert loads(server.url)["num_used_tokens"] == 0
        assert_healthy(server)
    finally:
        server.stop(grace=5)


def _run_one(server, i, n, **body):
    """Request ``i`` of ``n`` output tokens alone, with the fake prefill server's address."""
    return server.generate_ids([list(range(300 + 20 * i, 317 + 20 * i))],
                               [{"max_new_tokens": n, "temperature": 0, "ignore_eos": True}],
                               bootstrap_host=["2.2.2.2"], bootstrap_room=[7 + i], **body)[0]
