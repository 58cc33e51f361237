"""compact_kv: move each head's kept tokens into the destination slots, in place.

One program per (layer, request, KV head) walks j = 0..K-1 in blocks of BLOCK_J:
it loads the block's source rows (K, V), waits at a barrier, then stores them.

Why this is race-free when dst_slots[r] == src_slots[r, :K] (in place):
  keep's values are distinct with keep[j] >= j (true of any ascending keep, and of
  scoring.in_place_order's arrangement). Block c reads positions
  keep[j] >= c * BLOCK_J and writes positions [c * BLOCK_J, (c+1) * BLOCK_J).
  A position p read by block c is written by block c' = p // BLOCK_J >= c. All
  warps pass barrier c' only after all of them did the loads of blocks <= c', so
  every read sees the old value. Prefetching later blocks' loads is also safe:
  they read positions >= (c+1) * BLOCK_J, which block c never writes.
Programs of different (layer, head) or requests touch disjoint memory (heads are
separate columns of a slot row; the caller gives requests disjoint slots).
Rows whose source slot already is the destination are not moved.
Twin: reference.compact_kv_ref.
"""

from __future__ import annotations

from typing import Optional, Sequence

import torch
import triton.language as tl

from sglang_zipage.kernels.utils import (
    check_layer_buffers,
    check_tensor,
    layer_ptr_table,
    lazy_jit,
    next_pow2,
    triton_dtype,
)


# Rows per block and warps: the fastest of the sweep in benchmarks/bench_kernels.py on
# an H200 (bf16, D=128, 8 KV heads; 64/4 was within 2%). Results: benchmarks/results/.
TUNING = dict(block_j=128, num_warps=4)


@lazy_jit(batch_args=("R", "K", "stride_dst_r", "stride_keep_l", "stride_keep_r", "stride_keep_h",
                     "stride_kept_l", "stride_kept_r", "stride_kept_h"))
