"""Torch twins of the Zipage kernels: the specification, in plain torch.

Every Triton op in this package has a twin here with the same signature
(style guide section 4). The twins are slow and memory hungry on purpose:
they say what the op computes, nothing more. `SGLANG_ZIPAGE_KERNELS=ref`
routes every call to them.

Shared names:
    L       layers handled by one call
    R       requests
    W       query-window length (decode steps kept per request)
    Hq/Hkv  query / KV heads, G = Hq // Hkv (query head q reads KV head q // G)
    D       head dim
    S_max   padded number of compressible tokens per request
    K       tokens kept per (layer, request, KV head)
"""

from __future__ import annotations

from typing import NamedTuple, Optional, Sequence, Tuple

import torch


class Rope(NamedTuple):
    """Rotate pre-RoPE queries to each request's position before scoring them (the
    calibrated scorer's queries). Dims [start, start + R) of a query rotate as the model
    rotates them: cos_sin [P, R] is the model's table (cos half, then sin half, any float
    dtype); positions [R] int64 on the queries' device, each < P; ``neox`` pairs dim i with
    i + R/2, else 2i with 2i + 1."""
    cos_sin: torch.Tensor
    positions: torch.Tensor
    start: int
    neox: bool


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, neox: bool, start: int = 0,
           inverse: bool = False) -> torch.Tensor:
    """RoPE of x [..., D] by cos, sin [..., R/2] (broadcast) over dims [start, start + R),
    in float32 (float64 stays), or its inverse (a table scaled by m, as YaRN's mscale, is
    undone by 1/m)."""
    dt = torch.promote_types(x.dtype, torch.float32)
    x, cos, sin = x.to(dt), cos.to(dt), sin.to(dt)
    half = cos.shape[-1]
    part = x[..., start:start + 2 * half]
    a, b = (part[..., :half], part[..., half:]) if neox else (part[..., 0::2], part[..., 1::2])
    if inverse:
        norm = cos * cos + sin * sin
        cos, sin = cos / norm, -sin / norm
    ra, rb = a * cos - b * sin, b * cos + a * sin
    rotated = torch.cat([ra, rb], -1) if neox else torch.stack([ra, rb], -1).flatten(-2)
    return torch.cat([x[..., :start], rotated, x[..., start + 2 * half:]], -1)


def rope_queries(q: torch.Tensor, rope: Rope) -> torch.Tensor:
    """q [L, R, W, Hq, D] pre-RoPE -> rotated to rope.positions[r], in q's dtype."""
    table = rope.cos_sin[rope.positions]  # [R, R_dims]
    half = table.shape[-1] // 2
    cos, sin = table[:, None, None, :half], table[:, None, None, half:]
    return rotate(q, cos, sin, rope.neox, rope.start).to(q.dtype)


