"""Isolation (issue 7): a request's output does not depend on what its neighbours' KV does.

A greedy probe (budget 64 + 16, so it compresses) decodes in one batch with two longer
neighbours, twice: once with the neighbours' compression off (``zipage_kv_budget: 0``),
once with it on, so their compactions run in the same steps as the probe's (same prompt
lengths rounded to the same schedule), in the same launches. Both runs start on an idle
server with an empty cache and send the three prompts as one batch, so every step has the
same batch composition; SGLang's CPU attention (torch_native) runs each request's attention
on its own, so nothing but shared state (slots, query-window rows, global-score rows,
positions) could carry a neighbour's compaction into the probe: its tokens and
log-probabilities must be identical.
Run: .venv/bin/python -m pytest tests/e2e/test_isolation.py
"""

from zipage_server import assert_healthy, chat_prompt, token_ids

PROBE = chat_prompt("Explain why the sky is blue, step by step.")
NEIGHBOURS = [chat_prompt(p) for p in ("Describe how a bicycle works.",
                                       "Give advice to a student starting university.")]
PROBE_TOKENS, NEIGHBOUR_TOKENS = 128, 144  # the neighbours outlive the probe
LIMIT, BUFFER = 64 + 16, 16


def _run(server, neighbour_budget):
    server.idle_and_flushed()
    params = [{"max_new_tokens": n, "temperature": 0, "ignore_eos": True} for n in
              (PROBE_TOKENS, NEIGHBOUR_TOKENS, NEIGHBOUR_TOKENS)]
    for p in params[1:]:
        if neighbour_budget is not None:
            p["zipage_kv_budget"] = neighbour_budget
    before = server.zipage_state()["compaction_batches"]
    outs = server.generate_ids([token_ids(t) for t in (PROBE, *NEIGHBOURS)], params,
                               return_logprob=True)
    return outs, server.zipage_state()["compaction_batches"] - before


def _logprobs(out):
    return [(lp, tok) for lp, tok, _ in out["meta_info"]["output_token_logprobs"]]


def test_compressed_output_does_not_depend_on_compressing_neighbours(zipage_server):
    quiet, quiet_batches = _run(zipage_server, 0)
    busy, busy_batches = _run(zipage_server, None)
    probe_compactions = quiet[0]["meta_info"]["zipage_compactions"]
    assert probe_compactions >= (PROBE_TOKENS - LIMIT) // BUFFER  # the probe compressed
    assert busy[0]["meta_info"]["zipage_compactions"] == probe_compactions
    assert all(o["meta_info"]["zipage_compactions"] == 0 for o in quiet[1:])
    assert all(o["meta_info"]["zipage_compactions"] >= (NEIGHBOUR_TOKENS - LIMIT) // BUFFER
               for o in busy[1:])
    # One launch per compaction step: the neighbours compacted in the probe's launches.
    assert quiet_batches == probe_compactions
    assert busy_batches == max(o["meta_info"]["zipage_compactions"] for o in busy[1:])
    assert len(busy[0]["output_ids"]) == PROBE_TOKENS
    assert busy[0]["output_ids"] == quiet[0]["output_ids"]
    assert _logprobs(busy[0]) == _logprobs(quiet[0])
    assert_healthy(zipage_server)
