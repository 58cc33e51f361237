"""The calibrated scorer's plumbing over plain values (issue 46): no query window in the
memory plan (its statistics counted instead), budgets that never ask for a slot, the
statistics file a server finds or is refused without (naming the command that makes it),
the shipped statistics of the bundled model, and the engine's queries equal to the HF
reference's (SGLang's RoPE table against transformers').
Run: .venv/bin/python -m pytest tests/unit/test_calibrated_setup.py
"""

from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from sglang_zipage import calibrate, memory, model_support
from sglang_zipage.budget import Budget
from sglang_zipage.config import ZipageConfig
from sglang_zipage.kernels.reference import rope_queries
from sglang_zipage.query_stats import DeviceQueries, QueryStats
from sglang_zipage.request_state import ReqState

MODELS = Path(__file__).resolve().parents[2] / "benchmarks" / "models"
CALIBRATED = ZipageConfig(kv_budget=256, buffer=64, scorer="calibrated")


def test_the_plan_holds_no_window_and_counts_the_statistics():
    shapes = memory.BufferShapes(4, 8, 32, 128, 2, stats_queries=16)
    assert shapes.slot_bytes(16) == 0 and shapes.table_bytes(4096) == 0
    assert shapes.stats_bytes == 4 * 16 * 32 * 128 * 2  # in the model dtype
    # a launch rotates the rows for each of its requests: one copy each, like a window slot's
    assert shapes.launch_query_bytes(16) == shapes.stats_bytes
    p = memory.plan(shapes, stock_pool_tokens=100_000, cell_bytes=16384,
                    available_bytes=100_000 * 16384, max_running=4096, limit=2304, window=16,
                    page=1, share=0.03)
    assert p.window_slots == p.window_bytes == p.table_bytes == 0
    assert p.zipage_bytes == p.score_bytes + shapes.stats_bytes
    assert "no query window" in p.log_line()
    with pytest.raises(memory.NoRoom, match="query statistics") as e:
        memory.plan(shapes, stock_pool_tokens=1000, cell_bytes=16384,
                    available_bytes=1000 * 16384, max_running=8, limit=2304, window=16, page=1,
                    share=0.01)
    assert "--zipage-window" not in str(e.value)  # no window to lower


def test_budgets_of_the_calibrated_scorer_never_ask_for_a_window():
    window, calibrated = Budget(64, 16, 16), Budget(64, 16, 16, window_scored=False)
    st = ReqState(c0=0)
    assert window.wants_window(st, 80 - 16) and not calibrated.wants_window(st, 80 - 16)
    assert window.keeps_window and not calibrated.keeps_window
    assert calibrated.needs_compaction(st, 80, 0)  # scored at its limit, no window to wait for
    assert Budget.from_config(CALIBRATED).window_scored is False


