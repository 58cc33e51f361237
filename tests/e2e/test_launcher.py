"""The launcher's CLI: --help, and startup refusals that name the flag (issue 2, 4, 15).

Most refusals are checked in this process through launch_server.prepare (what main runs
first); --help, a bad flag type (argparse), several refusals at once and a refused model
run the real command.

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
                 "--zipage-sink", "--zipage-mode", "--model-path", "--attention-backend"):
        assert flag in r.stdout
    assert "default: 2048" in r.stdout


def _refusal(*args):
    """The launcher's startup checks in this process (launch_server.prepare, what main runs
    before anything starts): the message it exits with, or None if it would start."""
    from sglang_zipage import launch_server

    try:
        launch_server.prepare(list(args))
    except SystemExit as e:
        return str(e.code)
    return None


@pytest.fixture
def clean_env(monkeypatch):
    """prepare() exports the zipage config on success; keep it out of later servers."""
    from sglang_zipage.config import ENV_VAR

    monkeypatch.delenv(ENV_VAR, raising=False)
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)


@pytest.mark.parametrize("args, flag", [
    (["--zipage-kv-budget", "0"], "--zipage-kv-budget"),
    (["--zipage-kv-budget", "8", "--zipage-window", "16"], "--zipage-kv-budget"),
    (["--zipage-decay", "1.5"], "--zipage-decay"),
    (["--zipage-pooling", "4"], "--zipage-pooling"),
])
def test_invalid_zipage_values_stop_startup_naming_the_flag(clean_env, args, flag):
    msg = _refusal(*args, "--model-path", "/nonexistent-model-never-loaded")
    assert msg is not None and flag in msg


@pytest.mark.parametrize("args, flag", [
    (["--zipage-kv-budget", "many"], "--zipage-kv-budget"),
    (["--zipage-redundancy", "sometimes"], "--zipage-redundancy"),
])
def test_values_argparse_rejects_stop_startup_naming_the_flag(args, flag):
    r = _launch(*args, "--model-path", "/nonexistent", timeout=60)
    assert r.returncode != 0
    assert flag in r.stderr


def test_budget_must_be_page_aligned(clean_env):
    msg = _refusal("--page-size", "16", "--zipage-kv-budget", "100")
    assert "--zipage-kv-budget" in msg and "--page-size 16" in msg


@pytest.mark.parametrize("flag", ["--enable-mixed-chunk", "--enable-torch-compile"])
def test_unsupported_feature_is_refused_with_a_way_out(clean_env, flag):
    msg = _refusal(flag)
    assert flag in msg and "--zipage-disable" in msg


def test_speculative_decoding_starts_with_the_calibrated_scorer_else_is_refused_by_name(clean_env):
    """Speculative decoding (issue 45) runs with the calibrated scorer (the default on the
    bundled model, which ships its statistics; its own draft here); the window scorer,
    multi-layer EAGLE and --zipage-async are each refused naming the algorithm and the flag
    to change."""
    from sglang_zipage.model import bundled_model_path

    draft = ["--speculative-draft-model-path", bundled_model_path()]
    assert _refusal("--speculative-algorithm", "STANDALONE", *draft) is None  # auto: calibrated
    draft.append("--zipage-scorer")
    msg = _refusal("--speculative-algorithm", "STANDALONE", *draft, "window")
    assert "--speculative-algorithm STANDALONE needs the calibrated scorer" in msg
    msg = _refusal("--speculative-algorithm", "EAGLE3", *draft, "calibrated",
                   "--enable-multi-layer-eagle")
    assert "EAGLE3 with multi-layer EAGLE" in msg and "--zipage-disable" in msg
    msg = _refusal("--speculative-algorithm", "NEXTN", *draft, "calibrated", "--zipage-mode",
                   "fixed", "--zipage-async")
    assert "--speculative-algorithm EAGLE with --zipage-async" in msg  # (SGLang's name for MTP)


def test_async_needs_a_buffer_longer_than_its_head_start(clean_env):
    msg = _refusal("--zipage-mode", "fixed", "--zipage-async", "--page-size", "16",
                   "--zipage-kv-budget", "64", "--zipage-buffer", "16")
    assert "--zipage-buffer" in msg and "--zipage-async" in msg


def test_every_refusal_is_named_in_one_message():
    """Several problems at once (buffer not page aligned, hierarchical cache on the CPU and
    beside overlapped compaction, torch compile): the launcher names each of them, not only
    the first."""
    r = _launch("--page-size", "16", "--zipage-buffer", "40", "--enable-hierarchical-cache",
                "--enable-torch-compile", "--zipage-mode", "fixed", "--zipage-async")
    assert r.returncode != 0
    for part in ("--zipage-buffer", "--page-size 16", "--enable-hierarchical-cache on the CPU",
                 "HiCache runs on a GPU", "--zipage-async with --enable-hierarchical-cache",
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


def test_a_pd_decode_server_names_what_it_cannot_compress_yet(clean_env):
    """PD disaggregation: the decode server compresses (tests/e2e/test_pd_pair.py), the
    prefill server starts as SGLang's own scheduler; the decode server's KV offload to
    storage is refused by name with the reason, and the way out; HiCache is not refused there
    (only on the CPU)."""
    assert _refusal("--disaggregation-mode", "prefill") is None
    # nothing of zipage runs on a prefill server, so nothing is refused there: neither a
    # feature zipage cannot compress beside nor statistics only its decode server reads
    assert _refusal("--disaggregation-mode", "prefill", "--enable-mixed-chunk", "--model-path",
                    str(REPO / "benchmarks/models/qwen3-8b-dummy"), "--zipage-scorer",
                    "calibrated") is None
    assert _refusal("--disaggregation-mode", "decode",
                    "--disaggregation-transfer-backend", "fake") is None
    msg = _refusal("--disaggregation-mode", "decode", "--hicache-storage-backend", "file",
                   "--disaggregation-decode-enable-offload-kvcache")
    assert "--disaggregation-decode-enable-offload-kvcache is not supported with zipage yet" in msg
    assert "--zipage-disable" in msg
    # HiCache on a decode server runs (pd-check-hicache-h100.json): here only the CPU is named
    msg = _refusal("--disaggregation-mode", "decode", "--disaggregation-decode-enable-radix-cache",
                   "--enable-hierarchical-cache")
    assert "--enable-hierarchical-cache on the CPU" in msg and "decode server" not in msg
