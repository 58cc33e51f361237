"""The memory plan over plain ints (issue 28): zipage's buffers come out of the KV pool's
share, never on top of it.

- M1 zipage's bytes never exceed the share of the pool SGLang sized; M3 the pool plus zipage
  fit in the memory SGLang sized the pool from, and a pool the user capped keeps its tokens
  where that memory has room beside it; M2 window slots never exceed what can be in flight.
- M4 a share that cannot hold the global scores and one slot is refused with the share that
  would, and that share then plans.
- The launcher's check from the config alone: global scores beyond the share (head_dim 64 and
  FP8 keys) are refused before any weight loads, naming the model and the flags.
- DeepSeek-V3's shape (the startup that died asking for hundreds of GiB) now plans within 3%.
Run: .venv/bin/python -m pytest tests/unit/test_memory.py
"""

import itertools
import re
from pathlib import Path
from types import SimpleNamespace

import pytest

from sglang_zipage import memory, model_support
from sglang_zipage.config import ZipageConfig

MODELS = Path(__file__).resolve().parents[2] / "benchmarks" / "models"
QWEN3_8B_4L = memory.BufferShapes(scored_layers=4, kv_heads=8, query_heads=32, query_width=128,
                                  query_bytes=2)
QWEN3_8B_CELL = 4 * 8 * (128 + 128) * 2  # K and V of 4 layers, bf16


def plan(shapes=QWEN3_8B_4L, cell=QWEN3_8B_CELL, tokens=100_000, available=None, running=4096,
         share=0.03, page=1, limit=2304, window=16):
    return memory.plan(shapes, stock_pool_tokens=tokens, cell_bytes=cell,
                       available_bytes=tokens * cell if available is None else available,
                       max_running=running, limit=limit, window=window, page=page, share=share)


@pytest.mark.parametrize("tokens,running,share,page,heads",
                         itertools.product([20_000, 100_000, 749_782], [8, 256, 4096],
                                           [0.01, 0.03, 0.2], [1, 16, 64], [8, 32, 128]))
def test_zipage_fits_inside_what_the_pool_would_have_had(tokens, running, share, page, heads):
    shapes = memory.BufferShapes(4, 8, heads, 128, 2)
    tokens = tokens // page * page
    try:
        p = plan(shapes, tokens=tokens, running=running, share=share, page=page)
    except memory.NoRoom:
        assert share * tokens * QWEN3_8B_CELL < shapes.score_bytes(tokens, page) + 2 * shapes.slot_bytes(16)
        return
    assert p.zipage_bytes <= share * p.stock_kv_pool_bytes  # M1
    assert p.kv_pool_bytes + p.zipage_bytes <= tokens * QWEN3_8B_CELL  # M3
    assert p.pool_tokens % page == 0 and p.pool_tokens < tokens
    assert 1 <= p.window_slots <= min(running, tokens // (2304 - 16) + 1)  # M2
    assert p.score_bytes == 4 * (p.pool_tokens + page) * 8 * 4
    assert p.window_bytes == (p.window_slots + 1) * 4 * 16 * heads * 128 * 2
    assert p.table_bytes == 8 * (running + 1)


def test_the_pool_shrinks_by_exactly_what_zipage_keeps():
    p = plan(tokens=100_000, running=4096)
    assert p.window_slots == p.slots_wanted == 100_000 // 2288 + 1  # room for all that can fly
    shrink = p.stock_pool_tokens - p.pool_tokens
    assert (shrink - 1) * QWEN3_8B_CELL < p.zipage_bytes + 4 * 8 * 4 * shrink <= shrink * QWEN3_8B_CELL


def test_the_share_bounds_the_window_before_what_could_be_in_flight():
    p = plan(tokens=100_000, running=4096, share=0.01)
    cap = 0.01 * 100_000 * QWEN3_8B_CELL
    assert p.window_slots < p.slots_wanted
    fixed = QWEN3_8B_4L.score_bytes(100_000, 1) + p.table_bytes  # on the pool before it shrank
    assert fixed + QWEN3_8B_4L.window_bytes(p.window_slots, 16) <= cap  # as many as fit
    assert fixed + QWEN3_8B_4L.window_bytes(p.window_slots + 1, 16) > cap
    assert plan(tokens=100_000, running=5).window_slots == 5  # SGLang's own request cap


def test_a_capped_pool_keeps_its_tokens_where_memory_has_room():
    capped = plan(tokens=8192, available=10**12, share=0.5)
    assert capped.pool_tokens == 8192
    tight = plan(tokens=8192, available=8192 * QWEN3_8B_CELL, share=0.5)
    assert tight.pool_tokens < 8192


def test_no_room_names_the_share_that_would_fit_and_it_does():
    with pytest.raises(memory.NoRoom) as e:
        plan(tokens=640, share=0.03)
    msg = str(e.value)
    for part in ("--zipage-memory-fraction", "--zipage-window", "--zipage-decay 0",
                 "--zipage-disable", "query-window slot"):
        assert part in msg
    wanted = float(re.search(r"raise --zipage-memory-fraction to ([0-9.]+)", msg).group(1))
    assert plan(tokens=640, share=wanted).window_slots >= 1


def test_deepseek_v3_shape_plans_within_its_share():
    """The failing startup of the issue: DeepSeek-V3 dimensions (128 query heads, MLA latent
    576 wide), 4 layers, a pool of 1.9M tokens. The ring had asked for 277 GiB; now every
    byte comes out of 3% of the pool, the window stored compactly (nope 128 + rope 64)."""
    shapes = memory.BufferShapes(scored_layers=4, kv_heads=1, query_heads=128, query_width=192,
                                 query_bytes=2)
    cell = 4 * 576 * 2
    p = plan(shapes, cell=cell, tokens=1_900_000, running=4096, limit=320)
    assert p.zipage_bytes <= 0.03 * 1_900_000 * cell
    assert p.window_slots >= 64
    assert shapes.slot_bytes(16) * 3 == memory.BufferShapes(4, 1, 128, 576, 2).slot_bytes(16)


def args(**kw):
    base = dict(kv_cache_dtype="auto", attention_backend="triton", decode_attention_backend=None)
    return SimpleNamespace(**{**base, **kw})


def test_launcher_refuses_scores_beyond_the_share_before_any_weight_loads():
    llama = model_support.model_facts(str(MODELS / "llama-3.1-8b"))  # head_dim 128
    assert model_support.refusals(llama, ZipageConfig(), args(kv_cache_dtype="fp8_e4m3")) == []
    bad = model_support.refusals(llama, ZipageConfig(memory_fraction=0.01),
                                 args(kv_cache_dtype="fp8_e4m3"))
    assert len(bad) == 1 and "LlamaForCausalLM" in bad[0] and "1.56%" in bad[0]
    assert "--zipage-memory-fraction" in bad[0] and "--zipage-decay 0" in bad[0]
    assert model_support.refusals(llama, ZipageConfig(memory_fraction=0.01, decay=0.0),
                                  args(kv_cache_dtype="fp8_e4m3")) == []
    mla = model_support.model_facts(str(MODELS / "deepseek-v2-lite"))  # one fp32 score per 576-wide row
    assert mla["kv_row_elements"] == 576
    assert model_support.refusals(mla, ZipageConfig(memory_fraction=0.01),
                                  args(kv_cache_dtype="fp8_e4m3")) == []
