"""Plan + execute on real SGLang pools (CPU): what moves, what is freed, what never changes.

Uses SGLang 0.5.17's ReqToTokenPool, MHATokenToKVPool and token/paged allocators with the
torch twins of the kernels. Run: .venv/bin/python -m pytest tests/unit/test_compaction_plan.py
"""

import pytest
import torch

from sglang.srt.mem_cache.allocator.paged import PagedTokenToKVPoolAllocator
from sglang.srt.mem_cache.allocator.token import TokenToKVPoolAllocator
from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool, ReqToTokenPool
from sglang_zipage.compaction import (S_MAX_ALIGN, CompactionItem, commit_shadow, plan_compaction,
                                      shift_tail)
from sglang_zipage.executor import execute
from sglang_zipage.kv_layout import LayerKV
from sglang_zipage.scoring import Queries, ScoringParams

LAYERS, KV_HEADS, Q_HEADS, DIM, W = 2, 2, 4, 8, 4


def _setup(page, seed=0):
    g = torch.Generator().manual_seed(seed)
    pool = MHATokenToKVPool(size=1024, page_size=page, dtype=torch.float32, head_num=KV_HEADS,
                            head_dim=DIM, layer_num=LAYERS, device="cpu", enable_memory_saver=False)
    for buf in pool.k_buffer + pool.v_buffer:
        buf.copy_(torch.randn(buf.shape, generator=g))
    if page == 1:
        alloc = TokenToKVPoolAllocator(1024, torch.float32, "cpu", pool, False)
    else:
        alloc = PagedTokenToKVPoolAllocator(1024, page, torch.float32, "cpu", pool, False)
    alloc.free_pages = alloc.free_pages[torch.randperm(len(alloc.free_pages), generator=g)]
    r2t = ReqToTokenPool(size=4, max_context_len=512, device="cpu", enable_memory_saver=False)
    return pool, alloc, r2t, g


def _give(alloc, r2t, rpi, n):
    slots = alloc.alloc(n)
    r2t.req_to_token[rpi, :n] = slots.to(torch.int32)
    return slots


