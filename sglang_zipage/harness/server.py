"""Start and stop a real ``python -m sglang_zipage.launch_server``: the e2e tests' servers and
the servers that steady_state.py, soak.py --start-server and elastic_cpu.py measure.

``Server(args, log_path, env)`` picks a free port outside the kernel's ephemeral range,
starts the launcher in the log's folder, waits for ``/health`` and retries on another port
if uvicorn lost the port before binding it; ``stop()`` sends SIGTERM (SGLang drains and ends
its own tree), then kills whatever of the tree outlived the grace period.
"""

from __future__ import annotations

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

# SGLang's strict memory checks: leaks, double frees and page invariants, checked after
# every busy step and when idle; a failure raises in the scheduler (unhealthy server,
# traceback in its log). The engines of gpu_check.py and coverage.py run with these two.
STRICT_CHECKS_ENV = {
    "SGLANG_ENABLE_STRICT_MEM_CHECK_DURING_BUSY": "1",
    "SGLANG_CHECK_KV_PAGE_INVARIANTS": "1",
}
# ... and the allocator's debug mode too: the servers of the e2e tests and of the soak.
STRICT_MEM_ENV = {**STRICT_CHECKS_ENV, "SGLANG_DEBUG_MEMORY_POOL": "1"}
# Nothing from a model hub: dummy weights, local tokenizers.
OFFLINE_ENV = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
# A PD pair's KV transfer: mooncake, over TCP unless MC_FORCE_TCP=0 is set (the CPU and the lent
# GPU machines have no RDMA device; SGLang's mooncake_tcp choice sets the same variable; the
# CUDA build stages GPU buffers itself).
PD_TRANSFER = ["--disaggregation-transfer-backend", "mooncake"]
PD_ENV = {"MC_FORCE_TCP": os.environ.get("MC_FORCE_TCP", "1")}
# A steady load's transfers over TCP: mooncake fails a synchronous transfer after 30 s
# (MC_TRANSFER_TIMEOUT) and SGLang's sender then blacklists the decode session, failing every
# later request (a backlog of warm-start transfers on an H100 did: steady-8k-pd-failed-h100.json);
# the timeout and the TCP per-peer queues as TCP deployments raise them, unless set.
PD_LOAD_ENV = {k: os.environ.get(k, v) for k, v in (
    ("MC_TRANSFER_TIMEOUT", "300"), ("MC_TCP_MAX_QUEUED_TRANSFERS_PER_PEER", "65535"),
    ("MC_TCP_MAX_PENDING_ADMISSIONS_PER_PEER", "65535"), ("MC_TCP_ADMISSION_TIMEOUT_MS", "120000"))}
LAUNCHER = ["-m", "sglang_zipage.launch_server"]
BIND_FAILED = "address already in use"


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


class Server:
    """A launched server; ``url``, ``port``, ``proc``, ``log_path``, ``stop()`` -> pids still
    alive after it."""

    def __init__(self, args, log_path: Path, env=None, ready_timeout: float = 600, attempts: int = 3):
        self.args = list(args)
        self.log_path = Path(log_path).resolve()
        self._env = {**os.environ, **(env or {})}
        for attempt in range(attempts):
            if self._start(ready_timeout):
                return
        raise RuntimeError(f"server could not bind a port in {attempts} attempts:\n{self.log()[-3000:]}")

    def command(self) -> list:
        """The launcher's argv (this interpreter), host and port included."""
        return [sys.executable, *LAUNCHER, "--host", "127.0.0.1", "--port", str(self.port), *self.args]

    def _start(self, ready_timeout) -> bool:
        """Launch on a fresh port; True once healthy, False if the port was taken before the
        server bound it (the caller retries on another port); raises on any other failure."""
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self._log = open(self.log_path, "w")
        self.proc = subprocess.Popen(
            self.command(),
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
        """The first replica's zipage state from /server_info (None on a stock server)."""
        from sglang_zipage.harness.probe import zipage_state

        return zipage_state(self.url)

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


def stop_process(proc, grace_s: float = 15.0) -> None:
    """Terminate a child process (a Popen or None), kill it if it outlives ``grace_s``."""
    if proc is None or proc.poll() is not None:
        return
    proc.terminate()
    try:
        proc.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=grace_s)


def mini_balancer(prefill_url: str, bootstrap_port: int, decode_url: str, log_path: Path,
                  timeout_s: float = 120.0):
    """SGLang's Python load balancer for a PD pair (``sglang_router.launch_router --mini-lb
    --pd-disaggregation``: the router package's Python part, which runs without its Rust
    router) -> (process, url), once it answers ``/health``."""
    log_path = Path(log_path)
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "sglang_router.launch_router", "--mini-lb",
                             "--pd-disaggregation", "--host", "127.0.0.1", "--port", str(port),
                             "--prefill", prefill_url, str(bootstrap_port),
                             "--decode", decode_url],
                            stdout=open(log_path, "w"), stderr=subprocess.STDOUT,
                            cwd=log_path.parent)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            if requests.get(url + "/health", timeout=5).status_code == 200:
                return proc, url
        except requests.RequestException:
            pass
        time.sleep(1)
    stop_process(proc)
    raise RuntimeError("load balancer not ready:\n" + log_path.read_text()[-3000:])
