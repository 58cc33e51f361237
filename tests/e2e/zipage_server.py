"""The e2e tests' own settings and helpers; the servers themselves are
sglang_zipage.harness.server.Server (``python -m sglang_zipage.launch_server``).

SGLang's CPU kernels are not batch-invariant on every processor, and which requests share a
batch depends on timing. So a test compares outputs only where the batch composition is the
same on both sides: ``Server.idle_and_flushed()`` first (nothing running, empty radix cache),
then one request at a time, or one ``generate_ids`` call (a batch of token-id prompts reaches
the scheduler as one message, so it is admitted as one batch). Quality is measured by teacher
forcing (``force``): per-step log-probabilities and top-1 tokens of a full-KV continuation,
decoded under compression, which no numerical jitter can derail.
"""

from __future__ import annotations

import functools
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import requests

REPO = Path(__file__).resolve().parents[2]
POOL_TOKENS = "640"  # too small for 4 x 300-token outputs, large enough for 4 budgets
# Half the memory SGLang could give the pool: what the tests ran with when the share came out
# of their few hundred tokens. Their pools are capped, so since issue 44 the default 3% of that
# memory holds the window slots of every request that can compress at once too (memory.py).
POOL_SHARE = ["--zipage-memory-fraction", "0.5"]
SMALL_BUDGET = ["--zipage-kv-budget", "64", "--zipage-buffer", "16", *POOL_SHARE]
# Compress at budget + buffer however much room the pool has (the default, elastic, keeps full
# KV while there is room): what the tests of compaction itself need.
FIXED_MODE = ["--zipage-mode", "fixed"]
CHUNK_TOKENS = "64"  # long prompts are prefilled in chunks, as on a busy GPU server
# The conftest fixture `references` holds the model's greedy full-KV continuations of these.
REFERENCE_PROMPTS = ["Explain how rainbows form.", "Describe how a bicycle works."]
REFERENCE_TOKENS = 200
# The session servers (conftest): the bundled model, a small pool, chunked prefill.
COMMON_ARGS = ["--max-total-tokens", POOL_TOKENS, "--chunked-prefill-size", CHUNK_TOKENS,
               "--enable-custom-logit-processor", "--enable-tokenizer-batch-encode", *POOL_SHARE]
ZIPAGE_ARGS = [*SMALL_BUDGET, *FIXED_MODE, "--enable-metrics", "--enable-cache-report"]


def chat_prompt(user: str, system: str = None) -> str:
    """SmolLM2's chat template, written out (the /generate API takes raw text)."""
    s = f"<|im_start|>system\n{system}<|im_end|>\n" if system else ""
    return f"{s}<|im_start|>user\n{user}<|im_end|>\n<|im_start|>assistant\n"


@functools.lru_cache(maxsize=None)
def _tokenizer():
    from transformers import AutoTokenizer

    from sglang_zipage.model import bundled_model_path

    return AutoTokenizer.from_pretrained(bundled_model_path())


def token_ids(text: str):
    """The bundled model's token ids of ``text``, as SGLang's tokenizer manager makes them."""
    return _tokenizer().encode(text)


def force(server, prompt_ids, refs, rec_dir, per_request=None, **sampling):
    """Teacher forcing through the server's real decode (sglang_zipage.forcing; the server
    needs --enable-custom-logit-processor): request i decodes refs[i] token by token, all in one
    batch, with ``sampling`` and its own ``per_request[i]`` options. Returns
    one record per request: per step the raw log-probability of the reference token
    (``logprob``), the top-1 token (``top1``) and the compactions before it
    (``compactions_before``), plus the response's ``meta_info``."""
    from sglang_zipage.forcing import ForceReference

    rec_dir = Path(rec_dir)
    rec_dir.mkdir(parents=True, exist_ok=True)
    keys = [f"{os.getpid()}-{time.monotonic_ns()}-{i}" for i in range(len(refs))]
    params = [{"temperature": 0, "max_new_tokens": len(ref), "ignore_eos": True, **sampling,
               **own, "custom_params": {"ref": list(ref), "out": str(rec_dir), "key": key}}
              for ref, key, own in zip(refs, keys, per_request or [{}] * len(refs))]
    outs = server.generate_ids(prompt_ids, params,
                               custom_logit_processor=[ForceReference.to_str()] * len(refs))
    records = []
    for key, ref, out in zip(keys, refs, outs):
        assert out["output_ids"] == list(ref), "the server did not emit the forced tokens"
        rec = json.loads((rec_dir / f"{key}.json").read_text())
        rec["meta_info"] = out["meta_info"]
        records.append(rec)
    return records


