"""rotate_queries: pre-RoPE query rows rotated to each request's position (the calibrated
scorer's queries, kernels.Rope), written once per compaction launch so that the attention
kernels (scores.py) score them as they score the window's post-RoPE rows.

One program per (layer, request, row) and block of HB heads: it loads the row (a view that
may repeat the same rows for every request, stride 0), rotates dims [start, start + 2 half)
by the request's cos | sin from the model's table (float32, rounded to the query dtype) and
stores it. The copy is the size of the window scorer's gathered rows for as many rows.
Twin: reference.rope_queries.
"""

from __future__ import annotations

import torch
import triton.language as tl

from sglang_zipage.kernels.reference import Rope
from sglang_zipage.kernels.utils import cdiv, jit_helper, lazy_jit, next_pow2, triton_dtype


@jit_helper
def query_tile(q_ptr, q_off, d, mask, r, pos_ptr, cs_ptr, stride_cs,
               ROT_START: tl.constexpr, ROT_HALF: tl.constexpr, NEOX: tl.constexpr,
               Q_DTYPE: tl.constexpr):
    """Query rows q_off [N] x dims d [BD] of request r, dims [ROT_START, ROT_START +
    2 ROT_HALF) rotated to the request's position pos_ptr[r] by the model's table."""
    q = tl.load(q_ptr + q_off[:, None] + d[None, :], mask=mask, other=0.0)
    j = d - ROT_START
    rot = (j >= 0) & (j < 2 * ROT_HALF)
    if NEOX:  # pairs (i, i + R/2)
        first = j < ROT_HALF
        pair = tl.where(first, j, j - ROT_HALF)
        partner = tl.where(first, j + ROT_HALF, j - ROT_HALF)
    else:  # pairs (2i, 2i + 1)
        first = (j % 2) == 0
        pair = j // 2
        partner = tl.where(first, j + 1, j - 1)
    pair = tl.where(rot, pair, 0)
    partner = tl.where(rot, partner, 0)
    row = cs_ptr + tl.load(pos_ptr + r).to(tl.int64) * stride_cs
    cos = tl.load(row + pair, mask=rot, other=1.0).to(tl.float32)
    sin = tl.load(row + ROT_HALF + pair, mask=rot, other=0.0).to(tl.float32)
    sin = tl.where(first, -sin, sin)
    other = tl.load(q_ptr + q_off[:, None] + (ROT_START + partner)[None, :],
                    mask=mask & rot[None, :], other=0.0)
    return (q.to(tl.float32) * cos[None, :] + other.to(tl.float32) * sin[None, :]).to(Q_DTYPE)


@lazy_jit(batch_args=("R",))
def _rotate_kernel(
    q_ptr, out_ptr, cs_ptr, pos_ptr, R,
    stride_ql, stride_qr, stride_qw, stride_qh, stride_cs,
    W: tl.constexpr, HQ: tl.constexpr, D: tl.constexpr, HB: tl.constexpr,
    BLOCK_D: tl.constexpr, ROT_START: tl.constexpr, ROT_HALF: tl.constexpr,
    NEOX: tl.constexpr, Q_DTYPE: tl.constexpr,
):
    pid = tl.program_id(0)
    w = pid % W
    r = (pid // W) % R
    layer = pid // (W * R)
    h = tl.program_id(1) * HB + tl.arange(0, HB)
    d = tl.arange(0, BLOCK_D)
    mask = (h < HQ)[:, None] & (d < D)[None, :]
    q_off = layer.to(tl.int64) * stride_ql + r * stride_qr + w * stride_qw + h * stride_qh
    q = query_tile(q_ptr, q_off, d, mask, r, pos_ptr, cs_ptr, stride_cs,
                   ROT_START, ROT_HALF, NEOX, Q_DTYPE)
    tl.store(out_ptr + pid.to(tl.int64) * (HQ * D) + h[:, None] * D + d[None, :], q, mask=mask)


def rotate_queries(q: torch.Tensor, rope: Rope) -> torch.Tensor:
    """Triton op of reference.rope_queries: q [L, R, W, Hq, D] pre-RoPE (any strides, last
    dim contiguous; stride 0 over requests allowed) -> a new contiguous tensor, rotated to
    rope.positions[r]."""
    n_layers, n_req, w, hq, d = q.shape
    out = torch.empty((n_layers, n_req, w, hq, d), dtype=q.dtype, device=q.device)
    if out.numel() == 0:
        return out
    block_d = next_pow2(d)
    hb = min(next_pow2(hq), max(1, 4096 // block_d))
    _rotate_kernel[(n_layers * n_req * w, cdiv(hq, hb))](
        q, out, rope.cos_sin, rope.positions, n_req,
        q.stride(0), q.stride(1), q.stride(2), q.stride(3), rope.cos_sin.stride(0),
        W=w, HQ=hq, D=d, HB=hb, BLOCK_D=block_d, ROT_START=rope.start,
        ROT_HALF=rope.cos_sin.shape[-1] // 2, NEOX=bool(rope.neox), Q_DTYPE=triton_dtype(q.dtype),
    )
    return out
