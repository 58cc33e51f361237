"""The kernels on the KV layouts other than bf16 MHA (issue 15): FP8 keys, MLA's latent row.

- window_attention_scores with FP8 keys (uint8 storage of float8_e4m3fn / float8_e5m2,
  per-layer k_scale): Triton against the twin, and the twin against attention computed by
  hand on the dequantized keys; a wrong scale or a byte-misread format fails it.
- MLA's shape: one KV head shared by 16 query heads (the pass-1 head chunks) and a row
  wider than one head-dim block (576 = 512 + 64: the head-dim loop), fp32 and FP8.
- compact_kv with v_buffers None (the latent row is key and value): Triton against the
  twin bit for bit, every slot outside the destination untouched.
fp32 queries on CPU (TRITON_INTERPRET=1: bf16 tl.dot is wrong in the interpreter).
Run: .venv/bin/python -m pytest tests/kernels/test_kv_layouts.py
"""

import pytest
import torch

from kv_cases import bits, device, make_pool, random_keep
from sglang_zipage.kernels import compact_kv_ref, window_attention_scores_ref
from sglang_zipage.kernels import compaction as compaction_mod
from sglang_zipage.kernels import scores as scores_mod

FP8 = [torch.float8_e4m3fn, torch.float8_e5m2]


def fp8_keys(pool, fp8, seed=5):
    """The pool's keys quantized to fp8 and stored as uint8, as SGLang stores them."""
    return [k.to(fp8).view(torch.uint8) for k in pool.k]


def queries(n_layers, n_req, w, hq, d, seed=1):
    gen = torch.Generator().manual_seed(seed)
    return (torch.randn(n_layers, n_req, w, hq, d, generator=gen) * 0.5).to(device())


def by_hand(q, keys_f32, src, lens, scale):
    """Softmax of q.k over each request's keys, max over a KV group's heads, mean over W."""
    n_layers, n_req, w, hq, d = q.shape
    out = torch.zeros(n_layers, n_req, keys_f32[0].shape[1], src.shape[1], device=q.device)
    for l in range(n_layers):
        for r in range(n_req):
            n = int(lens[r])
            k = keys_f32[l][src[r, :n]]  # [n, Hkv, D]
            hkv = k.shape[1]
            g = hq // hkv
            for h in range(hkv):
                x = torch.einsum("wgd,sd->wgs", q[l, r, :, h * g:(h + 1) * g].float(), k[:, h]) * scale
                out[l, r, h, :n] = x.softmax(-1).amax(1).mean(0)
    return out


@pytest.mark.parametrize("fp8", FP8)
def test_fp8_keys_score_as_their_dequantized_values(fp8):
    lens = [37, 130]
    pool = make_pool(lens, hkv=2, d=64, page_size=16)
    keys = fp8_keys(pool, fp8)
    scales = torch.tensor([0.5, 2.0], device=device())
    q = queries(2, 2, 16, 8, 64)
    args = (q, keys, pool.src_slots, pool.src_lens, 0.125, fp8, scales)
    got = scores_mod.window_attention_scores(*args)
    want = window_attention_scores_ref(*args)
    torch.testing.assert_close(got, want, atol=1e-6, rtol=1e-4)
    deq = [k.view(fp8).float() * s for k, s in zip(keys, scales.tolist())]
    torch.testing.assert_close(want, by_hand(q, deq, pool.src_slots, pool.src_lens, 0.125),
                               atol=1e-6, rtol=1e-4)
    # the scale matters: the same bytes scored at scale 1 rank differently
    unscaled = window_attention_scores_ref(q, keys, pool.src_slots, pool.src_lens, 0.125, fp8, None)
    assert not torch.allclose(unscaled, want, atol=1e-3)