def stats(layers, heads, dim, k=2):
    return QueryStats(torch.randn(layers, heads, dim), torch.rand(layers, heads, dim // 2),
                      torch.randn(layers, heads, k, dim), True, 100)


def test_a_server_finds_its_statistics_or_is_refused_with_the_command(tmp_path):
    model = MODELS / "qwen3-8b-dummy"
    f = model_support.model_facts(str(model))
    server = SimpleNamespace(kv_cache_dtype="auto", attention_backend="triton",
                             decode_attention_backend=None, max_total_tokens=None,
                             model_path=str(model))
    (msg,) = model_support.refusals(f, CALIBRATED, server)
    assert f"python -m sglang_zipage.calibrate --model-path {model} --out " in msg
    assert str(model / "zipage_query_stats.safetensors") in msg
    right = tmp_path / "right.safetensors"
    stats(f["layers"], f["query_heads"], f["head_dim"]).save(str(right))
    config = ZipageConfig(kv_budget=256, buffer=64, scorer="calibrated", query_stats=str(right))
    assert model_support.refusals(f, config, server) == []
    wrong = tmp_path / "wrong.safetensors"
    stats(f["layers"], 8, f["head_dim"]).save(str(wrong))
    (msg,) = model_support.refusals(f, ZipageConfig(kv_budget=256, buffer=64, scorer="calibrated",
                                                    query_stats=str(wrong)), server)
    assert "calibrate it" in msg and "(36, 8, 128)" in msg and "(36, 32, 128)" in msg
    # MLA: a query row is q_nope | q_rope (128 + 64 for DeepSeek V3), before absorption
    mla = model_support.model_facts(str(MODELS / "deepseek-v3"))
    assert mla["mla"] and (mla["query_heads"], mla["query_width"]) == (128, 192)
    mla_stats = tmp_path / "mla.safetensors"
    stats(4, 128, 192).save(str(mla_stats))  # a 4-layer run of the same shape: layers 0-3
    flash = SimpleNamespace(**{**vars(server), "attention_backend": "flashinfer"})
    config = ZipageConfig(kv_budget=256, buffer=64, scorer="calibrated", query_stats=str(mla_stats))
    assert model_support.refusals(mla, config, flash) == []
    stats(4, 128, 576).save(str(mla_stats))  # absorbed rows: not what the scorer stores
    (msg,) = model_support.refusals(mla, config, flash)
    assert "(4, 128, 576)" in msg and "(61, 128, 192)" in msg


def test_the_bundled_model_ships_its_statistics():
    from sglang_zipage.model import MODEL_DIR_NAME

    assert calibrate.stats_file("", f"/somewhere/{MODEL_DIR_NAME}") == calibrate.BUNDLED_STATS
    assert calibrate.stats_file("", "/m") == Path("/m/zipage_query_stats.safetensors")
    assert calibrate.stats_file("/s.safetensors", "/m") == Path("/s.safetensors")
    shipped = QueryStats.load(str(calibrate.BUNDLED_STATS))
    assert shipped.centroids.shape == (30, 9, calibrate.QUERIES, 64) and shipped.neox
    assert shipped.meta["domains"] == list(calibrate.DOMAINS)


def test_the_engines_queries_are_the_hf_references():
    """DeviceQueries rotates with a RoPE table as SGLang keeps it ([positions, R]: cos | sin
    of inv_freq = base^(-2i/R), the model's rope_theta); the HF reference with transformers'
    rotary embedding: the same queries, so the fidelity check compares like with like."""
    from sglang_zipage.harness.fidelity.hf_reference import HFReference
    from sglang_zipage.harness.fidelity.selection import Eviction
    from sglang_zipage.model import bundled_model_path

    ref = HFReference(bundled_model_path())
    ref.query_stats = QueryStats.load(str(calibrate.BUNDLED_STATS))
    base = ref.model.config.rope_theta if hasattr(ref.model.config, "rope_theta") else \
        ref.model.config.rope_parameters["rope_theta"]
    inv = 1.0 / base ** (torch.arange(0, 64, 2, dtype=torch.float) / 64)
    ang = torch.arange(8192, dtype=torch.float)[:, None] * inv[None]
    table = torch.cat([ang.cos(), ang.sin()], -1)
    assert torch.allclose(ref.cos_sin(8192), table, atol=1e-4)
    engine = DeviceQueries(ref.query_stats, range(30), slice(0, 9), table, True, torch.float32)
    ev = Eviction(budget=64, buffer=16, scorer="calibrated")
    for pos in (0, 77, 5000):
        theirs = ref._expected(ev, pos)  # [L, K, Hq, D]
        q = engine.at(torch.tensor([pos, 3]))
        assert q.rows.stride(1) == 0  # one set of rows for every request, rotated in the kernel
        ours = rope_queries(q.rows, q.rope)[:, 0]
        assert torch.allclose(ours, theirs, atol=1e-3), pos


def test_auto_runs_the_calibrated_scorer_where_the_model_has_statistics(tmp_path):
    """--zipage-scorer auto (the default) as the entry points resolve it: calibrated for the
    bundled model (it ships its statistics) and for a model folder holding them, the window
    scorer (said at startup) for one without; an explicit scorer stays as given."""
    from sglang_zipage.model import bundled_model_path

    auto = ZipageConfig()
    assert auto.scorer == "auto"
    assert model_support.with_scorer(auto, bundled_model_path()).scorer == "calibrated"
    bare = tmp_path / "bare"
    bare.mkdir()
    assert model_support.with_scorer(auto, str(bare)).scorer == "window"
    stats(2, 4, 8).save(str(bare / calibrate.FILE_NAME))
    assert model_support.with_scorer(auto, str(bare)).scorer == "calibrated"
    explicit = ZipageConfig(scorer="window")
    assert model_support.with_scorer(explicit, bundled_model_path()) is explicit


def test_the_capture_engine_holds_a_pool_for_its_texts_unless_told_otherwise():
    """calibrate's engine prefills the calibration texts once: a pool of twice their tokens,
    not one sized from the device's memory; a pool the user sized stays theirs."""
    kw = calibrate.capture_engine_kwargs({"model_path": "m", "tp_size": 2}, 6000)
    assert kw["max_total_tokens"] == 12000 and kw["tp_size"] == 2
    assert kw["zipage_scorer"] == "window" and kw["disable_cuda_graph"]
    assert calibrate.capture_engine_kwargs({}, 100)["max_total_tokens"] == \
        calibrate.CAPTURE_POOL_TOKENS
    for given in ({"max_total_tokens": 50_000}, {"mem_fraction_static": 0.7}):
        kw = calibrate.capture_engine_kwargs(given, 6000)
        assert kw.get("max_total_tokens") == given.get("max_total_tokens")
