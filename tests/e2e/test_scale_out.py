"""Scale-out on SGLang's own engine, on CPU (issue 16).

- Data parallel: ``--dp-size 2`` starts two schedulers under SGLang's data-parallel
  controller (round robin). Each replica compresses on its own, /server_info lists both
  replicas' zipage state, and a per-request ``zipage_kv_budget`` reaches the replica that
  serves the request.
- Tensor parallel: ``--tp-size 2`` starts two schedulers, each with one of the model's two
  KV heads; each scores its own head with its own query heads. Their compaction decisions
  (requests, steps, columns kept, pool slots free) must be identical, and rank 0's
  /server_info gathers every rank's decision digest to show it. On CPU SGLang 0.5.17 needs
  two environment variables for TP (see CPU_TP_ENV).
Both run on the 2-layer dummy Qwen3 of the soak test (fast on a CPU). Dummy weights are
drawn per TP shard, so TP=2 outputs cannot be compared with TP=1 ones; what TP must not
change, every rank agreeing on every compaction, is what the test checks.
- sglang-router (PyPI ``sglang-router``, cache-aware policy) in front of two zipage servers
  on the bundled model: two multi-turn agents; each later turn lands on the replica that
  holds its conversation, so its cached prompt tokens are those a single server gives (the
  bound of test_examples.py), and both replicas compress.
Run: .venv/bin/python -m pytest tests/e2e/test_scale_out.py
"""

import shutil
import time
from concurrent.futures import ThreadPoolExecutor

import requests

from sglang_zipage.harness.engines import tiny_model_dir
from sglang_zipage.harness.probe import zipage_states
from sglang_zipage.harness.server import STRICT_MEM_ENV, Server
from zipage_server import (COMMON_ARGS, FIXED_MODE, POOL_TOKENS, SMALL_BUDGET, ZIPAGE_ARGS,
                           assert_healthy, load_example, router)

TOKENS = 160  # twice past budget + buffer (80)


# SGLang's CPU TP: each rank needs its own cores when there are fewer NUMA nodes than
# ranks, and the CUDA build of torch ships NCCL, which SGLang then tries to open on a CPU
# device (pynccl: "Expected a cuda device, but got: cpu"); a library path that does not
# load turns pynccl off, and SGLang all-reduces over gloo.
CPU_TP_ENV = {"SGLANG_CPU_OMP_THREADS_BIND": "0|1", "SGLANG_NCCL_SO_PATH": "no-nccl-on-cpu"}


def test_data_parallel_replicas_compress_on_their_own(tmp_path):
    model = tiny_model_dir()
    server = Server(["--model-path", model, "--load-format", "dummy", "--skip-tokenizer-init",
                     "--dp-size", "2", "--max-total-tokens", POOL_TOKENS, *SMALL_BUDGET,
                     *FIXED_MODE],
                    tmp_path / "dp.log", env=STRICT_MEM_ENV)
    try:
        limit = zipage_states(server.url)[0]["budget_limit_tokens"]
        # Round robin over 8 requests gives each replica 4, at most 2 of them opted out.
        budgets = [None] * 6 + [0, 0]

        def run(i):
            params = {"max_new_tokens": TOKENS, "temperature": 0, "ignore_eos": True}
            if budgets[i] is not None:
                params["zipage_kv_budget"] = budgets[i]
            return server.generate_ids([list(range(300 + 20 * i, 316 + 20 * i))], [params])[0]

        with ThreadPoolExecutor(8) as ex:
            outs = list(ex.map(run, range(8)))
        for out, budget in zip(outs, budgets):
            meta = out["meta_info"]
            assert meta["completion_tokens"] == TOKENS
            if budget == 0:  # the replica that served it saw the request's own budget
                assert meta["zipage_compactions"] == 0
                assert meta["zipage_kv_len"] >= meta["prompt_tokens"] + TOKENS - 1
            else:
                assert meta["zipage_compactions"] >= 1
                assert meta["zipage_kv_len"] <= meta["prompt_tokens"] + limit
        states = zipage_states(server.url)
        assert len(states) == 2 and all(s["active"] for s in states)
        assert all(s["compactions"] >= 2 for s in states), states  # both replicas compressed
        assert all(s["max_suffix_tokens"] <= limit for s in states)
        assert_healthy(server)
    finally:
        assert server.stop() == []
        shutil.rmtree(model, ignore_errors=True)


