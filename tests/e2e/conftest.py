"""Real servers on the bundled model (CPU in CI), shared by the e2e tests of a session.

Every server runs SGLang's strict memory checker (leaks, double frees, page invariants
are checked after every busy step); a checker failure kills the scheduler, which the
tests see as a failed request or an unhealthy server and as a traceback in the log.
Every server also accepts custom logit processors (teacher forcing, zipage_server.force)
and tokenizes a batch of texts as one batch, so a batch request (the frontend's select,
for one) reaches the scheduler as one message: the same batch composition on every run.
"""

import pytest

from sglang_zipage.harness.server import STRICT_MEM_ENV, Server
from zipage_server import (COMMON_ARGS, REFERENCE_PROMPTS, REFERENCE_TOKENS, ZIPAGE_ARGS,
                           chat_prompt, force, token_ids)


def _server(tmp_path_factory, name, args):
    log = tmp_path_factory.mktemp("servers") / f"{name}.log"
    srv = Server([*COMMON_ARGS, *args], log, env=STRICT_MEM_ENV)
    yield srv
    srv.stop()


@pytest.fixture(scope="session")
def zipage_server(tmp_path_factory):
    """Compression on with a small budget (64 + buffer 16), so it compresses often; OpenAI
    usage reports cached prompt tokens (--enable-cache-report)."""
    yield from _server(tmp_path_factory, "zipage", ZIPAGE_ARGS)


@pytest.fixture(scope="session")
def stock_server(tmp_path_factory):
    """--zipage-disable: stock SGLang behaviour (only the CPU fixes and model default)."""
    yield from _server(tmp_path_factory, "stock", ["--zipage-disable"])


@pytest.fixture(scope="session")
def references(zipage_server, tmp_path_factory):
    """The model's greedy full-KV continuations (REFERENCE_TOKENS each) of REFERENCE_PROMPTS,
    decoded with compression off for these requests (zipage_kv_budget 0), and their teacher-
    forced full-KV record (per-step log-probabilities): prompt -> (prompt ids, continuation
    ids, full-KV record). Tests force the same tokens under compression and compare."""
    prompts = [token_ids(chat_prompt(p)) for p in REFERENCE_PROMPTS]
    outs = zipage_server.generate_ids(
        prompts, [{"max_new_tokens": REFERENCE_TOKENS, "temperature": 0, "ignore_eos": True,
                   "zipage_kv_budget": 0} for _ in prompts])
    assert all(o["meta_info"]["zipage_compactions"] == 0 for o in outs)  # full KV
    refs = [o["output_ids"] for o in outs]
    full = force(zipage_server, prompts, refs, tmp_path_factory.mktemp("full-kv"), zipage_kv_budget=0)
    return {p: (ids, ref, rec) for p, ids, ref, rec in zip(REFERENCE_PROMPTS, prompts, refs, full)}