@pytest.mark.parametrize("fp8", [None, torch.float8_e4m3fn])
def test_latent_rows_with_one_kv_head_for_sixteen_query_heads(fp8):
    """MLA: Hkv = 1, G = 16, D = 576 (kv_lora_rank 512 + rope 64)."""
    lens = [20, 150]
    pool = make_pool(lens, n_layers=2, hkv=1, d=576, page_size=1)
    keys = fp8_keys(pool, fp8) if fp8 else pool.k
    scales = torch.tensor([1.0, 0.25], device=device()) if fp8 else None
    q = queries(2, 2, 16, 16, 576) * 0.2
    args = (q, keys, pool.src_slots, pool.src_lens, 576 ** -0.5, fp8, scales)
    got = scores_mod.window_attention_scores(*args)
    want = window_attention_scores_ref(*args)
    assert got.shape == (2, 2, 1, 150)
    torch.testing.assert_close(got, want, atol=1e-6, rtol=1e-4)
    deq = keys if fp8 is None else [k.view(fp8).float() * s for k, s in zip(keys, scales.tolist())]
    torch.testing.assert_close(want, by_hand(q, deq, pool.src_slots, pool.src_lens, 576 ** -0.5),
                               atol=1e-6, rtol=1e-4)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="bf16 tl.dot is only right on a GPU")
@pytest.mark.parametrize("fp8", [None, torch.float8_e4m3fn])
def test_latent_rows_in_bf16_on_the_gpu(fp8):
    """DeepSeek-V2-Lite's decode shape in the model dtype: 16 query heads on one 576-wide
    latent KV head, 2304 tokens (it must also compile within the GPU's shared memory)."""
    pool = make_pool([300, 2304], n_layers=2, hkv=1, d=576, dtype=torch.bfloat16, page_size=16)
    keys = fp8_keys(pool, fp8) if fp8 else pool.k
    scales = torch.tensor([1.0, 0.5], device=device()) if fp8 else None
    q = (queries(2, 2, 16, 16, 576) * 0.2).to(torch.bfloat16)
    args = (q, keys, pool.src_slots, pool.src_lens, 576 ** -0.5, fp8, scales)
    torch.testing.assert_close(scores_mod.window_attention_scores(*args),
                               window_attention_scores_ref(*args), atol=1e-3, rtol=3e-2)


def test_fp8_keys_need_uint8_storage_and_a_known_format():
    pool = make_pool([8], hkv=2, d=64)
    q = queries(2, 1, 16, 4, 64)
    with pytest.raises(ValueError, match="dtype"):  # fp32 keys announced as fp8
        scores_mod.window_attention_scores(q, pool.k, pool.src_slots, pool.src_lens, 0.1,
                                           torch.float8_e4m3fn, None)
    with pytest.raises(ValueError, match="key_dtype"):
        scores_mod.window_attention_scores(q, fp8_keys(pool, torch.float8_e4m3fn), pool.src_slots,
                                           pool.src_lens, 0.1, torch.int8, None)


@pytest.mark.parametrize("in_place", [True, False])
def test_compaction_of_latent_rows_moves_one_buffer(in_place):
    """v_buffers None: only the latent rows move, bit for bit as the twin moves them."""
    lens = [40, 90, 17]
    pool = make_pool(lens, n_layers=2, hkv=1, d=576, dtype=torch.float16, extra_pages=64)
    latent = [k.view(torch.uint8) for k in pool.k]  # FP8-like byte rows
    k_keep = 16
    keep = random_keep(2, lens, 1, k_keep, seed=7)
    if in_place:
        dst = pool.src_slots[:, :k_keep].contiguous()
    else:
        free = (pool.free_pages[:, None] * pool.page_size
                + torch.arange(pool.page_size, device=device())).flatten()
        dst = free[:len(lens) * k_keep].view(len(lens), k_keep).clone()
    old = [b.clone() for b in latent]
    twin = [b.clone() for b in latent]
    compaction_mod.compact_kv(latent, None, None, pool.src_slots, keep, dst, None)
    compact_kv_ref(twin, None, None, pool.src_slots, keep, dst, None)
    for got, want, before in zip(latent, twin, old):
        assert torch.equal(bits(got), bits(want))
        written = torch.zeros(got.shape[0], dtype=torch.bool, device=got.device)
        written[dst.flatten()] = True
        assert torch.equal(got[~written], before[~written])  # nothing else moved
    for l in range(2):
        for r in range(len(lens)):
            assert torch.equal(latent[l][dst[r], 0], old[l][pool.src_slots[r, keep[l, r, 0]], 0])