def test_tensor_parallel_ranks_take_the_same_compaction_decisions(tmp_path):
    model = tiny_model_dir()
    server = Server(["--model-path", model, "--load-format", "dummy", "--skip-tokenizer-init",
                     "--tp-size", "2", "--max-total-tokens", POOL_TOKENS, "--enable-metrics",
                     *SMALL_BUDGET, *FIXED_MODE],
                    tmp_path / "tp.log", env={**STRICT_MEM_ENV, **CPU_TP_ENV})
    try:
        (state,) = zipage_states(server.url)
        limit = state["budget_limit_tokens"]
        assert state["layout"]["query_heads"] == 2  # this rank's half of the 4 query heads
        # One batch: 6 requests at the server's budget, 2 opted out (every rank must see
        # the per-request budget, or the ranks' decisions differ).
        budgets = [None] * 6 + [0, 0]
        params = [{"max_new_tokens": TOKENS, "temperature": 0, "ignore_eos": True,
                   **({} if b is None else {"zipage_kv_budget": b})} for b in budgets]
        outs = server.generate_ids([list(range(300 + 20 * i, 316 + 20 * i)) for i in range(8)],
                                   params)
        for out, budget in zip(outs, budgets):
            meta = out["meta_info"]
            assert meta["completion_tokens"] == TOKENS
            if budget == 0:
                assert meta["zipage_compactions"] == 0
            else:
                assert meta["zipage_compactions"] >= 1
                assert meta["zipage_kv_len"] <= meta["prompt_tokens"] + limit
        (state,) = zipage_states(server.url)
        ranks = state["tp_ranks"]
        assert len(ranks) == 2 and ranks[0]["decisions"] == state["compactions"] >= 6
        assert state["tp_ranks_agree"], ranks
        assert ranks[0] == ranks[1]
        # Prometheus counts the replica's compactions once, not once per rank
        metrics = requests.get(server.url + "/metrics", timeout=60).text
        assert f"zipage:compactions_total {float(state['compactions'])}" in metrics
        assert_healthy(server)
    finally:
        assert server.stop() == []
        shutil.rmtree(model, ignore_errors=True)


def _router(workers, log_path):
    """sglang-router with cache-aware routing over ``workers`` -> (process, url)."""
    return router(["--policy", "cache_aware", "--worker-urls", *[w.url for w in workers]],
                  len(workers), log_path)


def test_router_keeps_each_conversation_on_the_replica_holding_its_prompt(zipage_server, tmp_path):
    agent = load_example("agent_multiturn")
    second = Server([*COMMON_ARGS, *ZIPAGE_ARGS], tmp_path / "second.log", env=STRICT_MEM_ENV)
    workers = [zipage_server, second]
    router, url = _router(workers, tmp_path / "router.log")
    try:
        page = requests.get(second.url + "/server_info", timeout=60).json()["page_size"] or 1
        before = [w.zipage_state()["compactions"] for w in workers]
        client = agent.client_for(url)
        # Two conversations at once that share nothing but the chat template. Cache-aware
        # routing sends a request that matches no replica's tree to the least loaded one,
        # so the two start on different replicas; each later turn follows its own prefix.
        talks = [("You are a careful assistant. Think step by step.", agent.TASKS[:2]),
                 ("Answer like a patient maths teacher, explaining every step in detail.",
                  ("A train leaves at 9:40 and arrives at 13:05. How long is the journey?",
                   "Tickets cost 23 euros each. What do four tickets cost?"))]

        def converse(system, tasks, delay):
            time.sleep(delay)  # the first conversation's request is in flight: load 1 vs 0
            messages, records = [{"role": "system", "content": system}], []
            for task in tasks:
                messages.append({"role": "user", "content": task})
                answer, rec = agent.ask(client, messages, max_tokens=100, min_tokens=100)
                messages.append({"role": "assistant", "content": answer})
                records.append(rec)
            return records

        with ThreadPoolExecutor(2) as ex:
            turns = list(ex.map(lambda talk, delay: converse(*talk, delay), talks, (0, 1)))
        for first, later in turns:
            assert first["completion_tokens"] == later["completion_tokens"] == 100
            # as on one server: the earlier prompt is reused, the compressed answer is not
            c0 = first["prompt_tokens"] // page * page
            assert (first["prompt_tokens"] - 1) // page * page <= later["cached_tokens"] <= c0, turns
        after = [w.zipage_state()["compactions"] for w in workers]
        assert all(a > b for a, b in zip(after, before)), (before, after)  # both compressed
        for w in workers:
            assert_healthy(w)
    finally:
        router.terminate()
        router.wait(timeout=30)
        assert second.stop() == []
