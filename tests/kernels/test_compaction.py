"""compact_kv (Triton) against its torch twin: a gather, so results must be bit-exact.

Covers fp32/fp16/bf16, head_dim 64/128, 1-4 KV heads, page_size 1/16 on permuted
pages, in-place compaction (dst = the request's own leading slots, overlapping
the sources) and disjoint destinations, K on both sides of BLOCK_J, keep = all
tokens (identity), keep = the last K tokens (largest shift), score buffers on
and off. Property checks: each head's kept (K, V) rows are, as a multiset and in
order, the old rows at the kept positions; every slot outside dst_slots (other
requests, a shared-prefix region, sentinel-filled free pages) is bit-identical.
Run: PYTHONPATH=. .venv/bin/python -m pytest tests/kernels -q
"""

import pytest
import torch

from kv_cases import SENTINEL, bits, device, make_pool, random_keep
from sglang_zipage.kernels import ENV_BACKEND, compact_kv, compact_kv_ref
from sglang_zipage.kernels import compaction as compaction_mod


def disjoint_dst(pool, n_req, k):
    """[R, k] destination slots taken from the pool's free pages."""
    free_slots = (pool.free_pages[:, None] * pool.page_size + torch.arange(pool.page_size, device=device())).flatten()
    assert free_slots.numel() >= n_req * k, "make_pool(extra_pages=...) too small"
    return free_slots[: n_req * k].view(n_req, k).clone()


def kept_scores_for(keep, seed=3):
    gen = torch.Generator().manual_seed(seed)
    return torch.rand(keep.shape, generator=gen).to(device())


def run_both(pool, keep, dst, with_scores=True, **launch):
    """Triton on the pool's buffers, twin on copies; returns (old, triton, twin) buffers."""
    old = pool.clone_buffers()
    twin = pool.clone_buffers()
    kept = kept_scores_for(keep) if with_scores else None
    compaction_mod.compact_kv(pool.k, pool.v, pool.scores if with_scores else None,
                              pool.src_slots, keep, dst, kept, **launch)
    compact_kv_ref(twin[0], twin[1], twin[2] if with_scores else None, pool.src_slots, keep, dst, kept)
    return old, (pool.k, pool.v, pool.scores), twin, kept


def assert_bit_equal(a_bufs, b_bufs):
    for a_list, b_list in zip(a_bufs, b_bufs):
        for a, b in zip(a_list, b_list):
            assert torch.equal(bits(a), bits(b))


def assert_moved_rows(old, new, pool, keep, dst, kept):
    """Spec check, independent of the twin: rows, their multiset, scores, untouched slots."""
    n_layers, n_req, hkv, _ = keep.shape
    for l in range(n_layers):
        for r in range(n_req):
            for h in range(hkv):
                src = pool.src_slots[r, keep[l, r, h]]
                for o, n in ((old[0], new[0]), (old[1], new[1])):
                    want, got = bits(o[l][src, h]), bits(n[l][dst[r], h])
                    assert torch.equal(got, want)
                    u_got, c_got = torch.unique(got, dim=0, return_counts=True)
                    u_want, c_want = torch.unique(want, dim=0, return_counts=True)
                    assert torch.equal(u_got, u_want) and torch.equal(c_got, c_want)
                if kept is not None:
                    assert torch.equal(new[2][l][dst[r], h], kept[l, r, h])
    touched = torch.zeros(pool.k[0].shape[0], dtype=torch.bool, device=device())
    touched[dst.flatten()] = True
    for o_list, n_list in zip(old, new):
        for o, n in zip(o_list, n_list):
            assert torch.equal(bits(o[~touched]), bits(n[~touched]))


CASES = [
    # (dtype, D, Hkv, page_size, lens, K, in_place)
    (torch.float32, 64, 2, 1, [100, 37, 70], 30, True),
    (torch.float16, 128, 1, 16, [64, 160], 48, True),
    (torch.bfloat16, 64, 4, 16, [96, 200], 64, False),
    (torch.bfloat16, 128, 2, 1, [130, 150], 100, True),
    (torch.float16, 64, 3, 1, [66, 80, 129], 65, False),
    (torch.bfloat16, 64, 2, 16, [1200, 400], 64, True),  # elastic: a long suffix in one go
]


