"""Selection: score every compressible token, then choose the tokens to keep.

One function per stage; `score_tokens` chains them. All tensors are indexed
[L, R, Hkv, S_max] (layer, request, KV head, position in the request's
compressible range); position s of request r is valid when s < src_lens[r].

Stages, exactly:
  1. attention  a = window_attention_scores(...): for each of the last W queries and
     each query head, softmax over the valid keys of q.k * sm_scale; max over the G
     query heads of the KV group; mean over the W queries. Padding: 0.
  2. pooling    where first[r]: a[s] = max(a[s-p//2 .. s+p//2] over valid positions)
     (max-pool, kernel p = params.pooling, stride 1). Skipped when p == 1.
  3. decay      g = max(a, decay * stored), stored = score_buffers[l][src_slots[r, s], h]
     for s < n_stored[r], else 0 (newer tokens' score slots hold garbage).
     Skipped (g = a) when decay == 0 or score_buffers is None. g is the global
     score: the caller stores g of the kept tokens back through compact_kv.
  4. redundancy (optional) keys e = k / |k| (fp32). mean_sim[s] = mean of e[s].e[t]
     over the other valid tokens t != s: all of them ("full") or those in the same
     block of lightning_block positions ("lightning"); 0 when there is none.
     red = softmax over valid s of mean_sim / tau. final = lambda * g - (1 - lambda) * red.
     With redundancy "none", final = g.
  5. protect    the first `sink` valid tokens and the last `window` valid tokens get
     +inf; padding gets -inf.
Stages 2, 3 and 5 run as one kernel (kernels.global_scores), whose protected output is
final when there is no redundancy term and no control selection.
Then select_topk keeps the k best positions per (layer, request, KV head), and
in_place_order arranges them so that compacting in place moves few rows (the recent
window stays last, in order).
Imports torch and sglang_zipage.kernels only.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple, Optional, Sequence, Tuple

import torch
import torch.nn.functional as F

from sglang_zipage.config import ZipageConfig, scoring_problems
from sglang_zipage.kv_layout.base import LayerKV
from sglang_zipage.kernels import (compact_kv, global_scores, protect_ref, select_topk,
                                   window_attention_scores)
from sglang_zipage.kernels.reference import Rope, dequantize_keys, valid_positions

_DEFAULT = ZipageConfig()  # the settings' defaults live in config.py


class Queries(NamedTuple):
    """What scores a compaction's tokens: rows [L, R, W, Hq, D] in the model dtype (D: the
    stored width; kv.absorb turns MLA's compact rows into absorbed queries). The window
    scorer's are its requests' last W post-RoPE decode queries (rope None); the calibrated
    scorer's are the same pre-RoPE rows for every request (an expanded view), which
    ``rope`` rotates to each request's next position inside the kernel."""

    rows: torch.Tensor
    rope: Optional[Rope] = None


@dataclass(frozen=True)
class ScoringParams:
    """The selection settings of ZipageConfig (``from_config``), plus lightning's block."""

    window: int = _DEFAULT.window  # W: recent tokens always kept (and queries in the window)
    decay: float = _DEFAULT.decay  # global-score decay; 0 disables the global score
    redundancy: str = _DEFAULT.redundancy  # "none" | "full" | "lightning"
    redundancy_lambda: float = _DEFAULT.redundancy_lambda  # lambda: weight of g against redundancy
    redundancy_tau: float = _DEFAULT.redundancy_tau  # tau: softmax temperature of redundancy
    pooling: int = _DEFAULT.pooling  # max-pool kernel on the first compaction; 1 disables; odd
    sink: int = _DEFAULT.sink  # first tokens of the compressible range always kept
    lightning_block: int = 64  # block length (tokens) of "lightning" redundancy
    selection: str = _DEFAULT.selection  # "score" | controls that ignore the score: "random", "recent"

    def __post_init__(self):
        problems = scoring_problems(self, least_window=0)
        if self.lightning_block < 1:
            problems.append(("lightning_block", f"must be >= 1, got {self.lightning_block}"))
        if problems:
            raise ValueError("; ".join(f"{name}: {what}" for name, what in problems))

    @classmethod
    def from_config(cls, config: ZipageConfig) -> "ScoringParams":
        return cls(window=config.window, decay=config.decay, redundancy=config.redundancy,
                   redundancy_lambda=config.redundancy_lambda,
                   redundancy_tau=config.redundancy_tau, pooling=config.pooling,
                   sink=config.sink, selection=config.selection)


