"""CPU defaults of the launcher: only flags the user did not give, grammar backend included."""

import os

from sglang_zipage.config import ZipageConfig
from sglang_zipage.server_args import default_overrides


def test_cpu_path_uses_a_grammar_backend_that_runs_on_cpu():
    out = default_overrides({"model_path": "m"}, ZipageConfig(), has_cuda=False)
    assert out["device"] == "cpu" and out["grammar_backend"] == "outlines"


def test_given_grammar_backend_and_gpu_keep_sglang_choice():
    given = {"model_path": "m", "grammar_backend": "xgrammar"}
    assert "grammar_backend" not in default_overrides(given, ZipageConfig(), has_cuda=False)
    assert "grammar_backend" not in default_overrides({"model_path": "m"}, ZipageConfig(),
                                                      has_cuda=True)


def test_gpu_decode_graphs_cover_the_larger_batches_a_budget_allows():
    out = default_overrides({"model_path": "m"}, ZipageConfig(), has_cuda=True)
    assert out["cuda_graph_max_bs_decode"] == 512 and out["attention_backend"] == "flashinfer"
    given = {"model_path": "m", "cuda_graph_max_bs_decode": 64}
    assert "cuda_graph_max_bs_decode" not in default_overrides(given, ZipageConfig(), has_cuda=True)
    off = ZipageConfig(enabled=False)
    assert "cuda_graph_max_bs_decode" not in default_overrides({"model_path": "m"}, off, has_cuda=True)
    # speculative decoding: SGLang's own graph sizes (a verify graph at batch 512 outgrew
    # flashinfer's workspace on an H100, speculative-steady-cap512-attempt-h100.json)
    spec = {"model_path": "m", "speculative_algorithm": "EAGLE3"}
    assert "cuda_graph_max_bs_decode" not in default_overrides(spec, ZipageConfig(), has_cuda=True)


def test_gpu_decode_graphs_grow_with_the_budget_range():
    """Squeezed requests hold their floor, so about budget/floor times as many run: the
    default graphs cover them (past the largest graph decode runs eagerly: 72 ms a step at 657
    requests on the H200, ~46 by the step line with graphs), on SGLang's graph sizes (steps
    of 32 past 512), capped."""
    def graphs(**kw):
        return default_overrides({"model_path": "m"}, ZipageConfig(**kw),
                                 has_cuda=True)["cuda_graph_max_bs_decode"]

    assert graphs(kv_budget=2048) == graphs(kv_budget=2048, min_kv_budget=2048) == 512
    assert graphs(kv_budget=2048, min_kv_budget=1024) == 1024
    assert graphs(kv_budget=2048, min_kv_budget=1536) == 704  # 682.7 -> 704
    assert graphs(kv_budget=2048, min_kv_budget=256) == 1024  # the cap
    given = {"model_path": "m", "cuda_graph_max_bs_decode": 512}
    squeezed = ZipageConfig(kv_budget=2048, min_kv_budget=1024)
    assert "cuda_graph_max_bs_decode" not in default_overrides(given, squeezed, has_cuda=True)
    off = ZipageConfig(enabled=False, kv_budget=2048, min_kv_budget=1024)
    assert "cuda_graph_max_bs_decode" not in default_overrides({"model_path": "m"}, off, has_cuda=True)


def test_paged_kv_on_cpu_runs_sglang_triton_allocator_in_the_interpreter(monkeypatch):
    from sglang_zipage.server_args import set_process_env

    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    set_process_env("cpu", 1)
    assert "TRITON_INTERPRET" not in os.environ
    set_process_env("cpu", 16)
    assert os.environ["TRITON_INTERPRET"] == "1"


def test_the_engines_startup_checks_run_without_starting_it():
    """engine.checked: what Engine(...) would refuse, or its server arguments, with nothing
    started (benchmarks/coverage.py asks it before spending an engine start on a row)."""
    import pytest

    from sglang_zipage.engine import checked
    from sglang_zipage.harness.engines import MODELS

    common = dict(load_format="dummy", skip_tokenizer_init=True)
    with pytest.raises(ValueError, match="--attention-backend fa3.*--zipage-disable"):
        checked(model_path=os.path.join(MODELS, "deepseek-v3"), attention_backend="fa3",
                page_size=64, **common)
    with pytest.raises(ValueError, match="zipage"):  # the config's own checks come first
        checked(model_path=os.path.join(MODELS, "qwen3-8b-dummy"), zipage_kv_budget=-1, **common)
    server_args, config = checked(model_path=os.path.join(MODELS, "qwen3-8b-dummy"),
                                  zipage_kv_budget=512, **common)
    assert config.kv_budget == 512 and server_args.device == "cpu"
