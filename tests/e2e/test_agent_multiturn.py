"""A multi-turn reasoning agent over the OpenAI API (examples/agent_multiturn.py, issue 6):
every turn compresses, and the radix-cache hits of later turns cover the earlier prompts but
never a compressed answer.

The bound, from the code: a request's prompt enters the radix tree once, after its prefill
(SGLang's cache_unfinished_req inserts the page-aligned prompt, ``cache_protected_len``);
zipage compresses only columns from c0 = max(cache_protected_len, floor_page(prompt_len))
on and marks a compressed request skip_radix_cache_insert, so neither decode steps nor
the request's end insert anything past c0. Turn t+1's prompt starts with turn t's prompt
followed by turn t's answer, hence
    floor_page(lcp) <= cached_tokens(t+1) <= c0(t) = floor_page(prompt_tokens(t)),
where lcp >= prompt_tokens(t) - 1 (the chat template renders the earlier turns unchanged;
only a newline at the end of turn t's prompt can merge with its answer's first characters).

Run: .venv/bin/python -m pytest tests/e2e/test_agent_multiturn.py
"""

import requests

from zipage_server import assert_healthy, load_example

agent = load_example("agent_multiturn")


def floor_page(n, page):
    return n // page * page


def test_each_turn_compresses_and_only_prompts_are_reused(zipage_server):
    page = requests.get(zipage_server.url + "/server_info", timeout=60).json()["page_size"] or 1
    messages, turns = agent.run_agent(zipage_server.url, max_tokens=100, min_tokens=100,
                                      show=False)
    for t in turns:
        assert t["completion_tokens"] == 100 and t["finish_reason"] == "length"
        assert t["zipage_compactions"] >= 1
        assert t["zipage_kv_len"] < t["prompt_tokens"] + t["completion_tokens"]
        assert t["cached_tokens"] == t["meta_cached_tokens"]  # usage agrees with meta_info
    for prev, cur in zip(turns, turns[1:]):
        c0 = floor_page(prev["prompt_tokens"], page)
        assert floor_page(prev["prompt_tokens"] - 1, page) <= cur["cached_tokens"] <= c0, (prev, cur)
        assert cur["prompt_tokens"] > c0 + prev["completion_tokens"]  # the answer is in the prompt

    # Control: an answer generated with compression off for that request is inserted whole,
    # and the next turn's hit covers it (the bound above is specific to compressed answers).
    client = agent.client_for(zipage_server.url)
    messages.append({"role": "user", "content": "Now give the final answer in one sentence."})
    answer, plain = agent.ask(client, messages, max_tokens=24, zipage_kv_budget=0)
    assert plain["zipage_compactions"] == 0
    messages += [{"role": "assistant", "content": answer}, {"role": "user", "content": "Thanks."}]
    _, after = agent.ask(client, messages, max_tokens=1)
    assert after["cached_tokens"] > floor_page(plain["prompt_tokens"], page)
    assert_healthy(zipage_server)
