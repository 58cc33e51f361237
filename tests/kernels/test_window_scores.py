"""window_attention_scores (Triton) against its torch twin.

Covers GQA ratios 1/3/4/8, head_dim 64/128, page_size 1/16 on permuted pages,
several request lengths in one batch (1 token, both sides of BLOCK_S), W below
and at 16, split counts, strided query views, garbage in foreign slots, and the
backend switch. fp32/fp16 on CPU (TRITON_INTERPRET=1); bf16 only on CUDA,
because bf16 tl.dot is wrong in the interpreter.

Tolerances (scores are probabilities in [0, 1]): fp32 atol 1e-6 rtol 1e-4;
fp16 atol 1e-5 rtol 1e-3; bf16 atol 1e-3 rtol 3e-2.
Run: PYTHONPATH=. .venv/bin/python -m pytest tests/kernels -q
"""

import pytest
import torch

from kv_cases import device, make_pool
from sglang_zipage.kernels import (
    ENV_BACKEND,
    Rope,
    window_attention_scores,
    window_attention_scores_ref,
)
from sglang_zipage.kernels import scores as scores_mod

CUDA = torch.cuda.is_available()
TOL = {
    torch.float32: dict(atol=1e-6, rtol=1e-4),
    torch.float16: dict(atol=1e-5, rtol=1e-3),
    torch.bfloat16: dict(atol=1e-3, rtol=3e-2),
}


def make_queries(pool, n_layers, w, g, dtype, seed=1):
    gen = torch.Generator().manual_seed(seed)
    n_req = pool.src_slots.shape[0]
    hkv, d = pool.k[0].shape[1:]
    q = torch.randn(n_layers, n_req, w, hkv * g, d, generator=gen) * 2.0  # sharper softmax
    return q.to(dtype).to(device())


CASES = [
    # (G, D, dtype, page_size, W, lens)
    (1, 64, torch.float32, 1, 16, [1, 37, 130, 200]),
    (3, 64, torch.float16, 16, 16, [20, 129]),
    (4, 128, torch.float32, 16, 16, [128, 5, 250]),
    (8, 128, torch.float16, 1, 16, [60, 200]),
    (4, 64, torch.float32, 1, 5, [17, 90]),
    (8, 64, torch.float32, 16, 16, [33, 256]),
    # more queries than a tile holds (the calibrated scorer's K per head): pass 2 walks
    # them in chunks of 16, pass 1 splits W = 130 over programs of 64
    (4, 64, torch.float32, 1, 40, [17, 90]),
    (2, 64, torch.float32, 16, 130, [33, 70]),
]


@pytest.mark.parametrize("g,d,dtype,page_size,w,lens", CASES)
def test_scores_match_twin(g, d, dtype, page_size, w, lens):
    pool = make_pool(lens, hkv=2, d=d, dtype=dtype, page_size=page_size)
    q = make_queries(pool, 2, w, g, dtype)
    args = (q, pool.k, pool.src_slots, pool.src_lens, d**-0.5)
    got = scores_mod.window_attention_scores(*args)
    want = window_attention_scores_ref(*args)
    assert got.shape == (2, len(lens), 2, max(lens)) and got.dtype == torch.float32
    torch.testing.assert_close(got, want, **TOL[dtype])


@pytest.mark.skipif(not CUDA, reason="bf16 tl.dot is only right on a GPU")
@pytest.mark.parametrize("g,d", [(1, 64), (4, 128), (8, 128)])
def test_scores_match_twin_bf16(g, d):
    pool = make_pool([300, 1000, 2304], hkv=4, d=d, dtype=torch.bfloat16, page_size=16)
    q = make_queries(pool, 2, 16, g, torch.bfloat16)
    args = (q, pool.k, pool.src_slots, pool.src_lens, d**-0.5)
    torch.testing.assert_close(
        scores_mod.window_attention_scores(*args), window_attention_scores_ref(*args), **TOL[torch.bfloat16]
    )


