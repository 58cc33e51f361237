"""KV layouts on real SGLang 0.5.17 pools and attention modules (CPU), issue 15.

- detect() picks the layout from the pool SGLang built (MHATokenToKVPool, FP8 or not;
  MLATokenToKVPool; SWAKVPool) and the RadixAttention modules of the model; anything else
  is refused naming the pool.
- MHA with sliding-window layers in the same pool (Gemma 3): after a compaction the
  sliding-window layers' last kept columns hold the newest tokens in order (what their
  window reads), for every head, while full layers keep their best-scored tokens.
- MLA: one latent row per token; the query window gets q_nope | q_rope whichever way the
  backend passes them.
- Hybrid SWA pool (gpt-oss): the window's SWA slots follow their tokens to the columns
  they occupy after the compaction; every other SWA slot of the suffix is freed once, and
  the full slots freed next carry none (the allocators' free counts add up exactly).
The model runner is a plain container of the real parts detect() reads.
Run: .venv/bin/python -m pytest tests/unit/test_kv_layout.py
"""

from types import SimpleNamespace

import pytest
import torch

from sglang.srt.layers.radix_attention import RadixAttention
from sglang.srt.mem_cache.allocator.swa import SWATokenToKVPoolAllocator
from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool, MLATokenToKVPool, ReqToTokenPool
from sglang.srt.mem_cache.common import free_swa_out_of_window_slots
from sglang.srt.mem_cache.swa_memory_pool import SWAKVPool
from sglang_zipage import kv_layout
from sglang_zipage.request_state import ReqState
from sglang_zipage.compaction import CompactionItem, plan_compaction
from sglang_zipage.executor import execute
from sglang_zipage.scoring import Queries, ScoringParams, attention_scores

HQ, HKV, D = 4, 2, 8


def runner(pool, attns, arch="TestForCausalLM"):
    return SimpleNamespace(token_to_kv_pool=pool, model=torch.nn.ModuleList(attns),
                           model_config=SimpleNamespace(hf_config=SimpleNamespace(architectures=[arch])))


def mha_pool(layers, dtype=torch.float32, size=512):
    return MHATokenToKVPool(size=size, page_size=1, dtype=dtype, head_num=HKV, head_dim=D,
                            layer_num=layers, device="cpu", enable_memory_saver=False)


def attn(layer_id, window=-1, heads=HQ, kv=HKV, dim=D, v_dim=-1):
    return RadixAttention(heads, dim, dim ** -0.5, kv, layer_id, sliding_window_size=window,
                          v_head_dim=v_dim)


def test_mha_layout_scores_full_layers_and_keeps_recency_in_sliding_ones():
    pool = mha_pool(4)
    layout = kv_layout.detect(runner(pool, [attn(0, 31), attn(1), attn(2, 31), attn(3)]), 64)
    assert layout.name == "mha+sliding-window" and layout.scored_layers == (1, 3)
    assert layout.ring_rows() == [-1, 0, -1, 1]
    assert layout.kv.keys[0] is pool.k_buffer[1] and layout.kv.recent_keys[1] is pool.k_buffer[2]
    assert layout.least_kv_budget == 31
    with pytest.raises(kv_layout.ZipageUnsupported, match="sliding window"):
        kv_layout.detect(runner(pool, [attn(0, 31), attn(1), attn(2, 31), attn(3)]), 16)
    q = torch.randn(1, 3, HQ, D)  # Gemma 3 passes [1, tokens, Hq, D]
    assert layout.queries(1, q, None).shape == (3, HQ, D)


def test_fp8_pool_hands_scoring_uint8_keys_with_their_format_and_scales():
    pool = mha_pool(2, dtype=torch.float8_e4m3fn)
    attns = [attn(0), attn(1)]
    attns[1].k_scale_float = 0.5
    layout = kv_layout.detect(runner(pool, attns), 64)
    assert layout.kv.key_dtype == torch.float8_e4m3fn
    assert layout.kv.keys[0].dtype == torch.uint8  # the stored bytes: compaction moves them
    assert layout.kv.key_scales.tolist() == [1.0, 0.5]


