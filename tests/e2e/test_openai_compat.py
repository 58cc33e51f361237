"""OpenAI-compatible chat completions while compression is active (issue 6): streaming,
n > 1, stop strings, max_tokens, logprobs with top_logprobs, usage; stock SGLang as the
reference for a request that does not compress.

Every long request below crosses the 80-token compression point of the zipage_server
fixture (budget 64 + buffer 16). A counting prompt keeps the greedy output free of loops,
so a stop string taken from the reference output occurs there first after compression.
Run: .venv/bin/python -m pytest tests/e2e/test_openai_compat.py
"""

import openai
import pytest

from zipage_server import assert_healthy

COUNT = [{"role": "user", "content": "Count from 1 to 100, separated by commas."}]
LONG = 120  # output tokens of the long requests: compacted at 80, 96 and 112


def _client(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key="none")


def _meta(choice):
    return (choice.model_extra or {}).get("meta_info") or {}


def _first_new_substring(text, start):
    """The shortest substring beginning at or after ``start`` whose first occurrence in
    ``text`` is there: a stop string that cannot fire earlier."""
    for p in range(start, len(text)):
        for n in range(3, 9):
            if p + n <= len(text) and text.find(text[p:p + n]) == p:
                return p, text[p:p + n]
    pytest.fail(f"no new substring after character {start} of {text!r}")


@pytest.fixture(scope="module")
def reference(zipage_server):
    """Greedy non-streaming completion with logprobs; a 1-token request first puts the
    prompt in the radix tree, so every long request below starts from the same cache."""
    zipage_server.idle_and_flushed()  # nothing else runs beside the requests of this module
    client = _client(zipage_server)
    client.chat.completions.create(model="default", messages=COUNT, max_tokens=1, temperature=0)
    return client.chat.completions.create(
        model="default", messages=COUNT, max_tokens=LONG, temperature=0, logprobs=True,
        top_logprobs=3, extra_body={"min_tokens": LONG, "return_meta_info": True})


def test_max_tokens_usage_and_logprobs_count_logical_tokens(reference):
    choice, usage = reference.choices[0], reference.usage
    assert choice.finish_reason == "length"
    assert usage.completion_tokens == LONG  # every generated token, not the KV kept
    assert usage.total_tokens == usage.prompt_tokens + usage.completion_tokens
    meta = _meta(choice)
    assert meta["zipage_compactions"] >= 1
    assert meta["zipage_kv_len"] < usage.prompt_tokens + LONG
    entries = choice.logprobs.content
    assert len(entries) == LONG
    for e in entries:
        assert len(e.top_logprobs) == 3
        # greedy: the chosen token is the most likely one
        assert e.logprob == pytest.approx(max(t.logprob for t in e.top_logprobs), abs=1e-4)


def test_stream_chunks_concatenate_to_the_non_streaming_text(zipage_server, reference):
    stream = _client(zipage_server).chat.completions.create(
        model="default", messages=COUNT, max_tokens=LONG, temperature=0, stream=True,
        stream_options={"include_usage": True}, extra_body={"min_tokens": LONG})
    parts, finishes, usage = [], [], None
    for chunk in stream:
        usage = chunk.usage or usage
        for c in chunk.choices:
            parts.append(c.delta.content or "")
            if c.finish_reason:
                finishes.append(c.finish_reason)
    assert "".join(parts) == reference.choices[0].message.content
    assert finishes == ["length"]
    assert (usage.prompt_tokens, usage.completion_tokens) == (
        reference.usage.prompt_tokens, LONG)


def test_stop_string_after_compression(zipage_server, reference):
    text = reference.choices[0].message.content
    tokens = [e.token for e in reference.choices[0].logprobs.content]
    after_compression = len("".join(tokens[:90]))  # 90 > 80: the stop lies past a compaction
    at, stop = _first_new_substring(text, after_compression)
    r = _client(zipage_server).chat.completions.create(
        model="default", messages=COUNT, max_tokens=LONG, temperature=0, stop=[stop],
        extra_body={"min_tokens": LONG, "return_meta_info": True})
    choice = r.choices[0]
    assert choice.finish_reason == "stop"
    assert choice.model_extra.get("matched_stop") == stop
    assert choice.message.content == text[:at]  # stops before the string
    assert _meta(choice)["zipage_compactions"] >= 1
    assert 90 <= r.usage.completion_tokens < LONG


def test_n_choices_sample_independently_and_compress(zipage_server):
    n, max_tokens = 3, 96
    r = _client(zipage_server).chat.completions.create(
        model="default", messages=COUNT, max_tokens=max_tokens, temperature=0.8, n=n,
        extra_body={"min_tokens": max_tokens, "return_meta_info": True})
    assert sorted(c.index for c in r.choices) == list(range(n))
    for c in r.choices:
        assert c.finish_reason == "length" and _meta(c)["zipage_compactions"] >= 1
    assert r.usage.completion_tokens == n * max_tokens
    assert r.usage.prompt_tokens == _meta(r.choices[0])["prompt_tokens"]  # counted once
    assert len({c.message.content for c in r.choices}) > 1  # temperature 0.8: 96 tokens differ


def test_short_request_matches_stock(zipage_server, stock_server):
    """Below the budget nothing compresses: text, stop, logprobs and usage equal stock's."""
    body = dict(model="default", max_tokens=40, temperature=0, stop=[" 6,"], logprobs=True,
                top_logprobs=2,
                messages=[{"role": "user", "content": "Count from 1 to 10, separated by commas."}])
    zipage_server.idle_and_flushed()  # the same cache state and batch composition
    z = _client(zipage_server).chat.completions.create(**body)
    stock_server.idle_and_flushed()
    s = _client(stock_server).chat.completions.create(**body)
    zc, sc = z.choices[0], s.choices[0]
    assert zc.finish_reason == sc.finish_reason == "stop"
    assert zc.model_extra.get("matched_stop") == sc.model_extra.get("matched_stop") == " 6,"
    assert zc.message.content == sc.message.content
    assert (z.usage.prompt_tokens, z.usage.completion_tokens) == (
        s.usage.prompt_tokens, s.usage.completion_tokens)
    assert [e.token for e in zc.logprobs.content] == [e.token for e in sc.logprobs.content]
    assert [e.logprob for e in zc.logprobs.content] == [e.logprob for e in sc.logprobs.content]
    assert_healthy(zipage_server)
