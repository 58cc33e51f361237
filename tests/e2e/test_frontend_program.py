"""SGLang's frontend language on a zipage server against stock SGLang, where the outputs
must agree (issue 6): select picks what stock picks with the same prompt log-probabilities,
and a short greedy gen (below the budget) equals stock's.

Runs the functions of examples/frontend_program.py through sgl.RuntimeEndpoint;
test_examples.py checks that its long gens (multi-turn, fork, regex) compress under the
server command its docstring gives.
Run: .venv/bin/python -m pytest tests/e2e/test_frontend_program.py
"""

import pytest

from zipage_server import assert_healthy, load_example

fp = load_example("frontend_program")


@pytest.fixture(scope="module")
def zipage_be(zipage_server):
    return fp.backend(zipage_server.url)


@pytest.fixture(scope="module")
def stock_be(stock_server):
    return fp.backend(stock_server.url)


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


def test_short_greedy_gen_equals_stock(zipage_server, stock_server, zipage_be, stock_be):
    question = "Name the largest planet of the solar system."
    _quiet(zipage_server, stock_server)
    z = fp.short_answer.run(question, max_tokens=24, backend=zipage_be, temperature=0)
    st = fp.short_answer.run(question, max_tokens=24, backend=stock_be, temperature=0)
    assert fp.meta(z, "answer")["zipage_compactions"] == 0  # below the budget
    assert "zipage_compactions" not in fp.meta(st, "answer")  # stock meta_info has no zipage keys
    assert z["answer"] == st["answer"] and z["answer"].strip()
    assert_healthy(zipage_server)