@pytest.mark.parametrize("block_j", [16, None])  # several blocks per row / the default
@pytest.mark.parametrize("dtype,d,hkv,page_size,lens,k,in_place", CASES)
def test_compaction_matches_twin_bit_exact(dtype, d, hkv, page_size, lens, k, in_place, block_j):
    pool = make_pool(lens, hkv=hkv, d=d, dtype=dtype, page_size=page_size, extra_pages=40 * 16 // page_size)
    keep = random_keep(2, lens, hkv, k, seed=len(lens))
    dst = pool.src_slots[:, :k].clone() if in_place else disjoint_dst(pool, len(lens), k)
    old, new, twin, kept = run_both(pool, keep, dst, block_j=block_j)
    assert_bit_equal(new, twin)
    assert_moved_rows(old, new, pool, keep, dst, kept)


@pytest.mark.parametrize("block_j", [16, None])
def test_in_place_order_compacts_in_place_bit_exact(block_j):
    """keep as scoring arranges it (scoring.in_place_order: not ascending, keep[j] >= j):
    the same rows land where the twin puts them, and only the moved rows change."""
    from sglang_zipage.scoring import in_place_order

    lens, k, tail = [200, 150], 96, 16
    pool = make_pool(lens, hkv=2, d=64, dtype=torch.bfloat16, page_size=16, extra_pages=8)
    ascending = random_keep(2, lens, 2, k, seed=11)
    keep = in_place_order(ascending, tail)
    assert not torch.equal(keep, ascending)
    dst = pool.src_slots[:, :k].clone()
    old, new, twin, kept = run_both(pool, keep, dst, block_j=block_j)
    assert_bit_equal(new, twin)
    assert_moved_rows(old, new, pool, keep, dst, kept)


@pytest.mark.parametrize("block_j", [16, 64])
def test_in_place_compaction_survives_the_largest_shift(block_j):
    lens, k = [120, 120], 48  # keep the last 48 tokens: every row moves 72 slots down
    pool = make_pool(lens, hkv=2, d=64, dtype=torch.bfloat16, page_size=16)
    keep = (torch.arange(k, device=device()) + 120 - k).expand(2, 2, 2, k).contiguous()
    dst = pool.src_slots[:, :k].clone()
    old, new, twin, kept = run_both(pool, keep, dst, block_j=block_j)
    assert_bit_equal(new, twin)
    assert_moved_rows(old, new, pool, keep, dst, kept)


def test_keeping_every_token_in_place_changes_only_scores():
    lens = [32, 32]
    pool = make_pool(lens, hkv=2, d=64, page_size=16)
    keep = torch.arange(32, device=device()).expand(2, 2, 2, 32).contiguous()
    old, new, twin, kept = run_both(pool, keep, pool.src_slots.clone())
    assert_bit_equal(new[:2], old[:2])
    assert_bit_equal(new, twin)
    assert_moved_rows(old, new, pool, keep, pool.src_slots, kept)


def test_compaction_leaves_prefix_other_requests_and_guard_untouched():
    # Request 0 plays a shared prompt prefix, request 2 a request outside this batch;
    # only request 1's compressible range is compacted.
    lens = [48, 160, 64]
    pool = make_pool(lens, hkv=2, d=64, dtype=torch.float16, page_size=16)
    batch = pool.src_slots[1:2].clone()
    keep = random_keep(2, [160], 2, 96, seed=7)
    old = pool.clone_buffers()
    kept = kept_scores_for(keep)
    compaction_mod.compact_kv(pool.k, pool.v, pool.scores, batch, keep, batch[:, :96].clone(), kept)
    untouched = torch.ones(pool.k[0].shape[0], dtype=torch.bool, device=device())
    untouched[batch[0, :96]] = False
    guard = (pool.free_pages[:, None] * 16 + torch.arange(16, device=device())).flatten()
    for o_list, n_list in zip(old, (pool.k, pool.v, pool.scores)):
        for o, n in zip(o_list, n_list):
            assert torch.equal(bits(o[untouched]), bits(n[untouched]))
            assert torch.all(n[guard] == SENTINEL)


def test_compaction_without_scores_leaves_score_buffers_alone():
    lens = [40, 70]
    pool = make_pool(lens, hkv=2, d=64)
    keep = random_keep(2, lens, 2, 20)
    before = [s.clone() for s in pool.scores]
    compaction_mod.compact_kv(pool.k, pool.v, pool.scores, pool.src_slots, keep, pool.src_slots[:, :20].clone(), None)
    assert all(torch.equal(a, b) for a, b in zip(before, pool.scores))
    old, new, twin, _ = run_both(pool, keep, pool.src_slots[:, :20].clone(), with_scores=False)
    assert_bit_equal(new[:2], twin[:2])


def test_backend_switch_routes_compaction(monkeypatch):
    lens = [50, 30]
    keep = random_keep(2, lens, 2, 24)
    results = []
    for backend in ("ref", "triton"):
        monkeypatch.setenv(ENV_BACKEND, backend)
        pool = make_pool(lens, hkv=2, d=64)
        compact_kv(pool.k, pool.v, pool.scores, pool.src_slots, keep, pool.src_slots[:, :24].clone(), kept_scores_for(keep))
        results.append((pool.k, pool.v, pool.scores))
    assert_bit_equal(results[0], results[1])


def test_compaction_rejects_bad_inputs():
    pool = make_pool([20], hkv=2, d=64)
    keep = random_keep(2, [20], 2, 8)
    dst = pool.src_slots[:, :8].clone()
    with pytest.raises(ValueError, match="keep"):
        compaction_mod.compact_kv(pool.k, pool.v, None, pool.src_slots, keep.int(), dst, None)
    with pytest.raises(ValueError, match="dst_slots"):
        compaction_mod.compact_kv(pool.k, pool.v, None, pool.src_slots, keep, dst[:, :4], None)
    with pytest.raises(ValueError, match="heads"):
        compaction_mod.compact_kv(pool.k, pool.v, None, pool.src_slots, keep[:, :, :1].contiguous(), dst, None)
    with pytest.raises(ValueError, match="kept_scores"):
        compaction_mod.compact_kv(pool.k, pool.v, pool.scores, pool.src_slots, keep, dst, keep.double())
