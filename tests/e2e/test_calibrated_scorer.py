"""The calibrated scorer end to end on the bundled model (issue 46), CPU.

``python -m sglang_zipage.calibrate`` measures the bundled model's query statistics (4
centroids per head over the shipped code text, so it takes seconds), a server started with
``--zipage-scorer calibrated --zipage-query-stats`` that file compresses with its KV bounded,
holds no query window (0 slots, 0 window bytes, the statistics counted in its memory instead)
and never compacts without a window; started with a statistics file that is not there it is
refused before anything starts, naming the command that makes one.
Run: .venv/bin/python -m pytest tests/e2e/test_calibrated_scorer.py
"""

import os
import subprocess
import sys

import pytest

from sglang_zipage.harness.server import OFFLINE_ENV, STRICT_MEM_ENV, Server, free_port
from sglang_zipage.query_stats import QueryStats
from zipage_server import assert_healthy

QUERIES, BUDGET, BUFFER, OUT = 4, 64, 16, 200
LAYERS, HEADS, DIM = 30, 9, 64  # SmolLM2-135M


@pytest.fixture(scope="module")
def stats_file(tmp_path_factory):
    out = tmp_path_factory.mktemp("calibrate") / "stats.safetensors"
    done = subprocess.run([sys.executable, "-m", "sglang_zipage.calibrate", "--queries",
                           str(QUERIES), "--domains", "code", "--chunk", "512", "--out", str(out)],
                          capture_output=True, text=True, timeout=900,
                          env={**os.environ, **OFFLINE_ENV})
    assert done.returncode == 0, done.stderr[-3000:]
    return out


@pytest.fixture(scope="module")
def server(stats_file, tmp_path_factory):
    srv = Server(["--zipage-scorer", "calibrated", "--zipage-query-stats", str(stats_file),
                  "--zipage-mode", "fixed", "--zipage-kv-budget", str(BUDGET), "--zipage-buffer",
                  str(BUFFER)], tmp_path_factory.mktemp("calibrated") / "server.log",
                 env=STRICT_MEM_ENV)
    yield srv
    srv.stop()


def test_calibration_measures_the_bundled_models_queries(stats_file):
    stats = QueryStats.load(str(stats_file))
    assert stats.centroids.shape == (LAYERS, HEADS, QUERIES, DIM)
    assert stats.mean.shape == (LAYERS, HEADS, DIM) and stats.neox
    assert stats.tokens > 1000 and stats.meta["domains"] == ["code"]


def test_it_compresses_without_a_query_window(server):
    server.idle_and_flushed()
    prompts = [[100 + 7 * i + j for j in range(20)] for i in range(4)]
    greedy = {"max_new_tokens": OUT, "temperature": 0, "ignore_eos": True}
    outs = server.generate_ids(prompts, [greedy] * 4)
    for o in outs:
        meta = o["meta_info"]
        assert meta["completion_tokens"] == OUT
        assert meta["zipage_compactions"] >= 1
        assert meta["zipage_kv_len"] <= meta["prompt_tokens"] + BUDGET * 4 + BUFFER  # the
        # loop guard may raise a greedy request's budget up to 4x
    state = server.zipage_state()
    assert state["compactions"] >= 4
    assert state["window_slots"] == 0 and state["windowless_compactions"] == 0
    assert state["window_slot_misses"] == 0
    mem = state["memory"]
    assert mem["window_bytes"] == mem["table_bytes"] == mem["slot_bytes"] == 0
    assert mem["stats_bytes"] == LAYERS * QUERIES * HEADS * DIM * 2  # bf16, the model dtype
    assert state["memory_bytes"] == mem["zipage_bytes"]  # all it holds, counted
    assert_healthy(server)


def test_a_missing_statistics_file_is_refused_with_the_command(tmp_path):
    missing = tmp_path / "none.safetensors"
    r = subprocess.run([sys.executable, "-m", "sglang_zipage.launch_server", "--port",
                        str(free_port()), "--zipage-scorer", "calibrated", "--zipage-query-stats",
                        str(missing)], capture_output=True, text=True, timeout=600, cwd=tmp_path,
                       env={**os.environ, **OFFLINE_ENV})
    out = r.stdout + r.stderr
    assert r.returncode == 1, out[-3000:]
    assert f"no query statistics at {missing}" in out
    assert "python -m sglang_zipage.calibrate --model-path" in out
    assert "Traceback" not in out and "server_args=" not in out  # before SGLang starts
