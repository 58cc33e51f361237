"""A clean start (issue 44 item 6), with real launchers on the CPU.

- The issue's capped command on the bundled SmolLM2-135M (--max-total-tokens 2048
  --max-running-requests 16 --zipage-kv-budget 64 --zipage-buffer 16, launcher defaults
  otherwise), which the scheduler refused at 77a084c, starts: zipage's share comes from the
  memory SGLang could give the pool, the pool keeps its 2048 tokens, /server_info says both;
  a crowd that outgrows the pool compresses.
- A plan no memory of this machine could fit (--zipage-memory-fraction 1e-7) is refused by the
  launcher before any SGLang process starts (exit code 1, the message, no traceback, no
  scheduler log line), and by Engine's check with the same message.
- A plan only the scheduler makes (Gemma 3: its sliding-window layers are told apart in the
  built model) that cannot fit once SGLang has profiled the memory: the launcher exits with
  code 1 and the message once, no traceback, no SIGKILL; an Engine raises memory.NoRoom with
  the message.
Run: .venv/bin/python -m pytest tests/e2e/test_clean_start.py
"""

import os
import subprocess
import sys

import pytest

from sglang_zipage import memory
from sglang_zipage.harness.server import OFFLINE_ENV, STRICT_MEM_ENV, Server, free_port
from zipage_server import REPO, assert_healthy

CAPPED = ["--max-total-tokens", "2048", "--max-running-requests", "16",
          "--zipage-kv-budget", "64", "--zipage-buffer", "16",
          "--zipage-scorer", "window"]  # the query window's share (M2); the bundled default: calibrated
NO_ROOM_SHARE = "0.0000001"  # 2.4 KiB of 24 GiB: less than one window slot on any machine
GEMMA3 = ["--model-path", str(REPO / "tests/e2e/models/tiny-gemma3"), "--load-format", "dummy",
          "--skip-tokenizer-init", "--zipage-kv-budget", "64", "--zipage-buffer", "16"]
SCHEDULER_LINE = "Load weight begin"  # the scheduler's first line once the model loads
REFUSED = "error: sglang-zipage cannot fit its buffers"


@pytest.fixture(scope="module")
def capped(tmp_path_factory):
    srv = Server(CAPPED, tmp_path_factory.mktemp("capped") / "capped.log", env=STRICT_MEM_ENV)
    yield srv
    srv.stop()


def test_the_capped_command_starts_with_its_share_beside_the_pool(capped):
    plan = capped.zipage_state()["memory"]
    assert plan["share_taken_from"] == memory.SHARE_BASE
    assert plan["available_bytes"] > plan["stock_kv_pool_bytes"]  # the cap left memory free
    assert plan["pool_tokens"] == plan["stock_pool_tokens"] == 2048
    assert plan["taken_from_pool_bytes"] == 0
    assert plan["zipage_bytes"] <= plan["share"] * plan["available_bytes"]  # M1
    assert plan["window_slots"] == plan["slots_wanted"] == 16  # M2: what can run
    log = capped.log()
    assert memory.SHARE_BASE in log and "keeps its 2048 tokens" in log
    # 16 requests of 20 + 150 tokens: more than 2048 at full KV, so they compress
    prompts = [list(range(100 + 20 * i, 120 + 20 * i)) for i in range(16)]
    outs = capped.generate_ids(prompts, [{"max_new_tokens": 150, "temperature": 0,
                                          "ignore_eos": True}] * 16)
    metas = [o["meta_info"] for o in outs]
    assert all(m["completion_tokens"] == 150 for m in metas)
    assert sum(m["zipage_compactions"] for m in metas) > 0
    assert capped.zipage_state()["compactions"] > 0
    assert_healthy(capped)


def _launch(args, cwd):
    """The real launcher, run to its end: (exit code, stdout + stderr)."""
    r = subprocess.run([sys.executable, "-m", "sglang_zipage.launch_server", "--host",
                        "127.0.0.1", "--port", str(free_port()), *args],
                       capture_output=True, text=True, timeout=600, cwd=cwd,
                       env={**os.environ, **OFFLINE_ENV})
    return r.returncode, r.stdout + r.stderr


def test_a_plan_no_memory_could_fit_is_refused_before_anything_starts(tmp_path):
    code, out = _launch(["--zipage-memory-fraction", NO_ROOM_SHARE], tmp_path)
    assert code == 1, out[-3000:]
    assert out.count(REFUSED) == 1 and "LlamaForCausalLM" in out
    assert "this device has, more than SGLang can give the KV pool" in out
    assert "Traceback" not in out
    assert SCHEDULER_LINE not in out and "server_args=" not in out  # SGLang never launched


def test_engine_check_refuses_the_same_plan():
    from sglang_zipage.engine import checked

    with pytest.raises(ValueError, match="cannot fit its buffers for LlamaForCausalLM"):
        checked(zipage_memory_fraction=float(NO_ROOM_SHARE))


def test_a_plan_that_fails_once_memory_is_known_ends_cleanly(tmp_path):
    code, out = _launch([*GEMMA3, "--zipage-memory-fraction", NO_ROOM_SHARE], tmp_path)
    assert code == 1, out[-3000:]
    assert SCHEDULER_LINE in out  # refused by the scheduler, once the memory was profiled
    assert out.count(REFUSED) == 1 and "Gemma3ForCausalLM" in out
    assert f"MiB {memory.SHARE_BASE}:" in out
    assert "Traceback" not in out and "Received sigquit" not in out


ENGINE = """
from sglang_zipage import Engine, memory
try:
    Engine(model_path={model!r}, load_format="dummy", skip_tokenizer_init=True,
           zipage_kv_budget=64, zipage_buffer=16, zipage_memory_fraction={share})
except memory.NoRoom as e:
    print("NoRoom:", e)
"""


def test_an_engine_raises_the_schedulers_refusal(tmp_path):
    script = ENGINE.format(model=GEMMA3[1], share=float(NO_ROOM_SHARE))
    r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                       timeout=600, cwd=tmp_path, env={**os.environ, **OFFLINE_ENV})
    out = r.stdout + r.stderr
    assert r.returncode == 0, out[-3000:]
    assert "NoRoom: sglang-zipage cannot fit its buffers for Gemma3ForCausalLM" in r.stdout
    assert "Traceback" not in out
