"""SGLang's frontend language (sgl.function, gen, fork, select, regex) on a zipage server
(issue 6), with stock SGLang as the reference where the outputs must agree.

Runs the functions of examples/frontend_program.py through sgl.RuntimeEndpoint.
Run: .venv/bin/python -m pytest tests/e2e/test_frontend_program.py
"""

import re

import pytest

from zipage_server import assert_healthy, load_example

fp = load_example("frontend_program")


@pytest.fixture(scope="module")
def zipage_be(zipage_server):
    return fp.backend(zipage_server.url)


@pytest.fixture(scope="module")
def stock_be(stock_server):
    return fp.backend(stock_server.url)


def test_multi_turn_program_compresses_its_long_turn(zipage_be):
    s = fp.two_turn_chat.run("A shop opens at 8:50 and closes at 17:20. How long is it open?",
                             "Say it in minutes only.", long_tokens=100, short_tokens=16,
                             backend=zipage_be, temperature=0)
    first, second = fp.meta(s, "first_answer"), fp.meta(s, "second_answer")
    assert first["completion_tokens"] == 100 and first["zipage_compactions"] >= 1
    assert s["second_answer"].strip() and second["completion_tokens"] >= 1
    assert s["first_answer"] in s.text() and s["second_answer"] in s.text()
    # The second turn reuses the first turn's prompt from the radix tree, never the
    # compressed first answer (its KV is not exact, so it is not inserted).
    assert 0 < second["cached_tokens"] <= first["prompt_tokens"]


def test_fork_drafts_compress_in_parallel_and_select_picks_one(zipage_be):
    s = fp.two_drafts_then_pick.run("the sea", draft_tokens=96, backend=zipage_be, temperature=0)
    for info in s["draft_meta"]:
        assert info["completion_tokens"] == 96 and info["zipage_compactions"] >= 1
        assert info["cached_tokens"] > 0  # the shared prefix, committed before the fork
    assert s["pick"] in ("A", "B")


def _quiet(*servers):
    """Idle servers with empty caches: the program's requests (select sends its choices as
    one batch, tokenized together) meet the same cache state and batch composition."""
    for server in servers:
        server.idle_and_flushed()


def test_select_agrees_with_stock(zipage_server, stock_server, zipage_be, stock_be):
    question = "What is 48 times 27?"
    _quiet(zipage_server, stock_server)
    z = fp.pick_tool.run(question, backend=zipage_be)
    st = fp.pick_tool.run(question, backend=stock_be)
    assert z["tool"] in ("calculator", "dictionary") and z["tool"] == st["tool"]
    # select scores choices by prefill log-probabilities, which zipage leaves untouched.
    zl = z.get_meta_info("tool")["normalized_prompt_logprobs"]
    sl = st.get_meta_info("tool")["normalized_prompt_logprobs"]
    assert zl == sl


def test_regex_gen_matches_in_full_while_compressed(zipage_be, stock_be):
    count = 22  # about 110 constrained tokens: past the 80-token compression point
    z = fp.constrained_numbers.run(count, backend=zipage_be, temperature=0)
    st = fp.constrained_numbers.run(count, backend=stock_be, temperature=0)
    assert re.fullmatch(fp.number_regex(count), z["numbers"]), z["numbers"]
    assert re.fullmatch(fp.number_regex(count), st["numbers"]), st["numbers"]
    assert fp.meta(z, "numbers")["zipage_compactions"] >= 1
    assert "zipage_compactions" not in fp.meta(st, "numbers")


def test_short_greedy_gen_equals_stock(zipage_server, stock_server, zipage_be, stock_be):
    question = "Name the largest planet of the solar system."
    _quiet(zipage_server, stock_server)
    z = fp.short_answer.run(question, max_tokens=24, backend=zipage_be, temperature=0)
    st = fp.short_answer.run(question, max_tokens=24, backend=stock_be, temperature=0)
    assert fp.meta(z, "answer")["zipage_compactions"] == 0  # below the budget
    assert z["answer"] == st["answer"] and z["answer"].strip()
    assert_healthy(zipage_server)