def window_attention_scores_ref(
    q_window: torch.Tensor,
    k_buffers: Sequence[torch.Tensor],
    src_slots: torch.Tensor,
    src_lens: torch.Tensor,
    sm_scale: float,
    key_dtype: Optional[torch.dtype] = None,
    key_scales: Optional[torch.Tensor] = None,
    rope: Optional[Rope] = None,
) -> torch.Tensor:
    """Attention that the last W queries pay to each compressible token.

    Args:
        q_window: [L, R, W, Hq, D] model dtype, post-RoPE queries.
        k_buffers: L tensors [slots, Hkv, D]; q_window[l] reads k_buffers[l]. The model
            dtype, or uint8 holding key_dtype (FP8 KV, as SGLang stores it).
        src_slots: [R, S_max] int64 slot ids in sequence order; index >= src_lens[r] is padding.
        src_lens: [R] int32/int64, 1 <= src_lens[r] <= S_max.
        sm_scale: logit scale (usually D ** -0.5).
        key_dtype: None, or the FP8 type (float8_e4m3fn / float8_e5m2) of uint8 keys.
        key_scales: None, or [L] float32: key = stored * key_scales[l] (FP8 k_scale).
        rope: None, or (Rope) the queries are pre-RoPE: each request's rows are rotated to
            its position first (float32, rounded to the query dtype); q_window may then be
            an expanded view, stride 0 over requests.

    Returns:
        [L, R, Hkv, S_max] float32. For each query (w, q-head): softmax over the
        src_lens[r] keys of q.k * sm_scale in fp32; max over the G query heads of a
        KV group; mean over the W queries. Padding entries are 0.
    """
    if rope is not None:
        q_window = rope_queries(q_window, rope)
    n_layers, n_req, w, hq, d = q_window.shape
    s_max = src_slots.shape[1]
    pos = torch.arange(s_max, device=src_slots.device)
    valid = pos[None, :] < src_lens.to(pos.device)[:, None]  # [R, S_max]
    out = []
    for layer in range(n_layers):
        k = dequantize_keys(k_buffers[layer][src_slots], key_dtype, key_scales, layer)  # [R, S, Hkv, D]
        k = k.to(q_window.dtype).float()  # the kernel dots keys in the query dtype
        hkv = k.shape[2]
        q = q_window[layer].float().view(n_req, w, hkv, hq // hkv, d)
        logits = torch.einsum("rwhgd,rshd->rhwgs", q, k) * sm_scale
        logits = logits.masked_fill(~valid[:, None, None, None, :], float("-inf"))
        probs = torch.softmax(logits, dim=-1)
        score = probs.amax(dim=3).mean(dim=2)  # [R, Hkv, S]
        out.append(score.masked_fill(~valid[:, None, :], 0.0))
    return torch.stack(out)


def global_scores_ref(
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
    """Pooling, decay and protection of window scores: (final, g).

    Args:
        attention: [L, R, Hkv, S_max] float32 window scores (0 at padding).
        score_buffers: L tensors [slots, Hkv] float32 of stored global scores, or None.
        src_slots: [R, S_max] int64 slot ids in sequence order (padding past src_lens).
        src_lens: [R] int32/int64, 1 <= src_lens[r] <= S_max.
        n_stored: [R] int: positions < n_stored[r] have a valid stored score.
        first: [R] bool: the request's first compaction (pooling applies only then).
        pooling: odd max-pool kernel (1: none); decay: 0 ignores the stored scores.
        sink, window: the first `sink` and last `window` valid positions are protected.

    Returns:
        g: where first[r], the max-pool (kernel `pooling`, stride 1) of the row over its
            valid positions (0 at padding), else the row; then max(., decay * stored),
            stored = score_buffers[l][src_slots[r, s], h] for s < min(n_stored[r],
            src_lens[r]) and 0 beyond. The global score, stored back for kept tokens.
        final: g with +inf at protected positions and -inf at padding (what top-k ranks).
    """
    valid = valid_positions(src_lens, attention.shape[-1])
    a = attention
    if pooling > 1:
        mask = valid[None, :, None, :]
        x = attention.masked_fill(~mask, float("-inf"))
        pooled = torch.nn.functional.max_pool1d(x.reshape(-1, 1, x.shape[-1]), pooling, stride=1,
                                                padding=pooling // 2)
        pooled = pooled.view_as(x).masked_fill(~mask, 0.0)
        a = torch.where(first[None, :, None, None], pooled, attention)
    g = a
    if score_buffers is not None and decay != 0:
        stored = torch.stack([buf[src_slots] for buf in score_buffers])  # [L, R, S, Hkv]
        stored = stored.permute(0, 1, 3, 2).float()
        has = valid_positions(torch.minimum(n_stored, src_lens), src_slots.shape[1])[None, :, None, :]
        stored = torch.where(has, stored, torch.zeros((), device=stored.device))
        g = torch.maximum(a, decay * stored)
    return protect_ref(g, src_lens, sink, window), g


def protect_ref(final: torch.Tensor, src_lens: torch.Tensor, sink: int, window: int) -> torch.Tensor:
    """[L, R, Hkv, S_max]: +inf for the first `sink` and last `window` valid positions of
    each request, -inf for padding, `final` elsewhere."""
    pos = torch.arange(final.shape[-1], device=final.device)[None, :]
    lens = src_lens[:, None]
    valid = valid_positions(src_lens, final.shape[-1])
    kept = valid & ((pos < sink) | (pos >= lens - window))
    final = final.masked_fill(kept[None, :, None, :], float("inf"))
    return final.masked_fill(~valid[None, :, None, :], float("-inf"))


def valid_positions(src_lens: torch.Tensor, s_max: int) -> torch.Tensor:
    """[R, S_max] bool: s < src_lens[r]."""
    return torch.arange(s_max, device=src_lens.device)[None, :] < src_lens[:, None]


def dequantize_keys(keys: torch.Tensor, key_dtype: Optional[torch.dtype],
                    key_scales: Optional[torch.Tensor], layer: int) -> torch.Tensor:
    """float32 keys: uint8 storage read as key_dtype (FP8) times key_scales[layer]."""
    if key_dtype is None:
        return keys.float()
    k = keys.view(key_dtype).float()
    return k if key_scales is None else k * key_scales[layer].to(k.device)


def compact_kv_ref(
    k_buffers: Sequence[torch.Tensor],
    v_buffers: Optional[Sequence[torch.Tensor]],
    score_buffers: Optional[Sequence[torch.Tensor]],
    src_slots: torch.Tensor,
    keep: torch.Tensor,
    dst_slots: torch.Tensor,
    kept_scores: Optional[torch.Tensor],
) -> None:
    """Move each head's kept tokens into the destination slots, in place.

    Args:
        k_buffers, v_buffers: L tensors [slots, Hkv, D] (any dtype), modified in place;
            v_buffers None when the key row holds the value too (MLA's latent row).
        score_buffers: L tensors [slots, Hkv] float32, or None.
        src_slots: [R, S_max] int64 slot ids of the compressible tokens.
        keep: [L, R, Hkv, K] int64, distinct per row, values in [0, src_lens[r]).
        dst_slots: [R, K] int64 destination slots (may equal src_slots[:, :K]).
        kept_scores: [L, R, Hkv, K] float32 or None; written to score_buffers when both given.

    Semantics: all reads happen before all writes. For every l, r, h, j:
        buf[l][dst_slots[r, j], h] = OLD buf[l][src_slots[r, keep[l, r, h, j]], h]
    """
    n_layers, n_req, hkv, k_keep = keep.shape
    heads = torch.arange(hkv, device=keep.device)[None, :, None]  # [1, Hkv, 1]
    dst = dst_slots[:, None, :].expand(n_req, hkv, k_keep)  # [R, Hkv, K]
    for layer in range(n_layers):
        src = torch.gather(
            src_slots[:, None, :].expand(n_req, hkv, -1), 2, keep[layer]
        )  # [R, Hkv, K] slot ids
        for buf in (k_buffers[layer],) + ((v_buffers[layer],) if v_buffers is not None else ()):
            rows = buf[src, heads].clone()  # gather all ...
            buf[dst, heads] = rows  # ... then scatter
        if score_buffers is not None and kept_scores is not None:
            score_buffers[layer][dst, heads] = kept_scores[layer]


def select_topk(scores: torch.Tensor, k: int) -> torch.Tensor:
    """Positions of the k best tokens per (layer, request, KV head), ascending.

    Args:
        scores: [L, R, Hkv, S_max] float32; padding = -inf, protected tokens = +inf.
        k: tokens to keep, 1 <= k <= S_max. The caller makes k <= min(src_lens), or
            padding positions get selected; if more than k tokens are +inf, which of
            them survive is unspecified.

    Returns:
        keep: [L, R, Hkv, k] int64, strictly ascending per row.
    """
    if not 1 <= k <= scores.shape[-1]:
        raise ValueError(f"select_topk: k={k} must be in [1, {scores.shape[-1]}]")
    idx = torch.topk(scores, k, dim=-1, sorted=False).indices
    return torch.sort(idx, dim=-1).values
