"""global_scores: pooling, decay and protection of the window scores, in one pass.

`_global_scores_kernel`, grid (L*R*Hkv, cdiv(S_max, BLOCK_S)): each program reads one
block of a row of window-attention scores and writes the row's global score g and its
protected copy `final` (what top-k ranks):

  a      = max-pool of the row over its valid positions (kernel POOL, stride 1) where
           first[r] (a request's first compaction), else the row as it is;
  g      = max(a, decay * stored), stored = score_buffers[l][src_slots[r, s], h] for
           s < min(n_stored[r], src_lens[r]), else 0 (HAS_STORED 0: g = a);
  final  = +inf for the first `sink` and the last `window` valid positions, -inf past
           src_lens[r], g elsewhere.

The torch version of the same stages wrote and re-read the [L, R, Hkv, S_max] scores
once per stage; here each score is read once (plus POOL - 1 neighbours from cache) and
written twice. Max and one multiply are exact in fp32, so the result equals the twin
bit for bit. Twin: reference.global_scores_ref.
"""

from __future__ import annotations

from typing import Optional, Sequence, Tuple

import torch
import triton.language as tl

from sglang_zipage.kernels.utils import check_layer_buffers, check_tensor, layer_ptr_table, lazy_jit

BLOCK_S = 256


@lazy_jit(batch_args=("R",))
def _global_scores_kernel(
    a_ptr, s_table, src_slots_ptr, src_lens_ptr, n_stored_ptr, first_ptr, g_ptr, final_ptr,
    R, S_max, stride_src_r, stride_ss, decay, sink, window,
    HKV: tl.constexpr, POOL: tl.constexpr, HAS_STORED: tl.constexpr, BLOCK_S: tl.constexpr,
):
    pid = tl.program_id(0)
    block = tl.program_id(1)
    h = pid % HKV
    r = (pid // HKV) % R
    layer = pid // (HKV * R)
    length = tl.load(src_lens_ptr + r).to(tl.int32)
    s = block * BLOCK_S + tl.arange(0, BLOCK_S)
    in_row = s < S_max
    valid = s < length
    row = pid.to(tl.int64) * S_max
    a = tl.load(a_ptr + row + s, mask=in_row, other=0.0)
    if POOL > 1:
        pooled = tl.full([BLOCK_S], float("-inf"), tl.float32)
        for o in tl.static_range(POOL):
            t = s + (o - POOL // 2)
            pooled = tl.maximum(pooled, tl.load(a_ptr + row + t, mask=(t >= 0) & (t < length),
                                                other=float("-inf")))
        first = tl.load(first_ptr + r) != 0
        a = tl.where(first, tl.where(valid, pooled, 0.0), a)
    g = a
    if HAS_STORED:
        n_stored = tl.minimum(tl.load(n_stored_ptr + r).to(tl.int32), length)
        has = s < n_stored
        slot = tl.load(src_slots_ptr + r * stride_src_r + s, mask=has, other=0)
        base = tl.load(s_table + layer).to(tl.pointer_type(tl.float32))
        stored = tl.load(base + slot * stride_ss + h, mask=has, other=0.0)
        g = tl.maximum(a, decay * stored)
    kept = valid & ((s < sink) | (s >= length - window))
    final = tl.where(kept, float("inf"), g)
    final = tl.where(valid, final, float("-inf"))
    tl.store(g_ptr + row + s, g, mask=in_row)
    tl.store(final_ptr + row + s, final, mask=in_row)


def global_scores(
    attention: torch.Tensor,
    score_buffers: Optional[Sequence[torch.Tensor]],
    src_slots: torch.Tensor,
    src_lens: torch.Tensor,
    n_stored: torch.Tensor,
    first: torch.Tensor,
    pooling: int,
    decay: float,
    sink: int,
    window: int,
) -> Tuple[torch.Tensor, torch.Tensor]:
    """Triton op of reference.global_scores_ref (same contract)."""
    if attention.dim() != 4 or attention.dtype != torch.float32 or not attention.is_contiguous():
        raise ValueError(f"attention: expected a contiguous float32 [L, R, Hkv, S_max], got "
                         f"{attention.dtype} {tuple(attention.shape)}")
    n_layers, n_req, hkv, s_max = attention.shape
    device = attention.device
    check_tensor("src_slots", src_slots, (n_req, s_max), (torch.int64,), device)
    check_tensor("src_lens", src_lens, (n_req,), (torch.int32, torch.int64), device)
    check_tensor("n_stored", n_stored, (n_req,), (torch.int32, torch.int64), device)
    check_tensor("first", first, (n_req,), (torch.bool,), device)
    if pooling < 1 or pooling % 2 == 0:
        raise ValueError(f"pooling={pooling}: expected an odd kernel >= 1")
    if src_slots.stride(-1) != 1:
        raise ValueError("src_slots: rows must be contiguous")
    g = torch.empty_like(attention)
    final = torch.empty_like(attention)
    if attention.numel() == 0:
        return final, g
    has_stored = score_buffers is not None and decay != 0
    if has_stored:
        if len(score_buffers) != n_layers:
            raise ValueError(f"score_buffers: {len(score_buffers)} layers, attention has {n_layers}")
        check_layer_buffers("score_buffers", score_buffers, 2)
        check_tensor("score_buffers[0]", score_buffers[0], (None, hkv), (torch.float32,), device)
        table, stride_ss = layer_ptr_table(score_buffers), score_buffers[0].stride(0)
    else:
        table, stride_ss = attention, 0  # never read
    _global_scores_kernel[(n_layers * n_req * hkv, -(-s_max // BLOCK_S))](
        attention, table, src_slots, src_lens, n_stored, first.view(torch.uint8), g, final,
        n_req, s_max, src_slots.stride(0), stride_ss, float(decay), int(sink), int(window),
        HKV=hkv, POOL=int(pooling), HAS_STORED=int(has_stored), BLOCK_S=BLOCK_S,
    )
    return final, g