def absorb_queries(q: torch.Tensor, weight: torch.Tensor, scale, rope_dim: int) -> torch.Tensor:
    """q: [..., Hq, nope + rope] stored queries of one layer -> [..., Hq, kv_lora_rank + rope],
    the absorbed queries MLA decode attention scores the latent rows with."""
    *lead, heads, _ = q.shape
    nope = q[..., :-rope_dim].reshape(-1, heads, q.shape[-1] - rope_dim).transpose(0, 1)
    w = weight.to(q.dtype) if weight.dtype != q.dtype else weight
    if not (isinstance(scale, (int, float)) and scale == 1):
        w = w * scale
    absorbed = torch.bmm(nope, w).transpose(0, 1)  # [tokens, Hq, kv_lora_rank]
    return torch.cat([absorbed.reshape(*lead, heads, -1), q[..., -rope_dim:]], dim=-1)


ABSORB_SCRATCH_BYTES = 64 << 20  # absorbed queries held at once (MLA: layers per launch)


def attention_scores(queries: Queries, kv: LayerKV, src_slots: torch.Tensor,
                     src_lens: torch.Tensor, sm_scale: float) -> torch.Tensor:
    """Stage 1 over the scored layers: [L, R, Hkv, S_max]. A compact MLA window is absorbed
    a few layers at a time, so the absorbed copy stays within ABSORB_SCRATCH_BYTES; calibrated
    rows, the same for every request, are absorbed once and expanded (their rope part moves
    to the end of the latent row), and their rotated copies stay within it too."""
    rows, rope = queries
    if kv.absorb is None:
        return window_attention_scores(rows, kv.keys, src_slots, src_lens, sm_scale,
                                       kv.key_dtype, kv.key_scales, rope)
    n_layers, n_req = rows.shape[:2]
    width = kv.keys[0].shape[-1]
    if rope is not None:
        rows, rope = rows[:, :1], rope._replace(start=width - kv.absorb.rope_dim)
    per_layer = rows[0].numel() // rows.shape[-1] * width * rows.element_size()
    if rope is not None:  # rotated per request: a copy for each (kernels.rotate_queries)
        per_layer *= n_req
    step = max(1, ABSORB_SCRATCH_BYTES // max(1, per_layer))
    out = []
    for lo in range(0, n_layers, step):
        hi = min(n_layers, lo + step)
        q = torch.stack([absorb_queries(rows[l], *kv.absorb.weights[l], kv.absorb.rope_dim)
                         for l in range(lo, hi)])
        if rope is not None:
            q = q.expand(-1, n_req, -1, -1, -1)
        scales = kv.key_scales[lo:hi] if kv.key_scales is not None else None
        out.append(window_attention_scores(q, kv.keys[lo:hi], src_slots, src_lens, sm_scale,
                                           kv.key_dtype, scales, rope))
    return torch.cat(out) if len(out) > 1 else out[0]


def mean_key_similarity(keys: torch.Tensor, valid: torch.Tensor, block: Optional[int]) -> torch.Tensor:
    """Mean cosine similarity of each valid key to the other valid keys.

    keys: [R, Hkv, S, D]; valid: [R, S] bool; block: None (all pairs) or the block
    length (pairs inside a block only). Returns [R, Hkv, S] float32, 0 at padding.
    Uses sum_t e_s.e_t = e_s.(sum_t e_t), so no S x S matrix is built.
    """
    e = F.normalize(keys.float(), dim=-1) * valid[:, None, :, None]
    n_req, hkv, s_max, d = e.shape
    span = s_max if block is None else block
    n_blocks = -(-s_max // span)
    pad = n_blocks * span - s_max
    e_b = F.pad(e, (0, 0, 0, pad)).view(n_req, hkv, n_blocks, span, d)
    count = F.pad(valid, (0, pad)).view(n_req, 1, n_blocks, span).sum(-1, keepdim=True)
    total = e_b.sum(dim=3, keepdim=True)  # [R, Hkv, nb, 1, D]
    sim_sum = (e_b * total).sum(-1) - (e_b * e_b).sum(-1)  # drop self-similarity
    mean = sim_sum / (count - 1).clamp(min=1)
    return mean.view(n_req, hkv, -1)[..., :s_max]


def redundancy(
    kv: LayerKV, src_slots: torch.Tensor, valid: torch.Tensor, params: ScoringParams
) -> torch.Tensor:
    """Stage 4a: [L, R, Hkv, S_max] softmax over valid tokens of mean_sim / tau.
    (Cosine similarity ignores a key's scale: FP8 keys need no k_scale here.)"""
    block = params.lightning_block if params.redundancy == "lightning" else None
    out = []
    for buf in kv.keys:  # one layer at a time bounds the fp32 key copy
        keys = dequantize_keys(buf[src_slots], kv.key_dtype, None, 0).permute(0, 2, 1, 3)  # [R, Hkv, S, D]
        sim = mean_key_similarity(keys, valid, block) / params.redundancy_tau
        sim = sim.masked_fill(~valid[:, None, :], float("-inf"))
        out.append(torch.softmax(sim, dim=-1))
    return torch.stack(out)


def score_tokens(
    params: ScoringParams,
    queries: Optional[Queries],
    kv: LayerKV,
    score_buffers: Optional[Sequence[torch.Tensor]],
    src_slots: torch.Tensor,
    src_lens: torch.Tensor,
    n_stored: torch.Tensor,
    first: torch.Tensor,
    sm_scale: float,
) -> Tuple[torch.Tensor, torch.Tensor]:
    """Score the compressible tokens of R requests over L layers.

    Args:
        params: ScoringParams.
        queries: Queries (the window's or the calibrated scorer's), or None: no queries (a
            compaction without a window slot), attention 0.
        kv: LayerKV; its L scored layers' keys are read.
        score_buffers: L tensors [slots, Hkv] float32 of stored global scores, or None.
        src_slots: [R, S_max] int64 slot ids in sequence order (padding past src_lens).
        src_lens: [R] int32/int64, 1 <= src_lens[r] <= S_max.
        n_stored: [R] int: positions < n_stored[r] have a valid stored global score.
        first: [R] bool: the request's first compaction (pooling applies only then).
        sm_scale: logit scale.

    Returns:
        (final, global_score), both [L, R, Hkv, S_max] float32. final is what
        select_topk ranks (+inf protected, -inf padding); global_score is g, to be
        stored for kept tokens.
    """
    if queries is None:  # compacted without a window (memory.py): no attention term
        attention = torch.zeros((len(kv.keys), *src_slots.shape[:1], kv.keys[0].shape[1],
                                 src_slots.shape[1]), dtype=torch.float32, device=src_slots.device)
    else:
        attention = attention_scores(queries, kv, src_slots, src_lens, sm_scale)
    # stages 2, 3 and 5 in one pass (the kernel's final is g, protected)
    final, g = global_scores(attention, score_buffers, src_slots, src_lens, n_stored, first,
                             params.pooling, params.decay, params.sink, params.window)
    if params.redundancy == "none" and params.selection == "score":
        return final, g
    final = g
    if params.redundancy != "none":
        red = redundancy(kv, src_slots, valid_positions(src_lens, src_slots.shape[1]), params)
        final = params.redundancy_lambda * g - (1 - params.redundancy_lambda) * red
    if params.selection != "score":
        final = control_scores(final, params.selection)
    return protect_ref(final, src_lens, params.sink, params.window), g


def control_scores(final: torch.Tensor, selection: str) -> torch.Tensor:
    """Baselines with the same budget and protection: uniform random ranks ("random"),
    or the position itself, so the most recent tokens win ("recent")."""
    if selection == "random":
        return torch.rand_like(final)
    pos = torch.arange(final.shape[-1], device=final.device, dtype=final.dtype)
    return pos.expand_as(final).clone()


def newest(src_lens: torch.Tensor, k: int) -> torch.Tensor:
    """keep [1, R, 1, k] int64: the last k valid positions of every request, ascending
    (what a sliding-window layer reads, in the order it reads it), for every layer and head."""
    pos = src_lens[:, None] - k + torch.arange(k, device=src_lens.device)[None, :]
    return pos.to(torch.int64)[None, :, None, :]


def in_place_order(keep: torch.Tensor, tail: int) -> torch.Tensor:
    """Arrange an ascending keep [..., k] so that an in-place compaction moves few rows.

    The last ``tail`` entries (the recent window) stay last, in order, so the next
    compaction finds the newest tokens at the end again. Of the first m = k - tail
    entries, a kept position p < m stays at p; the kept positions >= m fill, in ascending
    order, the positions < m that were evicted. A compaction from suffix S down to k then
    moves about (S - k) + tail rows per head instead of k. The result holds the same set
    and keeps out[j] >= j, what compact_kv needs to compact in place.
    """
    k = keep.shape[-1]
    m = k - tail
    if m <= 0:
        return keep
    head = keep[..., :m]
    stay = head < m  # a prefix of each row (ascending)
    n_stay = stay.sum(-1, keepdim=True)
    occupied = torch.zeros((*head.shape[:-1], m + 1), dtype=torch.bool, device=keep.device)
    occupied.scatter_(-1, torch.where(stay, head, m), True)
    hole = ~occupied[..., :m]
    rank = hole.cumsum(-1) - 1  # the r-th hole of a row takes its r-th filler
    filler = head.gather(-1, (n_stay + rank).clamp_(0, m - 1))
    pos = torch.arange(m, device=keep.device).expand_as(head)
    return torch.cat([torch.where(hole, filler, pos), keep[..., m:]], dim=-1)


def select_and_compact(
    params: ScoringParams,
    queries: Optional[Queries],
    kv: LayerKV,
    score_buffers: Optional[Sequence[torch.Tensor]],
    src_slots: torch.Tensor,
    src_lens: torch.Tensor,
    n_stored: torch.Tensor,
    first: torch.Tensor,
    sm_scale: float,
    dst_slots: torch.Tensor,
    k: int,
    followers: Sequence[LayerKV] = (),
) -> torch.Tensor:
    """score_tokens + select_topk + compact_kv. Returns keep [L, R, Hkv, k] int64: the
    position that dst_slots[r, j] of each head now holds, in ``in_place_order``; ascending
    where a later compaction reads meaning from positions: the "recent" control (recency)
    and "lightning" redundancy (its blocks are runs of neighbouring positions).

    dst_slots: [R, k] int64 (see compact_kv); k <= min(src_lens). After the call,
    score_buffers (if given) hold g of the kept tokens at dst_slots; kv's recent layers
    hold their newest k tokens, in order; each follower (a pool at the same slots that is
    not scored: a speculative draft's) holds the ``consensus`` tokens in all its layers
    and heads.
    """
    final, g = score_tokens(
        params, queries, kv, score_buffers, src_slots, src_lens, n_stored, first, sm_scale
    )
    keep = select_topk(final, k)
    if params.selection != "recent" and params.redundancy != "lightning":
        keep = in_place_order(keep, min(params.window, k))
    kept_scores = torch.gather(g, -1, keep) if score_buffers is not None else None
    compact_kv(kv.keys, kv.values, score_buffers, src_slots, keep, dst_slots, kept_scores)
    recent = newest(src_lens, k)
    moves = [(kv.recent_keys, kv.recent_values, recent)]
    if followers:
        agreed = consensus(final, k, min(params.window, k))
        moves += [move for f in followers for move in ((f.keys, f.values, agreed),
                                                       (f.recent_keys, f.recent_values, recent))]
    for keys, values, kept in moves:  # the same token set in every layer and head
        if keys:
            kept = kept.expand(len(keys), -1, keys[0].shape[1], -1)
            compact_kv(keys, values, None, src_slots, kept, dst_slots, None)
    return keep


def consensus(final: torch.Tensor, k: int, tail: int) -> torch.Tensor:
    """keep [1, R, 1, k]: one token set per request for KV that is not scored itself (a
    speculative draft's layers, whose heads map onto no scored head): the k positions of
    the highest mean ``final`` over the scored layers and KV heads, so every protected
    position (+inf in all of them) is kept, in ``in_place_order``."""
    agreed = select_topk(final.mean(dim=(0, 2), keepdim=True), k)
    return in_place_order(agreed, tail)