def test_unknown_pools_and_mixed_query_shapes_are_refused_by_name():
    pool = SimpleNamespace()  # a pool class zipage does not know
    with pytest.raises(kv_layout.ZipageUnsupported, match="SimpleNamespace.*--zipage-disable"):
        kv_layout.detect(runner(pool, [attn(0)], arch="OddForCausalLM"), 64)
    with pytest.raises(kv_layout.ZipageUnsupported, match="one query shape"):
        kv_layout.detect(runner(mha_pool(2), [attn(0), attn(1, heads=2 * HQ)]), 64)


RANK, ROPE, NOPE, MLA_HEADS = 32, 8, 12, 4


class MLAAttention(torch.nn.Module):
    """What DeepSeek's attention module holds that the MLA layout reads: its absorbed decode
    attention (a real RadixAttention), the absorption weight w_kc and the head split."""

    def __init__(self, layer_id, w_kc, w_scale=1.0):
        super().__init__()
        self.attn_mqa = attn(layer_id, heads=MLA_HEADS, kv=1, dim=RANK + ROPE, v_dim=RANK)
        self.attn_mha = attn(layer_id, heads=MLA_HEADS, kv=MLA_HEADS, dim=NOPE + ROPE, v_dim=24)
        self.w_kc, self.w_scale = w_kc, w_scale
        self.qk_nope_head_dim, self.qk_rope_head_dim = NOPE, ROPE
        self.layer_id = layer_id


def mla_pool(layers=2, dtype=torch.float32):
    return MLATokenToKVPool(size=256, page_size=1, dtype=dtype, kv_lora_rank=RANK,
                            qk_rope_head_dim=ROPE, layer_num=layers, device="cpu",
                            enable_memory_saver=False)


def test_mla_layout_scores_the_latent_row_with_absorbed_queries():
    """Without the model's absorption weights the window stores the absorbed query whole."""
    pool = mla_pool()
    mods = [m for l in range(2) for m in (attn(l, heads=MLA_HEADS, kv=MLA_HEADS, dim=NOPE + ROPE, v_dim=24),
                                         attn(l, heads=MLA_HEADS, kv=1, dim=RANK + ROPE, v_dim=RANK))]
    layout = kv_layout.detect(runner(pool, mods), 64)
    assert layout.name == "mla" and layout.kv.values is None and layout.kv.absorb is None
    assert layout.kv.keys[1] is pool.kv_buffer[1]
    assert (layout.query.heads, layout.query.dim, layout.query.width) == (MLA_HEADS, RANK + ROPE, RANK + ROPE)
    q_nope, q_rope = torch.randn(3, MLA_HEADS, RANK), torch.randn(3, MLA_HEADS, ROPE)
    joined = torch.cat([q_nope, q_rope], -1)
    assert torch.equal(layout.queries(0, q_nope.reshape(3, -1), q_rope), joined)
    assert torch.equal(layout.queries(0, joined, None), joined)


