"""Device function of the window-attention kernels (scores.py): a tile of query rows, rotated
to a request's position on the way in when the queries are pre-RoPE (kernels.Rope, the
calibrated scorer). Twin: reference.rope_queries."""

from __future__ import annotations

import triton.language as tl

from sglang_zipage.kernels.utils import jit_helper


@jit_helper
def query_tile(q_ptr, q_off, d, mask, r, pos_ptr, cs_ptr, stride_cs,
               ROPE: tl.constexpr, ROT_START: tl.constexpr, ROT_HALF: tl.constexpr,
               NEOX: tl.constexpr, Q_DTYPE: tl.constexpr):
    """Query rows q_off [N] x dims d [BD] of request r. ROPE: dims [ROT_START, ROT_START +
    2 ROT_HALF) rotated to the request's position pos_ptr[r] by the model's table (float32,
    rounded to Q_DTYPE)."""
    q = tl.load(q_ptr + q_off[:, None] + d[None, :], mask=mask, other=0.0)
    if ROPE:
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
        q = (q.to(tl.float32) * cos[None, :] + other.to(tl.float32) * sin[None, :]).to(Q_DTYPE)
    return q
