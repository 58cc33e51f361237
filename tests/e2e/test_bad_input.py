"""Bad input (issue 7): what SGLang refuses, zipage refuses the same way; what it accepts
runs with a bounded footprint; bad per-request budgets get HTTP 400 naming the field.

Servers: `zipage_server` (budget 64 + buffer 16) and `stock_server` (--zipage-disable).
Run: .venv/bin/python -m pytest tests/e2e/test_bad_input.py
"""

import json

import pytest
import requests

from zipage_server import assert_healthy, chat_prompt

LIMIT = 64 + 16


def _post(server, body):
    return requests.post(server.url + "/generate", json=body, timeout=600)


def _context_len(server):
    return requests.get(server.url + "/v1/models", timeout=60).json()["data"][0]["max_model_len"]


def _error_text(r):
    try:
        body = r.json()
    except ValueError:
        return r.text
    err = body.get("error", body) if isinstance(body, dict) else body
    return err.get("message", json.dumps(err)) if isinstance(err, dict) else str(err)


@pytest.mark.parametrize("case", ["empty_text", "empty_ids", "longer_than_context",
                                  "huge_max_new_tokens"])
def test_refused_or_accepted_as_on_stock(zipage_server, stock_server, case):
    ctx = _context_len(stock_server)
    assert _context_len(zipage_server) == ctx
    sp = {"max_new_tokens": 8, "temperature": 0}
    body = {"empty_text": {"text": ""},
            "empty_ids": {"input_ids": []},
            "longer_than_context": {"input_ids": [100 + i % 1000 for i in range(ctx + 10)]},
            "huge_max_new_tokens": {"text": chat_prompt("Hi"), "sampling_params": {
                **sp, "max_new_tokens": 10**9}}}[case]
    body = {"sampling_params": sp, **body}
    zipage_server.idle_and_flushed()  # the same cache state and batch composition
    ours = _post(zipage_server, body)
    stock_server.idle_and_flushed()
    stock = _post(stock_server, body)
    print(case, stock.status_code, _error_text(stock)[:200])  # for the record (-s)
    assert ours.status_code == stock.status_code, (ours.text[:500], stock.text[:500])
    if stock.status_code == 200:
        assert ours.json()["text"] == stock.json()["text"]
    else:
        assert _error_text(ours) == _error_text(stock)
    assert_healthy(zipage_server)


def test_longest_accepted_output_runs_with_a_bounded_footprint(zipage_server):
    """max_new_tokens as large as the context allows (far beyond the 640-token pool): the
    request is admitted and decodes with its KV bounded by prompt + budget + buffer; the
    client then drops it."""
    prompt = chat_prompt("Tell me a very long story about a lighthouse keeper.")
    prompt_len = _post(zipage_server, {"text": prompt, "sampling_params": {
        "max_new_tokens": 1}}).json()["meta_info"]["prompt_tokens"]
    n = _context_len(zipage_server) - prompt_len - 1
    body = {"text": prompt, "stream": True,
            "sampling_params": {"max_new_tokens": n, "temperature": 0, "ignore_eos": True}}
    kv_lens, seen = [], 0
    with requests.post(zipage_server.url + "/generate", json=body, stream=True, timeout=600) as r:
        assert r.status_code == 200
        for line in r.iter_lines():
            if line.startswith(b"data:") and b"[DONE]" not in line:
                meta = json.loads(line[5:])["meta_info"]
                seen = meta["completion_tokens"]
                kv_lens.append(meta["zipage_kv_len"])
                if seen >= 3 * LIMIT // 2:  # well past the first compactions
                    state = zipage_server.zipage_state()
                    assert state["running_compressed_requests"] >= 1
                    assert state["max_suffix_tokens"] <= LIMIT
                    break
    assert seen >= 3 * LIMIT // 2 and meta["finish_reason"] is None
    assert meta["zipage_compactions"] >= 1
    assert max(kv_lens) <= prompt_len + LIMIT
    assert_healthy(zipage_server)


@pytest.mark.parametrize("bad", [64.0, True, None, [64], "64"])
def test_budget_of_the_wrong_type_is_a_400_naming_the_field(zipage_server, bad):
    body = {"text": chat_prompt("Hi"),
            "sampling_params": {"max_new_tokens": 4, "zipage_kv_budget": bad}}
    r = _post(zipage_server, body)
    assert r.status_code == 400
    assert "zipage_kv_budget" in r.text