@pytest.mark.parametrize("page", [1, 16])
def test_plan_frees_surplus_pages_and_keeps_prompt_columns(page):
    pool, alloc, r2t, g = _setup(page)
    c0, k = 2 * page if page > 1 else 5, 4 * page if page > 1 else 12
    lengths = {1: c0 + k + 3 * page + 3, 2: c0 + k + 2 * page}  # physical lengths
    for rpi, n in lengths.items():
        _give(alloc, r2t, rpi, -(-n // page) * page)
    row_before = r2t.req_to_token.clone()
    free_before = alloc.available_size()
    items = [CompactionItem(rpi, c0, n - c0, 0, True, rpi, k) for rpi, n in lengths.items()]
    plan, surplus = plan_compaction(r2t.req_to_token, items, k, page)
    alloc.free(surplus)

    assert torch.equal(r2t.req_to_token, row_before)  # planning never edits req_to_token
    for i, (rpi, n) in enumerate(lengths.items()):
        src = row_before[rpi, c0:n].long()
        assert torch.equal(plan.src_slots[i, :n - c0], src)
        assert torch.equal(plan.dst_slots[i], src[:k])  # in place: the suffix's own columns
        assert (plan.src_slots[i, n - c0:] == 0).all()
    # Rows padded to the alignment the kernels' one compiled variant assumes; lengths exact.
    longest = max(it.suffix for it in items)
    assert plan.src_slots.shape[1] % S_MAX_ALIGN == 0
    assert longest <= plan.src_slots.shape[1] < longest + S_MAX_ALIGN
    assert plan.src_lens.tolist() == [it.suffix for it in items]
    freed_pages = {int(s) // page for s in surplus}
    kept_pages = {int(s) // page for rpi, n in lengths.items() for s in row_before[rpi, :c0 + k]}
    assert not freed_pages & kept_pages  # I2/I3: only whole surplus pages go back
    assert alloc.available_size() - free_before == len(freed_pages) * page


@pytest.mark.parametrize("page", [1, 16])
def test_execute_keeps_window_and_leaves_other_slots_untouched(page):
    pool, alloc, r2t, g = _setup(page, seed=1)
    c0, k = (16, 32) if page > 1 else (3, 10)
    n = c0 + k + (32 if page > 1 else 7)
    _give(alloc, r2t, 1, -(-n // page) * page)
    other = _give(alloc, r2t, 2, 2 * page if page > 1 else 9)  # another request
    snapshot = [b.clone() for b in pool.k_buffer + pool.v_buffer]
    item = CompactionItem(1, c0, n - c0, 0, True, 1, k)
    plan, _ = plan_compaction(r2t.req_to_token, [item], k, page)
    ring = torch.randn((LAYERS, 3, W, Q_HEADS, DIM), generator=g)
    execute(plan, ScoringParams(window=W, decay=0.0), Queries(ring[:, plan.window_slots]), LayerKV(pool.k_buffer, pool.v_buffer),
            None, DIM ** -0.5)

    row = r2t.req_to_token[1].long()
    untouched = torch.cat([row[:c0], other.long()])
    for before, after in zip(snapshot, pool.k_buffer + pool.v_buffer):
        assert torch.equal(after[untouched], before[untouched])  # prompt + other request
        # the recent window lands, in order, in the last W kept slots of every head
        assert torch.equal(after[row[c0 + k - W:c0 + k]], before[row[n - W:n]])
        # every kept row is one of the request's original suffix rows, per head
        orig = before[row[c0:n]]
        for h in range(KV_HEADS):
            kept = after[row[c0:c0 + k], h]
            match = (kept[:, None, :] == orig[None, :, h, :]).all(-1).any(1)
            assert match.all()


@pytest.mark.parametrize("page", [1, 16])
def test_shadow_compaction_reads_like_in_place_and_keeps_the_tail(page):
    """An asynchronous compaction into fresh slots, committed after `tail` more tokens were
    decoded, leaves the request reading exactly the KV an in-place compaction of the same
    snapshot gives, followed by the tail; the old snapshot pages are what is freed."""
    c0, k, tail = (16, 32, 5) if page > 1 else (3, 10, 5)
    snap = c0 + k + (32 if page > 1 else 7)  # physical length at the snapshot
    params = ScoringParams(window=W, decay=0.0)
    runs = {}
    for mode in ("in_place", "shadow"):
        pool, alloc, r2t, g = _setup(page, seed=2)
        _give(alloc, r2t, 1, -(-(snap + tail) // page) * page)
        _give(alloc, r2t, 2, 2 * page if page > 1 else 9)  # another request
        ring = torch.randn((LAYERS, 3, W, Q_HEADS, DIM), generator=g)
        item = CompactionItem(1, c0, snap - c0, 0, True, 1, k)
        row_before = r2t.req_to_token[1].clone().long()
        free_before = alloc.available_size()
        if mode == "in_place":
            plan, surplus = plan_compaction(r2t.req_to_token, [item], k, page)
            execute(plan, params, Queries(ring[:, plan.window_slots]), LayerKV(pool.k_buffer, pool.v_buffer),
                    None, DIM ** -0.5)
            # the tail would have been decoded after the compaction, behind the kept tokens
            tail_src = row_before[snap:snap + tail]
            alloc.free(surplus)
            read = torch.cat([row_before[c0:c0 + k], tail_src])
        else:
            fresh = alloc.alloc(k)
            plan, old = plan_compaction(r2t.req_to_token, [item], k, page, fresh=fresh.view(1, k))
            assert torch.equal(r2t.req_to_token[1].long(), row_before)  # decoding goes on
            execute(plan, params, Queries(ring[:, plan.window_slots]), LayerKV(pool.k_buffer, pool.v_buffer),
                    None, DIM ** -0.5)
            commit_shadow(r2t.req_to_token, 1, c0, snap - c0, snap - c0 + tail, fresh)
            alloc.free(old[0, :snap - c0])
            row = r2t.req_to_token[1].long()
            assert torch.equal(row[:c0], row_before[:c0])  # I3
            assert torch.equal(row[c0:c0 + k], fresh.long())
            assert torch.equal(row[c0 + k:c0 + k + tail], row_before[snap:snap + tail])
            assert ((row[c0:c0 + k + tail] % page) == (torch.arange(c0, c0 + k + tail) % page)).all()  # I1
            read = row[c0:c0 + k + tail]
        assert alloc.available_size() - free_before == snap - c0 - k  # same net pages freed
        runs[mode] = [b[read] for b in pool.k_buffer + pool.v_buffer]
    for a, b in zip(runs["in_place"], runs["shadow"]):
        assert torch.equal(a, b)


def test_speculative_columns_in_flight_are_not_scored_and_follow_the_kept_tokens():
    """Speculative decoding allocates columns past the committed ones for the step in flight
    (draft and verify tokens, accepted or not). A compaction scores only the committed
    suffix; the in-flight columns move, as slots (their KV untouched), right behind the kept
    tokens, in the target's table and so for the draft's pool at the same slots, whose rows
    follow the target's (scoring.consensus); both lengths drop by what was evicted."""
    from types import SimpleNamespace

    from sglang_zipage.budget import Budget, Budgets
    from sglang_zipage.planner import Planner
    from sglang_zipage.policy import RequestBudgets
    from sglang_zipage.request_state import ReqState

    pool, alloc, r2t, g = _setup(1, seed=3)
    draft = MHATokenToKVPool(size=1024, page_size=1, dtype=torch.float32, head_num=1,
                             head_dim=DIM, layer_num=1, device="cpu", enable_memory_saver=False)
    draft.k_buffer[0].copy_(torch.randn(draft.k_buffer[0].shape, generator=g))
    draft.v_buffer[0].copy_(torch.randn(draft.v_buffer[0].shape, generator=g))
    c0, k, committed, allocated = 3, 10, 30, 38
    _give(alloc, r2t, 1, allocated)
    req = SimpleNamespace(req_pool_idx=1, kv_committed_len=committed,
                          kv=SimpleNamespace(kv_allocated_len=allocated), zipage=ReqState(c0=c0))
    planner = Planner(RequestBudgets(Budgets(Budget(k, 8, W, window_scored=False))), None,
                      layout=None, window=None, shadows=None, allocator=None, stats=None,
                      decisions=None, pending=[])
    item = planner.item(req, req.zipage, committed - c0, k)
    assert (item.suffix, item.tail) == (committed - c0, allocated - committed)

    row_before = r2t.req_to_token[1].clone().long()
    before = [b.clone() for b in (*pool.k_buffer, *pool.v_buffer, draft.k_buffer[0])]
    plan, surplus = plan_compaction(r2t.req_to_token, [item], k, 1)
    assert torch.equal(plan.src_slots[0, :committed - c0], row_before[c0:committed])
    assert (plan.src_slots[0, committed - c0:] == 0).all()  # nothing in flight is scored
    shift_tail(r2t.req_to_token, item)
    ring = torch.randn((LAYERS, 2, W, Q_HEADS, DIM), generator=g)
    execute(plan, ScoringParams(window=W, decay=0.0), Queries(ring[:, plan.window_slots]),
            LayerKV(pool.k_buffer, pool.v_buffer), None, DIM ** -0.5,
            (LayerKV(draft.k_buffer, draft.v_buffer),))
    alloc.free(surplus)

    row = r2t.req_to_token[1].long()
    new_len = c0 + k + allocated - committed
    assert torch.equal(row[:c0 + k], row_before[:c0 + k])  # the kept tokens' own slots
    assert torch.equal(row[c0 + k:new_len], row_before[committed:allocated])  # in flight
    in_flight = row_before[committed:allocated]
    for b, a in zip(before, (*pool.k_buffer, *pool.v_buffer, draft.k_buffer[0])):
        assert torch.equal(a[in_flight], b[in_flight])  # their KV is not touched
    # the draft keeps one token set, its window included, in every one of its rows
    kept = row[c0:c0 + k]
    orig = before[-1][row_before[c0:committed], 0]
    match = (draft.k_buffer[0][kept, 0][:, None] == orig[None]).all(-1)
    assert match.any(1).all()
    assert torch.equal(draft.k_buffer[0][kept[-W:], 0], orig[-W:])
    assert set(surplus.tolist()) == set(row_before[c0 + k:committed].tolist())
