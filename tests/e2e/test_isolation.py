"""Isolation (issue 7): a request's greedy output does not depend on what else runs.

The same greedy request (budget 64 + 16, so it compresses) runs alone, then again while
two other requests decode and compress in the same batches; its tokens must be identical.
Compactions are per request (its own suffix, query window and scores), so neighbours may
only change it through shared state: slots, window rows, global-score rows, positions.
The check also runs on the stock server: batched CPU matmuls could change greedy tokens by
themselves, which would make the zipage comparison meaningless.
Run: .venv/bin/python -m pytest tests/e2e/test_isolation.py
"""

import json
import threading
import time

import requests

from zipage_server import assert_healthy, chat_prompt

PROBE = chat_prompt("Explain why the sky is blue, step by step.")
NEIGHBOURS = [chat_prompt(p) for p in ("Describe how a bicycle works.",
                                       "Give advice to a student starting university.",
                                       "Write about the moon.")]
PROBE_TOKENS = 160


def _ids(server, prompt, n):
    body = {"text": prompt, "return_logprob": True,
            "sampling_params": {"max_new_tokens": n, "temperature": 0, "ignore_eos": True}}
    r = requests.post(server.url + "/generate", json=body, timeout=1800)
    r.raise_for_status()
    out = r.json()
    return [t[1] for t in out["meta_info"]["output_token_logprobs"]], out["meta_info"]


def _neighbour(server, prompt, n, progress, i):
    body = {"text": prompt, "stream": True,
            "sampling_params": {"max_new_tokens": n, "temperature": 0, "ignore_eos": True}}
    with requests.post(server.url + "/generate", json=body, stream=True, timeout=1800) as r:
        r.raise_for_status()
        for line in r.iter_lines():
            if line.startswith(b"data:") and b"[DONE]" not in line:
                progress[i] = json.loads(line[5:])["meta_info"]["completion_tokens"]


def _alone_then_busy(server, neighbours, n, head_start):
    """The probe alone, then with ``neighbours`` decoding n tokens each, started
    ``head_start`` tokens before it. Returns (alone ids, busy ids, busy meta, neighbour
    progress when the probe started, when it ended)."""
    _ids(server, PROBE, 1)  # the prompt enters the radix tree: both runs prefill the same way
    alone, _ = _ids(server, PROBE, PROBE_TOKENS)
    progress = [0] * len(neighbours)
    threads = [threading.Thread(target=_neighbour, args=(server, p, n, progress, i))
               for i, p in enumerate(neighbours)]
    for t in threads:
        t.start()
    deadline = time.monotonic() + 900  # orchestration: neighbours are decoding
    while min(progress) < head_start and time.monotonic() < deadline:
        time.sleep(0.2)
    at_start = list(progress)
    busy, meta = _ids(server, PROBE, PROBE_TOKENS)
    at_end = list(progress)
    for t in threads:
        t.join()
    assert min(at_start) >= head_start and max(at_start) < n  # running when the probe came
    return alone, busy, meta, at_start, at_end


def _first_difference(a, b):
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), None)


def test_stock_greedy_output_does_not_depend_on_the_batch(stock_server):
    """Precondition: on the stock server (no compression) batching alone does not change
    greedy tokens. Two neighbours of 200 tokens: 2 x 220 + 180 tokens fit the 640-token
    pool, so stock runs all three at once instead of queueing the probe."""
    alone, busy, _, _, _ = _alone_then_busy(stock_server, NEIGHBOURS[:2], 200, 20)
    assert len(alone) == len(busy) == PROBE_TOKENS
    assert alone == busy, f"first difference at token {_first_difference(alone, busy)}"


def test_compressed_output_does_not_depend_on_compressing_neighbours(zipage_server):
    """Two neighbours of 280 tokens, 96 decoded (so compressing) when the probe starts,
    still decoding and compressing when it ends."""
    before = zipage_server.zipage_state()["compactions"]
    alone, busy, meta, _, at_end = _alone_then_busy(zipage_server, NEIGHBOURS[:2], 280, 96)
    after = zipage_server.zipage_state()["compactions"]
    assert max(at_end) < 280  # the neighbours outlived the probe
    assert meta["zipage_compactions"] >= (PROBE_TOKENS - 80) // 16  # the probe compressed
    # and so did the neighbours: more compactions than the probe's two runs account for
    assert after - before > 2 * meta["zipage_compactions"]
    assert len(alone) == len(busy) == PROBE_TOKENS
    assert alone == busy, f"first difference at token {_first_difference(alone, busy)}"
    assert_healthy(zipage_server)
