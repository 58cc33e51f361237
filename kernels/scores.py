"""Window attention scores: the attention the last W queries pay to each token.

Two launches cover every layer, request and KV head; K is read through the
slot list and never gathered into a copy.

  pass 1 `_window_lse_kernel`, grid (L*R*Hkv, n_splits, n_gchunks): for each query
      row (g, w) of GC heads of a KV group, the running max m and sum l of exp2
      over the keys of one split of the sequence (online softmax, base 2).
  pass 2 `_window_probs_kernel`, grid (L*R*Hkv, cdiv(S_max, BLOCK_S)): merges the
      split partials into a log-sum-exp per row, recomputes the logits of one
      key block, and reduces p = exp2(x - lse) with max over the G heads of the
      group, then mean over the W queries.

Query rows are laid out g-major: row = g * WP + w, padded to WP = pow2 >= 16
(tl.dot needs 16 rows); a program of pass 1 takes WPC = min(WP, 64) queries of GC heads
(GC * WPC <= 64 rows where the group allows), so a wide group (MLA: every query head
shares one latent KV head) or many queries are split over programs, not one huge tile. Padded rows load q = 0,
which keeps every number finite; they are dropped before the output is written.
The head dim is walked in NUM_D chunks of BLOCK_D (one chunk up to 128: MHA; five
for MLA's 576-wide latent rows), the logits summed over chunks.
FP8 KV is stored as uint8: KEY_FP8 1 (e4m3) / 2 (e5m2) bitcasts it, multiplies by the
layer's k_scale and rounds to the query dtype before the dot.
Pass 2 walks the W queries in chunks of at most WC = 16 rows, so its tiles stay the same
size for any W (the calibrated scorer's K queries per head): its cost grows with W, its
registers do not.
Pre-RoPE queries (the calibrated scorer's, kernels.Rope) are rotated to each request's
position first (rope.rotate_queries: a copy the size of the window's gathered rows).
Twin: reference.window_attention_scores_ref.
"""

from __future__ import annotations

from typing import Optional, Sequence

import torch
import triton.language as tl

from sglang_zipage.kernels.reference import Rope
from sglang_zipage.kernels.rope import rotate_queries
from sglang_zipage.kernels.utils import (
    FP8_CODES,
    cdiv,
    check_window_inputs,
    jit_helper,
    layer_ptr_table,
    lazy_jit,
    next_pow2,
    num_sms,
    triton_dtype,
)

_LOG2E = 1.4426950408889634
MAX_BLOCK_D = 128  # head-dim chunk: larger rows (MLA 576) are walked in chunks
MAX_SPLITS = 16  # pass-1 splits of a row (a power of two >= 2: pass 2's tile)


@jit_helper
def _key_tile(k_base, slot, stride_ks, h, stride_kh, d, mask, k_scale,
              KEY_FP8: tl.constexpr, Q_DTYPE: tl.constexpr):
    """Keys of one block of slots x dims d in the query dtype: FP8 ones (uint8) bitcast,
    scaled by the layer's k_scale and rounded, as the twin reads them."""
    k = tl.load(k_base + slot[:, None] * stride_ks + h * stride_kh + d[None, :], mask=mask,
                other=0)
    if KEY_FP8 == 1:
        k = (k.to(tl.float8e4nv, bitcast=True).to(tl.float32) * k_scale).to(Q_DTYPE)
    elif KEY_FP8 == 2:
        k = (k.to(tl.float8e5, bitcast=True).to(tl.float32) * k_scale).to(Q_DTYPE)
    return k


