"""The memory plan over plain ints (issue 28, issue 44 item 6): zipage's buffers take a share
of the memory SGLang could give the KV pool, never more.

- M1 zipage's bytes never exceed the share of the memory SGLang could give the pool, capped
  pool or not; M3 the pool plus zipage fit in that memory, and a pool the user capped keeps
  its tokens where the memory beside it holds zipage's bytes (the issue's capped SmolLM2
  command, refused under the old base of the capped pool, now plans); M2 window slots never
  exceed what can be in flight, so a capped pool takes none it cannot use.
- M4 a share that cannot hold the global scores and one slot is refused with the share that
  would, and that share then plans.
- M5 a plan refused with all of the device's memory is refused with any less (checked over a
  grid of memories, caps and shares): the launcher's refusal before anything starts is never
  wrong.
- The launcher's checks from the config alone: global scores beyond the share of an uncapped
  pool (head_dim 64 and FP8 keys) and a plan no memory of this device could fit are refused
  before any weight loads, naming the model and the flags.
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
    assert p.zipage_bytes <= share * p.available_bytes  # M1
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
    assert capped.pool_tokens == 8192 and capped.taken_from_pool_bytes == 0
    assert capped.window_slots == capped.slots_wanted  # M2, not the half of 1 TB
    tight = plan(tokens=8192, available=8192 * QWEN3_8B_CELL, share=0.5)
    assert tight.pool_tokens < 8192


def test_a_capped_pool_gives_only_what_the_memory_beside_it_cannot_hold():
    full = plan(tokens=8192, available=8192 * QWEN3_8B_CELL, share=0.05)  # nothing beside it
    beside = full.zipage_bytes // 2
    half = plan(tokens=8192, available=8192 * QWEN3_8B_CELL + beside, share=0.05)
    assert half.window_slots == full.window_slots
    assert 0 < half.taken_from_pool_bytes < full.taken_from_pool_bytes
    assert half.kv_pool_bytes + half.zipage_bytes <= half.available_bytes  # M3
    assert half.taken_from_pool_bytes + beside >= half.zipage_bytes  # no more than it must


# The command on the bundled SmolLM2-135M (30 layers, 3 KV heads of 64, 9 query heads):
# --max-total-tokens 2048 --max-running-requests 16 --zipage-kv-budget 64 --zipage-buffer 16
SMOLLM2 = memory.BufferShapes(scored_layers=30, kv_heads=3, query_heads=9, query_width=64,
                              query_bytes=2)
SMOLLM2_CELL = 30 * 3 * (64 + 64) * 2


def smollm2_capped(available):
    return plan(SMOLLM2, cell=SMOLLM2_CELL, tokens=2048, available=available, running=16,
                limit=64 + 16, window=16, share=0.03)


def test_the_capped_command_takes_its_share_of_the_memory_beside_the_pool():
    with pytest.raises(memory.NoRoom) as e:  # the old base: 3% of the capped pool's 45 MiB
        smollm2_capped(2048 * SMOLLM2_CELL)
    assert "1.3 MiB) of the 45.0 MiB SGLang could give the KV pool" in str(e.value)
    p = smollm2_capped(12 << 30)  # what SGLang's CPU path profiled beside 17 GB free
    assert p.pool_tokens == p.stock_pool_tokens == 2048 and p.taken_from_pool_bytes == 0
    assert p.window_slots == p.slots_wanted == 16  # --max-running-requests: no useless slots
    assert p.zipage_bytes <= 0.03 * p.available_bytes  # M1
    report = p.describe()
    assert report["available_bytes"] == 12 << 30
    assert report["share_taken_from"] == memory.SHARE_BASE
    assert memory.SHARE_BASE in p.log_line() and "keeps its 2048 tokens" in p.log_line()


@pytest.mark.parametrize("share, window, cap", itertools.product(
    [1e-6, 1e-4, 0.005, 0.0156, 0.03], [16, 512, 4096], [None, 2048, 200_000, 10**9]))
def test_a_plan_refused_with_all_of_the_devices_memory_is_refused_with_less(share, window, cap):
    """M5: what plan_before_start refuses, no memory up to the device's lets SGLang's pool
    (sized from that memory, capped at --max-total-tokens) fit."""
    device = 24 << 30
    start = dict(limit=4096 + 256, window=window, page=16, share=share)
    try:
        memory.plan_before_start(SMOLLM2, cell_bytes=SMOLLM2_CELL, device_bytes=device,
                                 max_total_tokens=cap, **start)
        return
    except memory.NoRoom:
        pass
    for available in [device >> k for k in range(0, 24)] + [device - 4096, 3 * device // 4]:
        tokens = available // SMOLLM2_CELL // 16 * 16
        tokens = min(tokens, cap // 16 * 16) if cap else tokens
        if tokens == 0:
            continue  # SGLang itself refuses a pool with no tokens
        with pytest.raises(memory.NoRoom):
            memory.plan(SMOLLM2, stock_pool_tokens=tokens, cell_bytes=SMOLLM2_CELL,
                        available_bytes=available, max_running=min(4096, tokens // 2), **start)


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
    base = dict(kv_cache_dtype="auto", attention_backend="triton", decode_attention_backend=None,
                max_total_tokens=None, device="cpu", tp_size=1, page_size=1)
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
    # a capped pool: the memory beside it may hold the scores (the plan below decides)
    assert model_support.refusals(llama, ZipageConfig(memory_fraction=0.01),
                                  args(kv_cache_dtype="fp8_e4m3", max_total_tokens=4096)) == []
    mla = model_support.model_facts(str(MODELS / "deepseek-v2-lite"))  # one fp32 score per 576-wide row
    assert mla["kv_row_elements"] == 576
    assert model_support.refusals(mla, ZipageConfig(memory_fraction=0.01),
                                  args(kv_cache_dtype="fp8_e4m3")) == []


def test_launcher_refuses_a_plan_no_memory_of_this_device_could_fit():
    """server_args.memory_refusals: the bundled SmolLM2's shapes read from its config, the
    plan with all of this machine's memory (M5)."""
    from sglang_zipage import server_args
    from sglang_zipage.model import bundled_model_path

    smol = model_support.model_facts(bundled_model_path())
    assert (smol["layers"], smol["kv_heads"], smol["query_heads"], smol["head_dim"]) == (30, 3, 9, 64)
    device = server_args.device_memory_bytes("cpu")
    assert device > 1 << 30
    capped = args(max_total_tokens=8192)  # the launcher's CPU default
    assert server_args.memory_refusals(smol, ZipageConfig(), capped) == []
    assert server_args.memory_refusals(smol, ZipageConfig(memory_fraction=0.01), capped) == []
    (bad,) = server_args.memory_refusals(smol, ZipageConfig(memory_fraction=1e-7), capped)
    assert "LlamaForCausalLM" in bad and "this device has" in bad and "(8192 pool tokens)" in bad
    assert f"{device / memory.MIB:.1f} MiB" in bad
    # a cap past the device's memory does not cap: the scores take 1.56% of all of it
    (bad,) = server_args.memory_refusals(smol, ZipageConfig(memory_fraction=0.01),
                                         args(max_total_tokens=10**12))
    assert "raise --zipage-memory-fraction to 0.016" in bad
    assert server_args.memory_refusals(smol, ZipageConfig(memory_fraction=0.01, decay=0.0),
                                       args(max_total_tokens=10**12)) == []
    # what the scheduler plans from the built model: MLA and sliding windows
    mla = model_support.model_facts(str(MODELS / "deepseek-v2-lite"))
    assert server_args.memory_refusals(mla, ZipageConfig(memory_fraction=1e-7), capped) == []