@pytest.mark.parametrize("fp8", [False, True])
@pytest.mark.parametrize("rope_apart", [False, True])
def test_compact_mla_window_scores_as_the_absorbed_queries_did(fp8, rope_apart):
    """The window keeps q_nope | q_rope (NOPE + ROPE wide, not RANK + ROPE); scoring absorbs it
    with the layer's w_kc (times an FP8 w_kc's scale) and gets the scores the absorbed queries
    give, whichever way the backend passed the rope part."""
    torch.manual_seed(0)
    pool = mla_pool()
    for buf in pool.kv_buffer:
        buf.normal_()
    weights = [torch.randn(MLA_HEADS, NOPE, RANK) * 0.3 for _ in range(2)]
    scale = 0.5 if fp8 else 1.0
    parents = [MLAAttention(l, w.to(torch.float8_e4m3fn) if fp8 else w, scale)
               for l, w in enumerate(weights)]
    model = torch.nn.ModuleList(parents)
    run = SimpleNamespace(token_to_kv_pool=pool, model=model, model_config=SimpleNamespace(
        hf_config=SimpleNamespace(architectures=["DeepseekV3ForCausalLM"])))
    compact = kv_layout.detect(run, 64)
    assert compact.name == "mla-compact" and compact.query.width == NOPE + ROPE
    whole = kv_layout.detect(runner(pool, [m for p in parents for m in (p.attn_mha, p.attn_mqa)]), 64)
    shapes = kv_layout.buffer_shapes(model, mla=True, dtype_bytes=4, global_scores=True)
    assert (shapes.query_width, shapes.query_heads, shapes.kv_heads) == (NOPE + ROPE, MLA_HEADS, 1)

    W, R, S = 4, 2, 40
    src = torch.randperm(200)[:R * S].view(R, S) + 1
    lens = torch.tensor([S, S - 9])
    stored, absorbed = [], []
    for layer, p in enumerate(parents):
        effective = (p.w_kc.float() * scale) if fp8 else p.w_kc
        q_nope = torch.randn(R * W, MLA_HEADS, NOPE)
        q_rope = torch.randn(R * W, MLA_HEADS, ROPE)
        q_abs = torch.bmm(q_nope.transpose(0, 1), effective).transpose(0, 1)  # what attention gets
        args = ((q_abs.reshape(R * W, -1), q_rope) if rope_apart
                else (torch.cat([q_abs, q_rope], -1).reshape(R * W, -1), None))
        compact.stash(layer, q_nope)
        stored.append(compact.queries(layer, *args).view(R, W, MLA_HEADS, -1))
        absorbed.append(whole.queries(layer, *args).view(R, W, MLA_HEADS, -1))
    stored, absorbed = torch.stack(stored), torch.stack(absorbed)
    assert stored.shape[-1] == NOPE + ROPE and absorbed.shape[-1] == RANK + ROPE
    got = attention_scores(Queries(stored), compact.kv, src, lens, 0.1)
    want = attention_scores(Queries(absorbed), whole.kv, src, lens, 0.1)
    torch.testing.assert_close(got, want, atol=1e-6, rtol=1e-4)
    assert got[:, 1, :, S - 9:].abs().max() == 0  # padding


def test_sliding_window_layers_keep_their_newest_tokens_in_order():
    torch.manual_seed(0)
    pool = mha_pool(2)
    for buf in pool.k_buffer + pool.v_buffer:
        buf.normal_()
    layout = kv_layout.detect(runner(pool, [attn(0, 6), attn(1)]), 8)
    r2t = ReqToTokenPool(size=2, max_context_len=64, device="cpu", enable_memory_saver=False)
    slots = torch.randperm(400)[:30] + 1
    r2t.req_to_token[1, :30] = slots.to(torch.int32)
    c0, k = 10, 8
    before = [b.clone() for b in pool.k_buffer + pool.v_buffer]
    plan, _ = plan_compaction(r2t.req_to_token, [CompactionItem(1, c0, 20, 0, True, 1, k)], k, 1)
    ring = torch.randn(1, 2, 4, HQ, D)
    execute(plan, ScoringParams(window=4, decay=0.0), Queries(ring[:, plan.window_slots]), layout.kv,
            None, D ** -0.5)
    old_k0, old_v0 = before[0], before[2]  # layer 0 (sliding window): k, v
    newest = slots[c0 + 20 - k:c0 + 20]  # the last k suffix tokens, oldest first
    kept_cols = slots[c0:c0 + k]
    assert torch.equal(pool.k_buffer[0][kept_cols], old_k0[newest])
    assert torch.equal(pool.v_buffer[0][kept_cols], old_v0[newest])
    # the full layer picked by score: the last W=4 are kept, the rest differs from recency
    assert torch.equal(pool.k_buffer[1][kept_cols[-4:]], before[1][newest[-4:]])


