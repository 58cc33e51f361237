"""Per-request zipage_kv_budget on the native and OpenAI APIs (issue 6).

Run: .venv/bin/python -m pytest tests/e2e/test_request_budget.py
"""

import openai
import pytest
import requests

from zipage_server import assert_healthy, chat_prompt


def _generate(server, budget, n=150):
    body = {"text": chat_prompt("Tell me about dogs."),
            "sampling_params": {"max_new_tokens": n, "temperature": 0, "ignore_eos": True,
                                "zipage_kv_budget": budget}}
    return requests.post(server.url + "/generate", json=body, timeout=900)


def test_budget_zero_turns_compression_off_for_that_request(zipage_server):
    meta = _generate(zipage_server, 0).json()["meta_info"]
    assert meta["zipage_compactions"] == 0
    assert meta["zipage_kv_len"] >= meta["prompt_tokens"] + 150 - 1  # kept every token


def test_own_budget_replaces_the_server_budget(zipage_server):
    meta = _generate(zipage_server, 32).json()["meta_info"]  # server: 64 + 16
    assert meta["zipage_compactions"] >= (150 - 48) // 16
    assert meta["zipage_kv_len"] <= meta["prompt_tokens"] + 32 + 16


@pytest.mark.parametrize("bad", [-1, 7, "many"])
def test_invalid_budget_is_a_400_naming_the_field(zipage_server, bad):
    r = _generate(zipage_server, bad, n=4)
    assert r.status_code == 400
    assert "zipage_kv_budget" in r.text


def test_openai_extra_body_carries_the_budget(zipage_server):
    client = openai.OpenAI(base_url=zipage_server.url + "/v1", api_key="none")
    r = client.chat.completions.create(
        model="default", messages=[{"role": "user", "content": "Tell me about cats."}],
        max_tokens=100, temperature=0, extra_body={"zipage_kv_budget": 32, "ignore_eos": True})
    assert r.usage.completion_tokens == 100  # logical tokens, not kept KV
    with pytest.raises(openai.BadRequestError, match="zipage_kv_budget"):
        client.chat.completions.create(model="default", max_tokens=4,
                                       messages=[{"role": "user", "content": "Hi"}],
                                       extra_body={"zipage_kv_budget": -3})
    assert_healthy(zipage_server)