def _compact_kv_kernel(
    k_table, v_table, s_table, src_slots_ptr, keep_ptr, dst_slots_ptr, kept_ptr,
    R, K,
    stride_src_r, stride_dst_r,
    stride_keep_l, stride_keep_r, stride_keep_h,
    stride_kept_l, stride_kept_r, stride_kept_h,
    stride_s, stride_h, stride_ss, stride_sh,
    HKV: tl.constexpr, D: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_J: tl.constexpr,
    KV_DTYPE: tl.constexpr, HAS_SCORES: tl.constexpr, HAS_V: tl.constexpr,
):
    pid = tl.program_id(0)
    h = pid % HKV
    r = (pid // HKV) % R
    layer = pid // (HKV * R)
    # Torch allocations are >= 256-byte aligned. Triton cannot see that through the
    # int -> pointer cast; without the hint it falls back to 2-byte loads and spills.
    k_base = tl.multiple_of(tl.load(k_table + layer).to(tl.pointer_type(KV_DTYPE)), 16)
    v_base = tl.multiple_of(tl.load(v_table + layer).to(tl.pointer_type(KV_DTYPE)), 16)
    s_base = tl.load(s_table + layer).to(tl.pointer_type(tl.float32))  # used if HAS_SCORES
    keep_row = keep_ptr + layer.to(tl.int64) * stride_keep_l + r * stride_keep_r + h * stride_keep_h
    kept_row = kept_ptr + layer.to(tl.int64) * stride_kept_l + r * stride_kept_r + h * stride_kept_h
    d = tl.arange(0, BLOCK_D)
    d_ok = d < D
    for j0 in range(0, K, BLOCK_J):
        j = j0 + tl.arange(0, BLOCK_J)
        j_ok = j < K
        pos = tl.load(keep_row + j, mask=j_ok, other=0)
        src = tl.load(src_slots_ptr + r * stride_src_r + pos, mask=j_ok, other=0)
        dst = tl.load(dst_slots_ptr + r * stride_dst_r + j, mask=j_ok, other=0)
        move = (j_ok & (src != dst))[:, None] & d_ok[None, :]
        col = h * stride_h + d[None, :]
        k_rows = tl.load(k_base + src[:, None] * stride_s + col, mask=move)
        if HAS_V:
            v_rows = tl.load(v_base + src[:, None] * stride_s + col, mask=move)
        # All loads of this block before any store of it (see module docstring).
        tl.debug_barrier()
        tl.store(k_base + dst[:, None] * stride_s + col, k_rows, mask=move)
        if HAS_V:
            tl.store(v_base + dst[:, None] * stride_s + col, v_rows, mask=move)
        if HAS_SCORES:
            kept = tl.load(kept_row + j, mask=j_ok, other=0.0)
            tl.store(s_base + dst * stride_ss + h * stride_sh, kept, mask=j_ok)


def compact_kv(
    k_buffers: Sequence[torch.Tensor],
    v_buffers: Optional[Sequence[torch.Tensor]],
    score_buffers: Optional[Sequence[torch.Tensor]],
    src_slots: torch.Tensor,
    keep: torch.Tensor,
    dst_slots: torch.Tensor,
    kept_scores: Optional[torch.Tensor],
    *,
    block_j: Optional[int] = None,
    num_warps: Optional[int] = None,
) -> None:
    """Triton op of reference.compact_kv_ref (same contract), in place.

    Args:
        k_buffers, v_buffers: L tensors [slots, Hkv, D], one dtype (fp16/bf16/fp32/uint8),
            all layers with the same shape and strides, last dim contiguous; v_buffers
            None when the key row holds the value too (MLA's latent row).
        score_buffers: L tensors [slots, Hkv] float32, or None.
        src_slots: [R, S_max] int64, rows contiguous.
        keep: [L, R, Hkv, K] int64, distinct per row with keep[..., j] >= j (e.g.
            ascending), values in [0, src_lens[r]); last dim contiguous. Not checked on
            the device.
        dst_slots: [R, K] int64, rows contiguous; either src_slots[:, :K] (in place) or
            slots disjoint from every src slot; distinct across requests.
        kept_scores: [L, R, Hkv, K] float32 or None; stored to
            score_buffers[l][dst_slots[r, j], h] when score_buffers is given too.
        block_j, num_warps: launch tuning only (None = TUNING).

    For every l, r, h, j: buf[l][dst_slots[r, j], h] = OLD buf[l][src_slots[r, keep[l, r, h, j]], h].
    No slot outside dst_slots is written.
    """
    if keep.dim() != 4:
        raise ValueError(f"keep: expected [L, R, Hkv, K], got {tuple(keep.shape)}")
    n_layers, n_req, hkv, k_keep = keep.shape
    check_layer_buffers("k_buffers", k_buffers, 3)
    k0 = k_buffers[0]
    device = k0.device
    if len(k_buffers) != n_layers:
        raise ValueError(f"k_buffers: {len(k_buffers)} layers, keep has {n_layers}")
    has_v = v_buffers is not None
    if has_v:
        check_layer_buffers("v_buffers", v_buffers, 3)
        if len(v_buffers) != n_layers:
            raise ValueError(f"v_buffers: {len(v_buffers)} layers, keep has {n_layers}")
        if v_buffers[0].shape != k0.shape or v_buffers[0].stride() != k0.stride() or v_buffers[0].dtype != k0.dtype:
            raise ValueError("v_buffers must match k_buffers in shape, strides and dtype")
    if k0.shape[1] != hkv:
        raise ValueError(f"keep has {hkv} heads, k_buffers have {k0.shape[1]}")
    check_tensor("src_slots", src_slots, (n_req, None), (torch.int64,), device)
    check_tensor("keep", keep, (n_layers, n_req, hkv, k_keep), (torch.int64,), device)
    check_tensor("dst_slots", dst_slots, (n_req, k_keep), (torch.int64,), device)
    if k_keep > src_slots.shape[1]:
        raise ValueError(f"keep: K={k_keep} exceeds S_max={src_slots.shape[1]}")
    if src_slots.stride(-1) != 1 or dst_slots.stride(-1) != 1 or keep.stride(-1) != 1:
        raise ValueError("src_slots, dst_slots and keep need a contiguous last dim")
    has_scores = score_buffers is not None and kept_scores is not None
    if has_scores:
        check_layer_buffers("score_buffers", score_buffers, 2)
        check_tensor("score_buffers[0]", score_buffers[0], (None, hkv), (torch.float32,), device)
        check_tensor("kept_scores", kept_scores, tuple(keep.shape), (torch.float32,), device)
        if len(score_buffers) != n_layers or kept_scores.stride(-1) != 1:
            raise ValueError("score_buffers: one per layer; kept_scores: contiguous last dim")
    if keep.numel() == 0:
        return
    block_j = block_j or TUNING["block_j"]
    num_warps = num_warps or TUNING["num_warps"]
    s0 = score_buffers[0] if has_scores else k0
    kept = kept_scores if has_scores else keep
    _compact_kv_kernel[(n_layers * n_req * hkv,)](
        layer_ptr_table(k_buffers), layer_ptr_table(v_buffers if has_v else k_buffers),
        layer_ptr_table(score_buffers) if has_scores else layer_ptr_table(k_buffers),
        src_slots, keep, dst_slots, kept,
        n_req, k_keep,
        src_slots.stride(0), dst_slots.stride(0),
        keep.stride(0), keep.stride(1), keep.stride(2),
        kept.stride(0), kept.stride(1), kept.stride(2),
        k0.stride(0), k0.stride(1), s0.stride(0), s0.stride(1),
        HKV=hkv, D=k0.shape[2], BLOCK_D=next_pow2(k0.shape[2]), BLOCK_J=block_j,
        KV_DTYPE=triton_dtype(k0.dtype), HAS_SCORES=has_scores, HAS_V=has_v,
        num_warps=num_warps,
    )
