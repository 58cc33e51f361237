"""Start and stop a real `python -m sglang_zipage.launch_server` for tests."""

from __future__ import annotations

import os
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
CHUNK_TOKENS = "64"  # long prompts are prefilled in chunks, as on a busy GPU server
STRICT_MEM_ENV = {
    "SGLANG_ENABLE_STRICT_MEM_CHECK_DURING_BUSY": "1",
    "SGLANG_CHECK_KV_PAGE_INVARIANTS": "1",
    "SGLANG_DEBUG_MEMORY_POOL": "1",
}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """A launched server; ``url``, ``log_path``, ``stop()`` -> pids still alive after it."""

    def __init__(self, args, log_path: Path, env=None, ready_timeout: float = 600):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = Path(log_path)
        full_env = {**os.environ, **(env or {})}
        self._log = open(self.log_path, "w")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "sglang_zipage.launch_server", "--host", "127.0.0.1",
             "--port", str(self.port), *args],
            stdout=self._log, stderr=subprocess.STDOUT, env=full_env, cwd=str(REPO))
        deadline = time.monotonic() + ready_timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited with {self.proc.returncode}:\n{self.log()[-3000:]}")
            try:
                if requests.get(self.url + "/health", timeout=5).status_code == 200:
                    return
            except requests.RequestException:
                pass
            time.sleep(1)
        self.stop()
        raise RuntimeError(f"server not ready in {ready_timeout}s:\n{self.log()[-3000:]}")

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def generate(self, text, max_new_tokens, **sampling):
        body = {"text": text, "sampling_params": {"max_new_tokens": max_new_tokens,
                                                  "temperature": 0, **sampling}}
        r = requests.post(self.url + "/generate", json=body, timeout=1800)
        r.raise_for_status()
        return r.json()

    def zipage_state(self):
        info = requests.get(self.url + "/server_info", timeout=60).json()
        return info["internal_states"][0].get("zipage")

    def stop(self):
        """SIGTERM, wait, and return the pids of the server's tree still alive."""
        try:
            tree = [self.proc.pid] + [c.pid for c in psutil.Process(self.proc.pid).children(recursive=True)]
        except psutil.NoSuchProcess:
            tree = [self.proc.pid]
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                pass
        deadline = time.monotonic() + 30
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


def repetition_rate(text: str, n: int = 4) -> float:
    """Share of word n-grams that repeat an earlier one: 0 = none, near 1 = a loop."""
    words = text.split()
    grams = [tuple(words[i:i + n]) for i in range(len(words) - n + 1)]
    return 1 - len(set(grams)) / len(grams) if grams else 0.0


def assert_healthy(server):
    """The server answers and its log holds no traceback (the strict memory checker and
    every scheduler error end in one)."""
    assert requests.get(server.url + "/health", timeout=30).status_code == 200
    log = server.log()
    assert "Traceback" not in log, log[log.index("Traceback"):][:3000]


def load_example(name: str):
    """Import examples/<name>.py (not a package) so a test can call its functions."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(f"{name}_example", REPO / "examples" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
