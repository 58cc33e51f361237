"""Model families beyond dense MHA on SGLang's CPU path (issue 15): tiny dummy-weight configs
under tests/e2e/models/, served by real servers (token ids in, --skip-tokenizer-init).

- Gemma 3 (tiny-gemma3: 2 sliding-window layers of 32 tokens, 2 global layers, one KV
  head): the global layers compress, the sliding-window layers keep their newest tokens.
- FP8 KV (--kv-cache-dtype fp8_e4m3, on the same model: one server pair, not two, for CI
  time): scoring reads the FP8 keys, compaction moves their bytes. BF16 keys are what every
  other e2e test runs.
4 requests that outgrow budget + buffer complete with their KV bounded, and
short requests (never compressed) give stock's tokens, both sides in one batch on an idle
server with an empty cache. What the CPU path cannot serve: MLA (SGLang 0.5.17's
torch_native prefill fails on DeepSeek's latent attention, with or without zipage) and
gpt-oss (needs the triton attention backend); both run in benchmarks/coverage.py on the GPU.
Run: .venv/bin/python -m pytest tests/e2e/test_model_families.py
"""

import random
from concurrent.futures import ThreadPoolExecutor

import pytest
import requests

from sglang_zipage.harness.server import STRICT_MEM_ENV, Server
from zipage_server import POOL_SHARE, REPO, assert_healthy

BUDGET, BUFFER = 64, 16
FAMILIES = {"gemma3-fp8": ("tiny-gemma3", ["--kv-cache-dtype", "fp8_e4m3"])}


def _prompts(n, length, seed):
    rng = random.Random(seed)
    return [[rng.randrange(10, 1000) for _ in range(length)] for _ in range(n)]


def _greedy(n):
    return {"max_new_tokens": n, "temperature": 0, "ignore_eos": True}


@pytest.fixture(scope="module", params=sorted(FAMILIES))
def family(request, tmp_path_factory):
    name, extra = FAMILIES[request.param]
    args = ["--model-path", str(REPO / "tests/e2e/models" / name), "--load-format", "dummy",
            "--skip-tokenizer-init", "--max-total-tokens", "2048", "--random-seed", "0", *extra]
    logs = tmp_path_factory.mktemp(f"family-{request.param}")
    with ThreadPoolExecutor(2) as ex:  # both start at once
        zipage = ex.submit(Server, [*args, "--zipage-kv-budget", str(BUDGET), "--zipage-buffer",
                                    str(BUFFER), "--zipage-mode", "fixed", *POOL_SHARE],
                             logs / "zipage.log", env=STRICT_MEM_ENV)
        stock = ex.submit(Server, [*args, "--zipage-disable"], logs / "stock.log", env=STRICT_MEM_ENV)
        zipage, stock = zipage.result(), stock.result()
    yield request.param, zipage, stock
    zipage.stop()
    stock.stop()


def test_compresses_with_the_kv_bounded_and_short_outputs_equal_stock(family):
    name, zipage, stock = family
    zipage.idle_and_flushed()
    outs = zipage.generate_ids(_prompts(4, 30, 1), [_greedy(200)] * 4)
    state = zipage.zipage_state()
    assert state["layout"]["layout"] == "mha+sliding-window"
    assert state["layout"]["recent_layers"] == 2 and state["layout"]["scored_layers"] == 2
    assert state["layout"]["key_dtype"] == "torch.float8_e4m3fn"
    for o in outs:
        meta = o["meta_info"]
        assert meta["completion_tokens"] == 200
        assert meta["zipage_compactions"] >= (200 - BUDGET - BUFFER) // BUFFER + 1
        assert meta["zipage_kv_len"] <= meta["prompt_tokens"] + BUDGET + BUFFER
    assert state["max_suffix_tokens"] <= BUDGET + BUFFER
    short = _prompts(3, 40, 2)
    zipage.idle_and_flushed()
    ours = zipage.generate_ids(short, [_greedy(24)] * 3)
    stock.idle_and_flushed()
    theirs = stock.generate_ids(short, [_greedy(24)] * 3)
    assert [o["output_ids"] for o in ours] == [o["output_ids"] for o in theirs]
    assert all(o["meta_info"]["zipage_compactions"] == 0 for o in ours)
    # an own budget below the 31-token window is refused, naming the field (never raised)
    window = state["layout"]["sliding_window"]
    r = requests.post(zipage.url + "/generate", timeout=600, json={
        "input_ids": _prompts(1, 30, 3)[0], "sampling_params": {**_greedy(120), "zipage_kv_budget": 16}})
    assert r.status_code == 400, r.text
    assert "zipage_kv_budget 16 is below" in r.text and f"({window} tokens)" in r.text
    assert_healthy(zipage)