def rope_table(rot, positions=512, scale=1.0):
    """A model's cos | sin table [positions, rot] (scaled as YaRN's mscale scales it)."""
    inv_freq = 1.0 / 10000 ** (torch.arange(0, rot, 2).float() / rot)
    angles = torch.arange(positions).float()[:, None] * inv_freq[None, :]
    return (torch.cat([angles.cos(), angles.sin()], -1) * scale).to(device())


ROPE_CASES = [
    # (G, Hkv, D, dtype, neox, start, rot): MHA with full and partial rotary dims, both pair
    # styles; MLA's latent row (one KV head, 576 wide, the last 64 dims rotate)
    (4, 2, 64, torch.float32, True, 0, 64),
    (3, 2, 64, torch.float16, False, 0, 64),
    (2, 2, 128, torch.float32, True, 32, 64),
    (4, 1, 576, torch.float32, False, 512, 64),
]


@pytest.mark.parametrize("g,hkv,d,dtype,neox,start,rot", ROPE_CASES)
def test_pre_rope_queries_are_rotated_per_request_as_the_twin_does(g, hkv, d, dtype, neox,
                                                                  start, rot):
    lens = [9, 70, 150]
    pool = make_pool(lens, hkv=hkv, d=d, dtype=dtype, page_size=16)
    shared = make_queries(pool, 2, 16, g, dtype)[:, :1]  # one set of queries for all requests
    q = shared.expand(-1, len(lens), -1, -1, -1)
    rope = Rope(rope_table(rot, scale=1.2), torch.tensor([9, 300, 511], device=device()),
                start, neox)
    args = (q, pool.k, pool.src_slots, pool.src_lens, d**-0.5, None, None, rope)
    got = scores_mod.window_attention_scores(*args)
    torch.testing.assert_close(got, window_attention_scores_ref(*args), **TOL[dtype])
    unrotated = window_attention_scores_ref(q, pool.k, pool.src_slots, pool.src_lens, d**-0.5)
    assert not torch.allclose(got, unrotated, **TOL[dtype])  # the rotation is not a no-op


@pytest.mark.parametrize("g,hkv,d,dtype,neox,start,rot", ROPE_CASES)
def test_rotated_queries_match_the_twin(g, hkv, d, dtype, neox, start, rot):
    from sglang_zipage.kernels.reference import rope_queries
    from sglang_zipage.kernels.rope import rotate_queries

    pool = make_pool([5, 6, 7], hkv=hkv, d=d, dtype=dtype)
    q = make_queries(pool, 2, 3, g, dtype)[:, :1].expand(-1, 3, -1, -1, -1)
    rope = Rope(rope_table(rot, scale=1.2), torch.tensor([0, 77, 511], device=device()),
                start, neox)
    got = rotate_queries(q, rope)
    assert got.is_contiguous() and got.shape == q.shape
    torch.testing.assert_close(got, rope_queries(q, rope), **TOL[dtype])
    plain = rotate_queries(q, rope._replace(cos_sin=rope_table(rot)))
    assert torch.equal(plain[:, 0], q[:, 0])  # position 0 of an unscaled table: no rotation
    assert not torch.equal(plain[:, 1], q[:, 1])


def test_scores_do_not_depend_on_launch_shape():
    lens = [70, 3, 150]
    pool = make_pool(lens, hkv=2, d=64)
    q = make_queries(pool, 2, 16, 4, torch.float32)
    args = (q, pool.k, pool.src_slots, pool.src_lens, 0.125)
    base = scores_mod.window_attention_scores(*args, config=dict(n_splits=1))
    for config in (dict(n_splits=5, lse=(32, 4), probs=(64, 4)), dict(lse=(64, 2), probs=(32, 8), n_splits=2)):
        got = scores_mod.window_attention_scores(*args, config=config)
        torch.testing.assert_close(got, base, atol=1e-6, rtol=1e-4)


