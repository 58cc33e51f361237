"""A PD-disaggregated deployment on the CPU (issue 47): a prefill server, a decode server that
compresses, sglang-router in PD mode in front, the prompt's KV sent from one to the other by
mooncake's transfer engine over TCP (``mooncake-transfer-engine-non-cuda``; SGLang's
``mooncake`` backend with ``MC_FORCE_TCP=1``, as its ``mooncake_tcp`` choice sets it).

The decode server keeps SGLang's prefix tree (``--disaggregation-decode-enable-radix-cache``):
a later turn's prompt is matched there and only its missing suffix is sent. A request's
compressed answer never enters the tree, as on a single server. Every output is compared with
the session's single zipage server (conftest's ``zipage_server``): the decode server runs its
flags and the prefill server its prefill chunks, and both are given the same requests one at
a time (the same batch composition: one request decoding alone), so a wrong or missing KV
transfer, or a prefix tree holding other KV than the prompt's, shows as other tokens. The
bundled model, its calibrated scorer, fixed mode 64 + 16, SGLang's strict memory checker on
every server. (The window scorer's query-window slots on a decode server are
test_pd_decode.py's.)
Run: .venv/bin/python -m pytest tests/e2e/test_pd_pair.py
"""

import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
import requests

from sglang_zipage.harness.probe import loads
from sglang_zipage.harness.server import PD_ENV, PD_TRANSFER, STRICT_MEM_ENV, Server, free_port
from zipage_server import COMMON_ARGS, ZIPAGE_ARGS, assert_healthy, router

OUT = 140
LONG = 400
# A decode server admits a request once what it is sent (its prompt less the tree's match)
# fits beside SGLang's 512 reserved decode tokens, so its pool is larger than the session
# server's (COMMON_ARGS: 640 tokens); where a request's KV sits does not change its tokens.
POOL = ["--max-total-tokens", "1024"]
ENV = {**STRICT_MEM_ENV, **PD_ENV}  # mooncake over TCP: no RDMA device here
MOONCAKE = PD_TRANSFER


@pytest.fixture(scope="module")
def deployment(tmp_path_factory, zipage_server):
    """(router url, prefill, decode, single): the PD deployment and the session's single
    server, whose flags the decode server runs (and the prefill server its prefill chunks)."""
    logs = tmp_path_factory.mktemp("pd")
    bootstrap = free_port()
    starts = {
        "prefill": lambda: Server([*COMMON_ARGS, "--disaggregation-mode", "prefill", *MOONCAKE,
                                   "--disaggregation-bootstrap-port", str(bootstrap)],
                                  logs / "prefill.log", env=ENV),
        "decode": lambda: Server([*COMMON_ARGS, *ZIPAGE_ARGS, *POOL, "--disaggregation-mode",
                                  "decode", *MOONCAKE,
                                  "--disaggregation-decode-enable-radix-cache"],
                                 logs / "decode.log", env=ENV)}
    with ThreadPoolExecutor(len(starts)) as ex:  # about 40 s each on two cores
        servers = {k: f.result() for k, f in [(k, ex.submit(v)) for k, v in starts.items()]}
    proc, url = router(["--pd-disaggregation", "--prefill", servers["prefill"].url, str(bootstrap),
                        "--decode", servers["decode"].url], 2, logs / "router.log")
    try:
        yield url, servers["prefill"], servers["decode"], zipage_server
    finally:
        proc.kill()
        with ThreadPoolExecutor(len(servers)) as ex:
            list(ex.map(lambda s: s.stop(grace=5), servers.values()))


def _generate(url, ids, **params):
    body = {"input_ids": ids, "sampling_params": {"max_new_tokens": OUT, "temperature": 0,
                                                  "ignore_eos": True, **params}}
    r = requests.post(url + "/generate", json=body, timeout=900)
    r.raise_for_status()
    return r.json()


def test_through_the_router_a_conversation_compresses_on_the_decode_server_and_its_next_turn_hits_its_tree(deployment):
    url, prefill, decode, single = deployment
    limit = decode.zipage_state()["budget_limit_tokens"]
    single.idle_and_flushed()  # its tree as empty as the fresh decode server's
    first = list(range(300, 400))
    pd, alone = _generate(url, first), _generate(single.url, first)
    assert pd["output_ids"] == alone["output_ids"]  # the prompt's KV arrived as it was
    meta = pd["meta_info"]  # the decode server's, through the router
    assert meta["zipage_compactions"] > 0 and meta["zipage_kv_len"] <= len(first) + limit, meta
    second = first + pd["output_ids"] + list(range(500, 520))
    pd, alone = _generate(url, second), _generate(single.url, second)
    assert pd["output_ids"] == alone["output_ids"]
    # the decode server's tree held the first prompt (and not the compressed answer): only
    # the rest was prefilled and sent
    assert pd["meta_info"]["cached_tokens"] == len(first), pd["meta_info"]
    assert pd["meta_info"]["zipage_compactions"] > 0
    # a request's own budget reaches the decode server through the router's OpenAI API (its
    # /generate forwards SGLang's own sampling fields only)
    before = decode.zipage_state()["compactions"]
    r = requests.post(url + "/v1/completions", timeout=900, json={
        "model": "m", "prompt": "Once upon a time, in a valley", "max_tokens": OUT,
        "temperature": 0, "ignore_eos": True, "zipage_kv_budget": 0})
    assert r.json()["usage"]["completion_tokens"] == OUT, r.text
    assert decode.zipage_state()["compactions"] == before  # 200 tokens past 80: full KV
    for server in (prefill, decode, single):
        assert_healthy(server)


def test_a_second_request_runs_beside_a_compressing_one_which_aborted_gives_everything_back(deployment):
    """The decode server keeps 512 tokens free for each request it holds: in its 1024-token
    pool a second request would wait until the first ends. A compressing request grows at most
    to its limit (prompt + 80) before a compaction frees room, so it is booked at that and the
    second one is admitted while the first runs. The first, aborted while it compresses, gives
    back its slots (the strict checker fails a leaked one once the server idles)."""
    url, prefill, decode, _ = deployment
    limit = decode.zipage_state()["budget_limit_tokens"]
    rid = f"pd-abort-{time.monotonic_ns()}"
    body = {"input_ids": list(range(700, 740)), "rid": rid,
            "sampling_params": {"max_new_tokens": LONG, "temperature": 0, "ignore_eos": True}}
    answer = {}
    client = threading.Thread(target=lambda: answer.update(
        requests.post(url + "/generate", json=body, timeout=900).json()))
    client.start()
    deadline = time.monotonic() + 300
    while decode.zipage_state()["running_compressed_requests"] == 0:
        assert time.monotonic() < deadline, "the request never compressed"
        time.sleep(0.2)
    second = _generate(url, list(range(800, 830)))
    assert decode.zipage_state()["most_running_requests"] == 2
    meta = second["meta_info"]
    assert meta["zipage_compactions"] > 0 and meta["zipage_kv_len"] <= 30 + limit, meta
    requests.post(decode.url + "/abort_request", json={"rid": rid}, timeout=60).raise_for_status()
    client.join(timeout=300)
    assert answer["meta_info"]["finish_reason"]["type"] == "abort", answer["meta_info"]
    assert answer["meta_info"]["completion_tokens"] < LONG
    decode.idle_and_flushed()  # a leaked slot fails the strict checker once the server idles
    assert loads(decode.url)["num_used_tokens"] == 0
    assert decode.zipage_state()["running_compressed_requests"] == 0
    for server in (prefill, decode):
        assert_healthy(server)
