"""The calibrated scorer end to end on SGLang's CPU path (issue 46).

``python -m sglang_zipage.calibrate`` serves the model, prefills the shipped code text (4
centroids per head, so it takes seconds) and captures the scored layers' queries: on the
bundled model they equal the HF reference's pre-RoPE queries over the same chunks. A server
started with ``--zipage-scorer calibrated --zipage-query-stats`` that file compresses with its
KV bounded, holds no query window (0 slots, 0 window bytes, the statistics counted in its
memory instead) and never compacts without a window; so does a sliding-window hybrid with FP8
KV (tiny Gemma 3, dummy weights, calibrated on random ids: its two global layers only), its
statistics written to and found at the model's folder over another model's left there.
Started with a statistics file that is not there, it is refused before anything starts,
naming the command that makes one.
Run: .venv/bin/python -m pytest tests/e2e/test_calibrated_scorer.py
"""

import os
import shutil
import subprocess
import sys

import pytest

import torch

from sglang_zipage.harness.server import OFFLINE_ENV, STRICT_MEM_ENV, Server, free_port
from sglang_zipage.query_stats import QueryStats
from zipage_server import REPO, assert_healthy

QUERIES, BUDGET, BUFFER, OUT = 4, 64, 16, 200
LAYERS, HEADS, DIM = 30, 9, 64  # SmolLM2-135M


def calibrate(out, *flags):
    done = subprocess.run([sys.executable, "-m", "sglang_zipage.calibrate", "--queries",
                           str(QUERIES), "--domains", "code", "--chunk", "512", "--out", str(out),
                           *flags], capture_output=True, text=True, timeout=900,
                          env={**os.environ, **OFFLINE_ENV})
    assert done.returncode == 0, done.stderr[-3000:]
    return out


@pytest.fixture(scope="module")
def stats_file(tmp_path_factory):
    return calibrate(tmp_path_factory.mktemp("calibrate") / "stats.safetensors")


@pytest.fixture(scope="module")
def server(stats_file, tmp_path_factory):
    srv = Server(["--zipage-scorer", "calibrated", "--zipage-query-stats", str(stats_file),
                  "--zipage-mode", "fixed", "--zipage-kv-budget", str(BUDGET), "--zipage-buffer",
                  str(BUFFER)], tmp_path_factory.mktemp("calibrated") / "server.log",
                 env=STRICT_MEM_ENV)
    yield srv
    srv.stop()


def test_calibration_measures_the_bundled_models_queries(stats_file):
    """The queries SGLang's forward computed, undone from RoPE at their positions, are the
    model's pre-RoPE queries: their means equal the HF reference's over the same chunks."""
    from transformers import AutoTokenizer

    from sglang_zipage.calibrate import chunks
    from sglang_zipage.harness.fidelity.hf_reference import HFReference
    from sglang_zipage.model import bundled_model_path

    stats = QueryStats.load(str(stats_file))
    assert stats.centroids.shape == (LAYERS, HEADS, QUERIES, DIM)
    assert stats.mean.shape == (LAYERS, HEADS, DIM) and stats.neox
    assert stats.layer_ids == list(range(LAYERS)) and stats.rope_start == 0
    assert stats.meta["domains"] == ["code"] and stats.meta["texts"] == "calibration_texts.json"
    tok = AutoTokenizer.from_pretrained(bundled_model_path())
    parts = chunks(lambda t: tok(t, add_special_tokens=False)["input_ids"], ["code"], 512)
    hf = HFReference(bundled_model_path()).calibrate(parts)
    assert stats.tokens == hf.counts[0] == sum(len(p) for p in parts) > 1000
    hf_mean = torch.stack([hf.sums[layer] / hf.counts[layer] for layer in range(LAYERS)]).float()
    cos = torch.nn.functional.cosine_similarity(stats.mean, hf_mean, dim=-1)
    assert cos.min() > 0.9999, cos.min()  # bf16 forward against fp32: 0.999998 measured


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


def test_a_sliding_window_hybrid_with_fp8_kv_compresses_with_its_statistics(tmp_path):
    """Calibrated into the model's folder, over statistics of another model left there (they
    must not refuse the run that remakes them), and found there by the default scorer."""
    folder = tmp_path / "tiny-gemma3"
    shutil.copytree(REPO / "tests/e2e/models/tiny-gemma3", folder)
    out = folder / "zipage_query_stats.safetensors"
    shutil.copy(REPO / "sglang_zipage/query_stats_smollm2_135m.safetensors", out)
    model = ["--model-path", str(folder), "--load-format", "dummy", "--random-seed", "0",
             "--kv-cache-dtype", "fp8_e4m3"]
    done = subprocess.run([sys.executable, "-m", "sglang_zipage.calibrate", "--queries",
                           str(QUERIES), "--chunk", "512", *model], capture_output=True, text=True, timeout=900,
                          env={**os.environ, **OFFLINE_ENV})
    assert done.returncode == 0, done.stderr[-3000:]
    stats = QueryStats.load(str(out))
    assert stats.meta["texts"] == "random ids"  # a dummy model has no tokenizer
    srv = Server([*model, "--skip-tokenizer-init", "--max-total-tokens", "2048",
                  "--zipage-mode", "fixed", "--zipage-kv-budget", str(BUDGET), "--zipage-buffer",
                  str(BUFFER)], tmp_path / "server.log", env=STRICT_MEM_ENV)
    try:
        greedy = {"max_new_tokens": OUT, "temperature": 0, "ignore_eos": True}
        outs = srv.generate_ids([[10 + 3 * i + j for j in range(30)] for i in range(3)],
                                [greedy] * 3)
        state = srv.zipage_state()
        layout = state["layout"]
        assert layout["layout"] == "mha+sliding-window" and layout["scored_layers"] == 2
        assert layout["key_dtype"] == "torch.float8_e4m3fn"
        assert len(stats.layer_ids) == 2 and max(stats.layer_ids) == 3  # the global layers
        for o in outs:
            meta = o["meta_info"]
            assert meta["completion_tokens"] == OUT and meta["zipage_compactions"] >= 1
            assert meta["zipage_kv_len"] <= meta["prompt_tokens"] + BUDGET + BUFFER
        assert state["window_slots"] == 0 and state["windowless_compactions"] == 0
        assert_healthy(srv)
    finally:
        srv.stop()