def test_scores_are_a_distribution_and_zero_on_padding():
    lens = [1, 40, 100]
    pool = make_pool(lens, hkv=2, d=64)
    q = make_queries(pool, 2, 16, 1, torch.float32)
    out = scores_mod.window_attention_scores(q, pool.k, pool.src_slots, pool.src_lens, 0.125)
    # G = 1: each query's softmax sums to 1, and so does their mean.
    torch.testing.assert_close(out.sum(-1), torch.ones_like(out.sum(-1)), atol=1e-5, rtol=0)
    for r, n in enumerate(lens):
        assert torch.all(out[:, r, :, n:] == 0)
        assert torch.all(out[:, r, :, :n] > 0)
    torch.testing.assert_close(out[:, 0, :, 0], torch.ones_like(out[:, 0, :, 0]))  # one token takes it all


def test_scores_ignore_foreign_slots_and_padding():
    lens = [10, 90]
    pool = make_pool(lens, hkv=2, d=64, page_size=16)
    q = make_queries(pool, 2, 16, 4, torch.float32)
    args = (q, pool.k, pool.src_slots, pool.src_lens, 0.125)
    clean = scores_mod.window_attention_scores(*args)
    owned = torch.zeros(pool.k[0].shape[0], dtype=torch.bool, device=device())
    for r, n in enumerate(lens):
        owned[pool.src_slots[r, :n]] = True
    for buf in pool.k:
        buf[~owned] = float("nan")  # slot 0 (padding target) included
    dirty = scores_mod.window_attention_scores(*args)
    assert torch.isfinite(dirty).all()
    assert torch.equal(dirty, clean)


def test_scores_accept_strided_query_views():
    lens = [50, 120]
    pool = make_pool(lens, hkv=2, d=64)
    ring = make_queries(pool, 2, 20, 4, torch.float32)  # a ring holding more steps
    big = torch.cat([ring, ring.flip(1)], dim=1)  # [L, 2R, 20, Hq, D]
    view = big[:, ::2, 2:18]  # non-contiguous in R and W
    assert not view.is_contiguous()
    args = (pool.k, pool.src_slots, pool.src_lens, 0.125)
    got = scores_mod.window_attention_scores(view, *args)
    torch.testing.assert_close(got, window_attention_scores_ref(view.contiguous(), *args), atol=1e-6, rtol=1e-4)


def test_backend_switch_routes_to_twin(monkeypatch):
    pool = make_pool([30, 17], hkv=2, d=64)
    q = make_queries(pool, 2, 16, 2, torch.float32)
    args = (q, pool.k, pool.src_slots, pool.src_lens, 0.125)
    monkeypatch.setenv(ENV_BACKEND, "ref")
    assert torch.equal(window_attention_scores(*args), window_attention_scores_ref(*args))
    monkeypatch.setenv(ENV_BACKEND, "triton")
    torch.testing.assert_close(window_attention_scores(*args), window_attention_scores_ref(*args), atol=1e-6, rtol=1e-4)
    monkeypatch.setenv(ENV_BACKEND, "cuda-please")
    with pytest.raises(ValueError, match=ENV_BACKEND):
        window_attention_scores(*args)


def test_scores_reject_bad_inputs():
    pool = make_pool([8], hkv=2, d=64)
    q = make_queries(pool, 2, 16, 2, torch.float32)
    with pytest.raises(ValueError, match="src_slots"):
        scores_mod.window_attention_scores(q, pool.k, pool.src_slots.int(), pool.src_lens, 0.1)
    with pytest.raises(ValueError, match="heads"):
        scores_mod.window_attention_scores(q[..., :3, :], pool.k, pool.src_slots, pool.src_lens, 0.1)
    with pytest.raises(ValueError, match="layers"):
        scores_mod.window_attention_scores(q, pool.k[:1], pool.src_slots, pool.src_lens, 0.1)
    with pytest.raises(ValueError, match="dtype"):
        scores_mod.window_attention_scores(q.half(), pool.k, pool.src_slots, pool.src_lens, 0.1)
