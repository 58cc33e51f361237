"""The launcher serves the bundled model through SGLang's APIs (issue 2).

Run: .venv/bin/python -m pytest tests/e2e/test_serving.py
"""

import requests

from zipage_server import assert_healthy, chat_prompt


def test_generate_returns_text(zipage_server):
    out = zipage_server.generate(chat_prompt("Name three colors."), 24)
    assert out["text"].strip()
    assert out["meta_info"]["completion_tokens"] > 0


def test_chat_completion_answers_sensibly(zipage_server):
    r = requests.post(zipage_server.url + "/v1/chat/completions", json={
        "model": "default", "temperature": 0, "max_tokens": 24,
        "messages": [{"role": "user", "content": "What is the capital of France?"}]},
        timeout=600)
    r.raise_for_status()
    body = r.json()
    assert "Paris" in body["choices"][0]["message"]["content"]
    assert body["choices"][0]["finish_reason"] == "stop"  # the EOS fix: chats end
    assert body["usage"]["completion_tokens"] > 0


def test_repeated_prompt_hits_radix_cache(zipage_server):
    prompt = chat_prompt("Summarize: " + "The quick brown fox jumps over the lazy dog. " * 12)
    first = zipage_server.generate(prompt, 4)
    second = zipage_server.generate(prompt, 4)
    assert second["meta_info"]["cached_tokens"] >= first["meta_info"]["prompt_tokens"] - 16
    assert second["meta_info"]["cached_tokens"] > 0


def test_scheduler_process_reports_active_config(zipage_server):
    state = zipage_server.zipage_state()
    assert state["active"] is True
    assert state["config"]["kv_budget"] == 64 and state["config"]["buffer"] == 16
    assert state["config"]["scorer"] == "calibrated"  # auto: the bundled model's statistics
    assert state["budget_limit_tokens"] == 80
    assert_healthy(zipage_server)


def test_metrics_and_decode_log_show_compression(zipage_server):
    zipage_server.generate(chat_prompt("Describe a forest."), 120, ignore_eos=True)
    metrics = requests.get(zipage_server.url + "/metrics", timeout=60).text
    values = {line.split()[0]: float(line.split()[1]) for line in metrics.splitlines()
              if line.startswith("zipage:")}
    assert values["zipage:compactions_total"] >= (120 - 80) // 16
    assert values["zipage:pages_freed_total"] >= 16
    assert "zipage:num_running_compressed_reqs" in values
    # the share of output decoded from compressed KV (counted over the whole session)
    assert values["zipage:decode_tokens_total"] >= 119
    assert 0 < values["zipage:compressed_decode_tokens_total"] < values["zipage:decode_tokens_total"]
    assert "zipage compressed-req:" in zipage_server.log()


def test_disabled_server_installs_nothing(stock_server):
    assert stock_server.zipage_state() is None
    out = stock_server.generate(chat_prompt("Name three colors."), 8)
    assert out["meta_info"]["completion_tokens"] > 0