def hybrid(page=1, size=512, size_swa=256, sw=6):
    pool = SWAKVPool(size=size, size_swa=size_swa, page_size=page, dtype=torch.float32,
                     head_num=HKV, head_dim=D, swa_attention_layer_ids=[0, 2],
                     full_attention_layer_ids=[1, 3], device="cpu",
                     enable_memory_saver=False)
    alloc = SWATokenToKVPoolAllocator(size, size_swa, page, torch.float32, "cpu", pool, False)
    mods = [attn(0, sw), attn(1), attn(2, sw), attn(3)]
    return pool, alloc, mods


def test_hybrid_swa_remap_moves_the_window_and_frees_the_rest_once():
    pool, alloc, mods = hybrid()
    layout = kv_layout.detect(runner(pool, mods, "GptOssForCausalLM"), 8)
    assert layout.name == "hybrid-swa" and layout.scored_layers == (1, 3)
    assert layout.kv.keys[0] is pool.full_kv_pool.k_buffer[0]
    r2t = ReqToTokenPool(size=2, max_context_len=64, device="cpu", enable_memory_saver=False)
    c0, suffix, k = 5, 20, 8
    n = c0 + suffix
    full = alloc.alloc(n)  # full slots, each with an SWA slot behind it
    r2t.req_to_token[1, :n] = full.to(torch.int32)
    mapping = alloc.full_to_swa_index_mapping
    # SGLang already freed the SWA slots of suffix columns that left the window
    evicted = c0 + 9
    alloc.free_swa(full[c0:evicted])
    window_swa = mapping[full[n - 6:n]].clone()  # the newest 6 tokens' SWA slots
    assert (window_swa > 0).all()
    swa_free, full_free = alloc.swa_available_size(), alloc.full_available_size()
    req = SimpleNamespace(kv=SimpleNamespace(swa_evicted_seqlen=evicted))
    item = CompactionItem(1, c0, suffix, 0, True, 1, k)
    plan, surplus = plan_compaction(r2t.req_to_token, [item], k, 1)
    layout.remap_window(r2t.req_to_token, [item], k, alloc, [req])
    # the window's tokens now sit in columns [c0 + k - 6, c0 + k): same SWA slots, in order
    assert torch.equal(mapping[full[c0 + k - 6:c0 + k]], window_swa)
    assert (mapping[full[c0:c0 + k - 6]] == 0).all() and (mapping[surplus] == 0).all()
    live_before = suffix - (evicted - c0)
    assert alloc.swa_available_size() - swa_free == live_before - 6  # freed once each
    alloc.free(surplus)  # full slots; their mapping is 0, so no SWA slot is freed twice
    assert alloc.swa_available_size() - swa_free == live_before - 6
    assert alloc.full_available_size() - full_free == suffix - k
    assert req.kv.swa_evicted_seqlen == c0 + k - 6
    assert torch.equal(plan.dst_slots[0], full[c0:c0 + k].long())

    # Decode goes on: the step's token lands at column c0 + k. At the step after, SGLang frees
    # what left the window from req.seqlen - 1 (logical); zipage makes it physical (I5).
    r2t.req_to_token[1, c0 + k] = alloc.alloc(1).to(torch.int32)[0]
    st = ReqState(c0=c0, pos_offset=suffix - k)
    req.req_pool_idx, req.cache_protected_len = 1, 0
    swa_free = alloc.swa_available_size()
    logical_pre_len = n + 2 - 1  # req.seqlen - 1, two decoded tokens after the compaction
    free_swa_out_of_window_slots(req, st.physical(logical_pre_len), sliding_window_size=6,
                                 page_size=1, req_to_token_pool=r2t,
                                 token_to_kv_pool_allocator=alloc)
    assert alloc.swa_available_size() - swa_free == 1  # the oldest window token, once
    assert req.kv.swa_evicted_seqlen == c0 + k - 5
    assert (mapping[r2t.req_to_token[1, c0 + k - 5:c0 + k + 1].long()] > 0).all()


def test_hybrid_swa_refuses_async_compaction():
    pool, alloc, mods = hybrid()
    with pytest.raises(kv_layout.ZipageUnsupported, match="--zipage-async"):
        kv_layout.detect(runner(pool, mods, "GptOssForCausalLM"), 8, async_compaction=True)
