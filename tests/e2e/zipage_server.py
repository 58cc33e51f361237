"""Start and stop a real `python -m sglang_zipage.launch_server` for tests, and the helpers
that make output comparisons hold on any CPU and under load.

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
import random
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import psutil
import requests

REPO = Path(__file__).resolve().parents[2]
POOL_TOKENS = "640"  # too small for 4 x 300-token outputs, large enough for 4 budgets
SMALL_BUDGET = ["--zipage-kv-budget", "64", "--zipage-buffer", "16"]
# Compress at budget + buffer however much room the pool has (the default, elastic, keeps full
# KV while there is room): what the tests of compaction itself need.
FIXED_MODE = ["--zipage-mode", "fixed"]
CHUNK_TOKENS = "64"  # long prompts are prefilled in chunks, as on a busy GPU server
# The conftest fixture `references` holds the model's greedy full-KV continuations of these.
REFERENCE_PROMPTS = ["Explain how rainbows form.", "Describe how a bicycle works."]
REFERENCE_TOKENS = 200
# The session servers (conftest): the bundled model, a small pool, chunked prefill.
COMMON_ARGS = ["--max-total-tokens", POOL_TOKENS, "--chunked-prefill-size", CHUNK_TOKENS,
               "--enable-custom-logit-processor", "--enable-tokenizer-batch-encode"]
ZIPAGE_ARGS = [*SMALL_BUDGET, *FIXED_MODE, "--enable-metrics", "--enable-cache-report"]
STRICT_MEM_ENV = {
    "SGLANG_ENABLE_STRICT_MEM_CHECK_DURING_BUSY": "1",
    "SGLANG_CHECK_KV_PAGE_INVARIANTS": "1",
    "SGLANG_DEBUG_MEMORY_POOL": "1",
}


def _ephemeral_range() -> tuple[int, int]:
    try:
        lo, hi = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()
        return int(lo), int(hi)
    except (OSError, ValueError):
        return 32768, 60999


def free_port() -> int:
    """A free port outside the kernel's ephemeral range. SGLang picks its own NCCL/gloo ports
    with bind(0), i.e. from the ephemeral range, so a server started beside another one could
    otherwise take the port this one was promised before it binds it."""
    lo, hi = _ephemeral_range()
    candidates = [p for p in range(20000, 32000) if not lo <= p <= hi] or list(range(hi + 1, 65535))
    rng = random.Random(os.getpid() ^ time.monotonic_ns())
    for port in rng.sample(candidates, min(200, len(candidates))):
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError("no free port outside the ephemeral range")


BIND_FAILED = "address already in use"


class Server:
    """A launched server; ``url``, ``log_path``, ``stop()`` -> pids still alive after it."""

    def __init__(self, args, log_path: Path, env=None, ready_timeout: float = 600, attempts: int = 3):
        self.log_path = Path(log_path).resolve()
        self._env = {**os.environ, **(env or {})}
        for attempt in range(attempts):
            if self._start(args, ready_timeout):
                return
        raise RuntimeError(f"server could not bind a port in {attempts} attempts:\n{self.log()[-3000:]}")

    def _start(self, args, ready_timeout) -> bool:
        """Launch on a fresh port; True once healthy, False if the port was taken before the
        server bound it (the caller retries on another port); raises on any other failure."""
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self._log = open(self.log_path, "w")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "sglang_zipage.launch_server", "--host", "127.0.0.1",
             "--port", str(self.port), *args],
            # in the log's folder, not the repository root: there `python -m` would find the
            # root's kernels/ as the top-level `kernels` (PyPI's, which transformers probes
            # for; on the device, where the package runs from PYTHONPATH, the server died)
            stdout=self._log, stderr=subprocess.STDOUT, env=self._env, cwd=self.log_path.parent)
        deadline = time.monotonic() + ready_timeout
        while time.monotonic() < deadline:
            if BIND_FAILED in self.log():  # uvicorn logs it, then hangs in shutdown
                self.stop(grace=5)
                return False
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited with {self.proc.returncode}:\n{self.log()[-3000:]}")
            try:
                if requests.get(self.url + "/health", timeout=5).status_code == 200:
                    return True
            except requests.RequestException:
                pass
            time.sleep(1)
        self.stop()
        raise RuntimeError(f"server not ready in {ready_timeout}s:\n{self.log()[-3000:]}")

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def generate(self, text, max_new_tokens, return_logprob=False, **sampling):
        body = {"text": text, "return_logprob": return_logprob,
                "sampling_params": {"max_new_tokens": max_new_tokens, "temperature": 0, **sampling}}
        r = requests.post(self.url + "/generate", json=body, timeout=1800)
        r.raise_for_status()
        return r.json()

    def generate_ids(self, input_ids, sampling_params, **body):
        """One /generate call with a batch of token-id prompts (and one sampling-params dict
        per prompt). SGLang sends such a batch to the scheduler as one message, so on an idle
        server every prompt is admitted in the same step: the same batch composition on
        every run. Returns one response per prompt; ``output_ids`` holds the tokens."""
        r = requests.post(self.url + "/generate", timeout=1800,
                          json={"input_ids": input_ids, "sampling_params": sampling_params, **body})
        r.raise_for_status()
        return r.json()

    def idle_and_flushed(self, timeout: float = 900):
        """Wait until no request runs or waits (earlier tests may have left some), then empty
        the radix cache, so what comes next sees the same cache state on every server."""
        deadline = time.monotonic() + timeout
        while requests.post(self.url + "/flush_cache", timeout=60).status_code != 200:
            if time.monotonic() > deadline:
                raise RuntimeError(f"{self.url} still busy after {timeout}s")
            time.sleep(0.5)

    def zipage_state(self):
        info = requests.get(self.url + "/server_info", timeout=60).json()
        return info["internal_states"][0].get("zipage")

    def stop(self, grace: float = 60):
        """SIGTERM, wait up to ``grace`` s, kill what is left of the server's tree; returns
        the pids that were still alive after the wait."""
        try:
            tree = [self.proc.pid] + [c.pid for c in psutil.Process(self.proc.pid).children(recursive=True)]
        except psutil.NoSuchProcess:
            tree = [self.proc.pid]
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=grace)
            except subprocess.TimeoutExpired:
                pass
        deadline = time.monotonic() + grace / 2
        alive = [p for p in tree if psutil.pid_exists(p) and not _zombie(p)]
        while alive and time.monotonic() < deadline:
            time.sleep(0.5)
            alive = [p for p in tree if psutil.pid_exists(p) and not _zombie(p)]
        for p in alive:  # do not leak processes into the rest of the run
            try:
                os.kill(p, signal.SIGKILL)
            except OSError:
                pass
        self._log.close()
        return alive


def _zombie(pid) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


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


def force(server, prompt_ids, refs, rec_dir, **sampling):
    """Teacher forcing through the server's real decode (sglang_zipage.forcing; the server
    needs --enable-custom-logit-processor): request i decodes refs[i] token by token. Returns
    one record per request: per step the raw log-probability of the reference token
    (``logprob``), the top-1 token (``top1``) and the compactions before it
    (``compactions_before``), plus the response's ``meta_info``."""
    from sglang_zipage.forcing import ForceReference

    rec_dir = Path(rec_dir)
    rec_dir.mkdir(parents=True, exist_ok=True)
    keys = [f"{os.getpid()}-{time.monotonic_ns()}-{i}" for i in range(len(refs))]
    params = [{"temperature": 0, "max_new_tokens": len(ref), "ignore_eos": True, **sampling,
               "custom_params": {"ref": list(ref), "out": str(rec_dir), "key": key}}
              for ref, key in zip(refs, keys)]
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


def tiny_model_dir() -> str:
    """The 2-layer dummy Qwen3 of benchmarks/bench_throughput.py (--tiny), in a fresh temp
    folder (the caller removes it): fast on a CPU where the model's quality does not matter."""
    sys.path.insert(0, str(REPO / "benchmarks"))
    from bench_throughput import tiny_model_dir as make

    return make()


def load_example(name: str):
    """Import examples/<name>.py (not a package) so a test can call its functions."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(f"{name}_example", REPO / "examples" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