@lazy_jit(batch_args=("R", "chunks_per_split", "n_splits"))
def _window_lse_kernel(
    q_ptr, k_table, scale_ptr, src_slots_ptr, src_lens_ptr, m_ptr, l_ptr,
    R, chunks_per_split, n_splits,
    stride_ql, stride_qr, stride_qw, stride_qh,
    stride_ks, stride_kh, stride_src_r,
    qk_scale,
    W: tl.constexpr, G: tl.constexpr, HKV: tl.constexpr, WP: tl.constexpr,
    GP: tl.constexpr, GC: tl.constexpr, WPC: tl.constexpr, D: tl.constexpr,
    BLOCK_D: tl.constexpr, NUM_D: tl.constexpr, BLOCK_S: tl.constexpr,
    KV_DTYPE: tl.constexpr, PRECISION: tl.constexpr,
    KEY_FP8: tl.constexpr, Q_DTYPE: tl.constexpr,
):
    pid = tl.program_id(0)
    split = tl.program_id(1)
    gchunk = tl.program_id(2) // (WP // WPC)  # GC heads x WPC queries per program
    wchunk = tl.program_id(2) % (WP // WPC)
    h = pid % HKV
    r = (pid // HKV) % R
    layer = pid // (HKV * R)
    length = tl.load(src_lens_ptr + r).to(tl.int32)
    # One launch reads every layer: entry `layer` of the table is that layer's K base.
    # Torch allocations are >= 256-byte aligned; the hint keeps K loads 16-byte wide.
    k_base = tl.multiple_of(tl.load(k_table + layer).to(tl.pointer_type(KV_DTYPE)), 16)
    k_scale = 1.0
    if KEY_FP8:
        k_scale = tl.load(scale_ptr + layer)

    rows = tl.arange(0, WPC * GC)
    g = gchunk * GC + rows // WPC
    w = wchunk * WPC + rows % WPC
    row_ok = (g < G) & (w < W)
    q_off = layer.to(tl.int64) * stride_ql + r * stride_qr + w * stride_qw + (h * G + g) * stride_qh
    if NUM_D == 1:  # the whole head dim in one tile: load the queries once
        d = tl.arange(0, BLOCK_D)
        q = tl.load(q_ptr + q_off[:, None] + d[None, :],
                    mask=row_ok[:, None] & (d < D)[None, :], other=0.0)

    m_i = tl.full([WPC * GC], float("-inf"), tl.float32)
    l_i = tl.zeros([WPC * GC], tl.float32)
    c_begin = split * chunks_per_split
    c_end = tl.minimum(c_begin + chunks_per_split, (length + BLOCK_S - 1) // BLOCK_S)
    for c in range(c_begin, c_end):
        s = c * BLOCK_S + tl.arange(0, BLOCK_S)
        s_ok = s < length
        slot = tl.load(src_slots_ptr + r * stride_src_r + s, mask=s_ok, other=0)
        x = tl.zeros([WPC * GC, BLOCK_S], tl.float32)
        for dc in tl.static_range(NUM_D):
            d = dc * BLOCK_D + tl.arange(0, BLOCK_D)
            d_ok = d < D
            if NUM_D > 1:
                q = tl.load(q_ptr + q_off[:, None] + d[None, :],
                            mask=row_ok[:, None] & d_ok[None, :], other=0.0)
            k = _key_tile(k_base, slot, stride_ks, h, stride_kh, d, s_ok[:, None] & d_ok[None, :],
                          k_scale, KEY_FP8, Q_DTYPE)
            x += tl.dot(q, tl.trans(k), input_precision=PRECISION)
        x = tl.where(s_ok[None, :], x * qk_scale, float("-inf"))
        # Every visited block holds >= 1 valid key, so m_new is finite.
        m_new = tl.maximum(m_i, tl.max(x, 1))
        l_i = l_i * tl.exp2(m_i - m_new) + tl.sum(tl.exp2(x - m_new[:, None]), 1)
        m_i = m_new
    out = (pid * n_splits + split) * (WP * GP) + g * WP + w
    tl.store(m_ptr + out, m_i)
    tl.store(l_ptr + out, l_i)


@lazy_jit(batch_args=("R", "n_splits"))
def _window_probs_kernel(
    q_ptr, k_table, scale_ptr, src_slots_ptr, src_lens_ptr, m_ptr, l_ptr, out_ptr,
    R, S_max, n_splits,
    stride_ql, stride_qr, stride_qw, stride_qh,
    stride_ks, stride_kh, stride_src_r,
    qk_scale,
    W: tl.constexpr, G: tl.constexpr, HKV: tl.constexpr, WP: tl.constexpr, WC: tl.constexpr,
    GP: tl.constexpr, D: tl.constexpr, BLOCK_D: tl.constexpr, NUM_D: tl.constexpr,
    BLOCK_S: tl.constexpr, SPLITS_P: tl.constexpr,
    KV_DTYPE: tl.constexpr, PRECISION: tl.constexpr,
    KEY_FP8: tl.constexpr, Q_DTYPE: tl.constexpr,
):
    pid = tl.program_id(0)
    block = tl.program_id(1)
    h = pid % HKV
    r = (pid // HKV) % R
    layer = pid // (HKV * R)
    length = tl.load(src_lens_ptr + r).to(tl.int32)
    k_base = tl.multiple_of(tl.load(k_table + layer).to(tl.pointer_type(KV_DTYPE)), 16)
    k_scale = 1.0
    if KEY_FP8:
        k_scale = tl.load(scale_ptr + layer)

    s = block * BLOCK_S + tl.arange(0, BLOCK_S)
    s_ok = s < length
    slot = tl.load(src_slots_ptr + r * stride_src_r + s, mask=s_ok, other=0)
    if NUM_D == 1:  # the whole head dim in one tile: load the keys once for every head
        d = tl.arange(0, BLOCK_D)
        k = _key_tile(k_base, slot, stride_ks, h, stride_kh, d, s_ok[:, None] & (d < D)[None, :],
                      k_scale, KEY_FP8, Q_DTYPE)
    sp = tl.arange(0, SPLITS_P)
    sp_ok = (sp < n_splits)[:, None]
    score = tl.zeros([BLOCK_S], tl.float32)
    for wc in tl.static_range(0, W, WC):  # the queries in chunks of WC rows
        w = wc + tl.arange(0, WC)
        w_ok = w < W
        part = (pid * n_splits + sp[:, None]) * (WP * GP) + w[None, :]  # [SPLITS_P, WC]
        q_row = layer.to(tl.int64) * stride_ql + r * stride_qr + w * stride_qw
        best = tl.zeros([WC, BLOCK_S], tl.float32)
        for g in range(G):
            m_p = tl.load(m_ptr + part + g * WP, mask=sp_ok, other=float("-inf"))
            l_p = tl.load(l_ptr + part + g * WP, mask=sp_ok, other=0.0)
            m_max = tl.max(m_p, 0)  # split 0 always holds key 0: finite
            lse = m_max + tl.log2(tl.sum(l_p * tl.exp2(m_p - m_max[None, :]), 0))
            x = tl.zeros([WC, BLOCK_S], tl.float32)
            for dc in tl.static_range(NUM_D):
                d = dc * BLOCK_D + tl.arange(0, BLOCK_D)
                d_ok = d < D
                q = tl.load(q_ptr + q_row[:, None] + (h * G + g) * stride_qh + d[None, :],
                            mask=w_ok[:, None] & d_ok[None, :], other=0.0)
                if NUM_D > 1:
                    k = _key_tile(k_base, slot, stride_ks, h, stride_kh, d,
                                  s_ok[:, None] & d_ok[None, :], k_scale, KEY_FP8, Q_DTYPE)
                x += tl.dot(q, tl.trans(k), input_precision=PRECISION)
            best = tl.maximum(best, tl.exp2(x * qk_scale - lse[:, None]))  # max over the group
        score += tl.sum(tl.where(w_ok[:, None], best, 0.0), 0)
    score = tl.where(s_ok, score / W, 0.0)  # mean over the window
    tl.store(out_ptr + pid.to(tl.int64) * S_max + s, score, mask=s < S_max)


# (BLOCK_S, num_warps) of each pass, keyed by whether its tile has <= 64 query rows (pass 1:
# WPC * GC, always since it walks W in chunks; pass 2: WC * G, 16 queries of the group's
# heads). The <= 64 entries are the fastest of the sweep in benchmarks/bench_kernels.py on an
# H200 (Qwen3-8B dims, G=4); the others are unmeasured.
TUNING = {
    ("lse", True): (64, 4),
    ("lse", False): (64, 8),
    ("probs", True): (128, 4),
    ("probs", False): (64, 8),
}


def window_attention_scores(
    q_window: torch.Tensor,
    k_buffers: Sequence[torch.Tensor],
    src_slots: torch.Tensor,
    src_lens: torch.Tensor,
    sm_scale: float,
    key_dtype: Optional[torch.dtype] = None,
    key_scales: Optional[torch.Tensor] = None,
    rope: Optional[Rope] = None,
    *,
    config: Optional[dict] = None,
) -> torch.Tensor:
    """Triton op of reference.window_attention_scores_ref (same contract).

    Args:
        q_window: [L, R, W, Hq, D] fp16/bf16/fp32, last dim contiguous, post-RoPE.
        k_buffers: L tensors [slots, Hkv, D], the dtype of q_window, or uint8 holding
            key_dtype (FP8 KV); all layers share shape and strides.
        src_slots: [R, S_max] int64, contiguous rows; entries >= src_lens[r] are
            padding and never read as keys.
        src_lens: [R] int32/int64 with 1 <= src_lens[r] <= S_max (not checked on the
            device: a 0 length gives NaN for that request).
        sm_scale: float logit scale.
        key_dtype: None, or torch.float8_e4m3fn / float8_e5m2 for uint8 keys.
        key_scales: [L] float32 (FP8 k_scale per layer), or None (1).
        rope: None, or pre-RoPE queries (q_window may be expanded over requests, stride 0),
            rotated to rope.positions[r] first (rope.rotate_queries).
        config: launch tuning only: {"lse": (BLOCK_S, num_warps), "probs": (...),
            "n_splits": int}; missing keys use TUNING and a split heuristic.

    Returns:
        [L, R, Hkv, S_max] float32; softmax over keys in fp32, max over the G query
        heads of each KV group, mean over W; padding entries are 0.
    """
    check_window_inputs(q_window, k_buffers, src_slots, src_lens, key_dtype, key_scales, rope)
    n_layers, n_req, w, hq, d = q_window.shape
    device = q_window.device
    hkv = k_buffers[0].shape[1]
    s_max = src_slots.shape[1]
    out = torch.empty(n_layers, n_req, hkv, s_max, dtype=torch.float32, device=device)
    if out.numel() == 0:
        return out

    config = config or {}
    if rope is not None:  # pre-RoPE rows: rotated to each request's position, once
        q_window = rotate_queries(q_window, rope)
    g = hq // hkv
    wp = max(16, next_pow2(w))
    wpc = min(wp, 64)  # queries per pass-1 program ...
    gc = min(next_pow2(g), max(1, 64 // wpc))  # ... of this many heads: <= 64 rows
    n_gchunks = cdiv(g, gc)
    n_programs = n_gchunks * (wp // wpc)
    gp = n_gchunks * gc  # rows of a group in the partials, padded
    wc = min(wp, 16)  # queries per pass-2 chunk
    block_d = min(max(16, next_pow2(d)), MAX_BLOCK_D)
    num_d = cdiv(d, block_d)
    lse_block, lse_warps = config.get("lse", TUNING[("lse", wpc * gc <= 64)])
    probs_block, probs_warps = config.get("probs", TUNING[("probs", wc * next_pow2(g) <= 64)])
    # Rows wider than one head-dim block (MLA's 576): without software pipelining and with
    # 32-key blocks, so a program's shared memory holds one chunk of q and k at a time (the
    # pipelined 64-key version asks for more than the H200's 227 KiB in bf16).
    wide = dict(num_stages=1) if num_d > 1 else {}
    if num_d > 1 and "lse" not in config:
        lse_block = probs_block = 32
    lrh = n_layers * n_req * hkv
    n_chunks = cdiv(s_max, lse_block)
    # Enough pass-1 programs to fill the GPU about 4 times over, at most MAX_SPLITS (pass 2
    # reads MAX_SPLITS partials, masked: one compiled variant for every batch).
    n_splits = config.get("n_splits") or cdiv(4 * num_sms(device), lrh * n_programs)
    n_splits = max(1, min(n_splits, n_chunks, MAX_SPLITS))
    chunks_per_split = cdiv(n_chunks, n_splits)
    n_splits = cdiv(n_chunks, chunks_per_split)
    m_part = torch.empty(lrh, n_splits, wp * gp, dtype=torch.float32, device=device)
    l_part = torch.empty_like(m_part)
    table = layer_ptr_table(k_buffers)
    scales = key_scales if key_scales is not None else out  # read only with FP8 keys
    k0 = k_buffers[0]
    common = dict(
        stride_ql=q_window.stride(0), stride_qr=q_window.stride(1),
        stride_qw=q_window.stride(2), stride_qh=q_window.stride(3),
        stride_ks=k0.stride(0), stride_kh=k0.stride(1), stride_src_r=src_slots.stride(0),
        qk_scale=float(sm_scale) * _LOG2E,
        W=w, G=g, HKV=hkv, WP=wp, GP=gp, D=d, BLOCK_D=block_d, NUM_D=num_d,
        KV_DTYPE=triton_dtype(k0.dtype),
        # fp32 inputs: exact fp32 products rather than the TF32 default of tl.dot.
        PRECISION="ieee" if q_window.dtype == torch.float32 else "tf32",
        KEY_FP8=FP8_CODES.get(key_dtype, 0), Q_DTYPE=triton_dtype(q_window.dtype),
    )
    _window_lse_kernel[(lrh, n_splits, n_programs)](
        q_window, table, scales, src_slots, src_lens, m_part, l_part,
        n_req, chunks_per_split, n_splits, GC=gc, WPC=wpc, BLOCK_S=lse_block,
        num_warps=lse_warps, **wide, **common,
    )
    _window_probs_kernel[(lrh, cdiv(s_max, probs_block))](
        q_window, table, scales, src_slots, src_lens, m_part, l_part, out,
        n_req, s_max, n_splits, WC=wc, SPLITS_P=MAX_SPLITS,
        BLOCK_S=probs_block, num_warps=probs_warps, **wide, **common,
    )
    return out