def nll_ratio(record, full_record) -> float:
    """Summed negative log-likelihood of the reference tokens under compression over the
    same under full KV, both teacher-forced, over the steps after the first compaction:
    how much compression costs the model on its own continuation (1 = nothing). With the
    bundled model, budget 64 + 16 and 200 forced tokens it measured 1.17 and 1.46; with RoPE
    positions left physical (the offset skipped) 5.0 and 5.8."""
    steps = [i for i, n in enumerate(record["compactions_before"]) if n > 0]
    assert steps, "no step decoded under compression"
    return (sum(-record["logprob"][i] for i in steps)
            / sum(-full_record["logprob"][i] for i in steps))


def top1_agreement(record, ref) -> float:
    """Share of forced steps whose top-1 token is the reference token. For a reference that
    is the model's own greedy full-KV continuation this is 1 with full KV, by construction
    (up to near-ties), and falls as compression loses what the model needs."""
    return sum(t == r for t, r in zip(record["top1"], ref)) / len(ref)


def assert_healthy(server):
    """The server answers and its log holds no traceback (the strict memory checker and
    every scheduler error end in one)."""
    assert requests.get(server.url + "/health", timeout=30).status_code == 200
    log = server.log()
    assert "Traceback" not in log, log[log.index("Traceback"):][:3000]


def router(args, workers: int, log_path):
    """``python -m sglang_router.launch_router`` with ``args`` -> (process, url), once its
    ``workers`` are registered and healthy."""
    from sglang_zipage.harness.server import free_port

    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "sglang_router.launch_router", "--host",
                             "127.0.0.1", "--port", str(port), "--prometheus-port",
                             str(free_port()), *args],
                            stdout=open(log_path, "w"), stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            listed = requests.get(url + "/workers", timeout=5).json()["workers"]
            if sum(w["is_healthy"] for w in listed) == workers:
                return proc, url
        except requests.RequestException:
            pass
        time.sleep(1)
    proc.kill()
    raise RuntimeError("router not ready:\n" + open(log_path).read()[-3000:])


def load_example(name: str):
    """Import examples/<name>.py (not a package) so a test can call its functions."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(f"{name}_example", REPO / "examples" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def tiny_range_server(tmp_path_factory, name: str, floor: int, extra=()):
    """A module's server (yield from it in a fixture): the 2-layer dummy Qwen3, elastic, the
    small budget in a POOL_TOKENS pool, a budget range down to ``floor``, SGLang's strict
    memory checker after every step; ``extra``: more flags."""
    import shutil

    from sglang_zipage.harness.engines import tiny_model_dir
    from sglang_zipage.harness.server import STRICT_MEM_ENV, Server

    model = tiny_model_dir()
    srv = Server(["--model-path", model, "--load-format", "dummy", "--skip-tokenizer-init",
                  "--max-total-tokens", POOL_TOKENS, *SMALL_BUDGET,
                  "--zipage-min-kv-budget", str(floor), *extra],
                 tmp_path_factory.mktemp(name) / "server.log", env=STRICT_MEM_ENV)
    yield srv
    srv.stop()
    shutil.rmtree(model, ignore_errors=True)
