"""The launcher's CLI: --help, and startup refusals that name the flag (issue 2, 4).

Run: .venv/bin/python -m pytest tests/e2e/test_launcher.py
"""

import subprocess
import sys

import pytest

from zipage_server import REPO


def _launch(*args, timeout=300):
    return subprocess.run([sys.executable, "-m", "sglang_zipage.launch_server", *args],
                          capture_output=True, text=True, timeout=timeout, cwd=str(REPO))


def test_help_lists_zipage_flags_with_defaults():
    r = _launch("--help")
    assert r.returncode == 0
    for flag in ("--zipage-kv-budget", "--zipage-buffer", "--zipage-window", "--zipage-disable",
                 "--zipage-async", "--zipage-decay", "--zipage-redundancy", "--zipage-pooling",
                 "--zipage-sink", "--model-path", "--attention-backend"):
        assert flag in r.stdout
    assert "default: 2048" in r.stdout


@pytest.mark.parametrize("args, flag", [
    (["--zipage-kv-budget", "0"], "--zipage-kv-budget"),
    (["--zipage-kv-budget", "8", "--zipage-window", "16"], "--zipage-kv-budget"),
    (["--zipage-decay", "1.5"], "--zipage-decay"),
    (["--zipage-pooling", "4"], "--zipage-pooling"),
    (["--zipage-redundancy", "sometimes"], "--zipage-redundancy"),
    (["--zipage-kv-budget", "many"], "--zipage-kv-budget"),
])
def test_invalid_zipage_values_stop_startup_naming_the_flag(args, flag):
    r = _launch(*args, "--model-path", "/nonexistent-model-never-loaded", timeout=60)
    assert r.returncode != 0
    assert flag in r.stderr


def test_budget_must_be_page_aligned():
    r = _launch("--page-size", "16", "--zipage-kv-budget", "100")
    assert r.returncode != 0
    assert "--zipage-kv-budget" in r.stderr and "--page-size 16" in r.stderr


@pytest.mark.parametrize("flag", ["--enable-mixed-chunk", "--enable-torch-compile"])
def test_unsupported_feature_is_refused_with_a_way_out(flag):
    r = _launch(flag)
    assert r.returncode != 0
    assert flag in r.stderr and "--zipage-disable" in r.stderr


def test_async_needs_a_buffer_longer_than_its_head_start():
    r = _launch("--zipage-async", "--page-size", "16", "--zipage-kv-budget", "64",
                "--zipage-buffer", "16")
    assert r.returncode != 0
    assert "--zipage-buffer" in r.stderr and "--zipage-async" in r.stderr


def test_every_refusal_is_named_in_one_message():
    """Several problems at once (buffer not page aligned, hierarchical cache, torch
    compile): the launcher names each of them, not only the first."""
    r = _launch("--page-size", "16", "--zipage-buffer", "40", "--enable-hierarchical-cache",
                "--enable-torch-compile")
    assert r.returncode != 0
    for part in ("--zipage-buffer", "--page-size 16", "--enable-hierarchical-cache",
                 "--enable-torch-compile", "--zipage-disable"):
        assert part in r.stderr, r.stderr[-2000:]


def test_a_model_it_cannot_compress_is_refused_by_name_before_loading():
    """Gemma 3's sliding-window layers need the 512 tokens of their window: a 256-token
    budget is refused from the config alone (no weight is read: the folder holds only
    config.json), naming the model, the window and the flag to change."""
    r = _launch("--model-path", str(REPO / "benchmarks/models/gemma-3-1b"), "--load-format",
                "dummy", "--skip-tokenizer-init", "--zipage-kv-budget", "256")
    assert r.returncode != 0
    for part in ("Gemma3ForCausalLM", "sliding window (512 tokens)", "--zipage-kv-budget 512",
                 "--zipage-disable"):
        assert part in r.stderr, r.stderr[-2000:]
