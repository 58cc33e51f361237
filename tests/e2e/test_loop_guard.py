"""The loop guard on a real server (issue 31): a compacted request that repeats itself gets a
larger budget; one that does not repeat never does.

Both requests are teacher-forced (zipage_server.force), so what they write is fixed: one
writes 200 tokens that never repeat an 8-gram, then a 13-token phrase over and over; the other
600 tokens that never repeat. The session's zipage server (budget 64 + buffer 16, fixed mode,
the guard on by default) compacts both every 16 tokens; the guard watches their last 400
tokens every 32. Checked: the looping request's budget was raised (meta_info
zipage_loop_guard, /server_info loop_guard_triggers, Prometheus) and it ends holding more than
its old limit; the other was never touched.
Run: .venv/bin/python -m pytest tests/e2e/test_loop_guard.py
"""

import random
import re

import requests

from zipage_server import assert_healthy, force, token_ids

OUT, LOOP_FROM, PERIOD = 600, 200, 13


def _references():
    rng = random.Random(31)
    fresh = rng.sample(range(1000, 40000), OUT)  # distinct ids: no n-gram repeats
    phrase = fresh[:PERIOD]
    looping = fresh[PERIOD:PERIOD + LOOP_FROM] + [phrase[i % PERIOD] for i in range(OUT - LOOP_FROM)]
    return looping, fresh


def test_a_repeating_compacted_request_gets_a_larger_budget(zipage_server, tmp_path):
    srv = zipage_server
    srv.idle_and_flushed()
    before = srv.zipage_state()["loop_guard_triggers"]
    prompt = token_ids("Count the sheep, one by one.")
    looping, fresh = _references()
    loop_rec, fresh_rec = force(srv, [prompt, prompt], [looping, fresh], tmp_path)
    loop_meta, fresh_meta = loop_rec["meta_info"], fresh_rec["meta_info"]
    limit = srv.zipage_state()["budget_limit_tokens"]  # 64 + 16
    assert loop_meta["zipage_compactions"] > 10 and fresh_meta["zipage_compactions"] > 10
    assert loop_meta["zipage_loop_guard"] >= 1
    assert fresh_meta["zipage_loop_guard"] == 0
    assert loop_meta["zipage_kv_len"] > len(prompt) + limit  # it keeps more than it could
    assert fresh_meta["zipage_kv_len"] <= len(prompt) + limit
    state = srv.zipage_state()
    assert state["loop_guard_triggers"] - before == loop_meta["zipage_loop_guard"]
    metrics = requests.get(srv.url + "/metrics", timeout=30).text
    counted = re.search(r"^zipage:loop_guard_triggers_total (\S+)$", metrics, re.M)
    assert counted and float(counted.group(1)) == state["loop_guard_triggers"]
    assert_healthy(srv)
