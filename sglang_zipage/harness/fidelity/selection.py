"""Which decode tokens to keep: the eviction policy of the HF reference, in plain torch.

Written from the algorithm's description (shared/design/zipage-algorithm.md and the stage
list in sglang_zipage/scoring.py), not by calling the engine's scoring or kernels, so
that comparing the engine with the HF reference checks the integration and the kernels at
once. The smoke test (tests/unit/test_fidelity_smoke.py) checks that both compute the same
ranking.

One call scores one layer of a batch whose rows share one compressible length S (the
benchmark gives every text the same prompt and continuation lengths, so every row hits its
budget at the same step):

  keys     [B, Hkv, S, D]  post-RoPE keys of the compressible suffix (the prompt is never
                           compressed and never enters the softmax)
  queries  [B, W, Hq, D]   the last W decode queries, post-RoPE
  stored   [B, Hkv, n]     global scores kept at the previous compaction, for the n oldest
                           suffix positions (None before the first compaction)

Stages (policy "score"), as the engine does them:
  1. a = softmax over the S keys of q.k * scale, per query and query head; max over the G
     query heads of a KV group; mean over the W queries
  2. on the first compaction only, max-pool a over positions (kernel `pooling`, stride 1)
  3. g = max(a, decay * stored) (stored = 0 for positions >= n); g = a when decay == 0
  4. with redundancy: e = k / |k|; m[s] = mean over the other tokens t (all of them: "full";
     those in the same 64-position block: "lightning") of e[s].e[t]; r = softmax_s(m / tau);
     final = lam * g - (1 - lam) * r
  5. the first `sink` and the last `window` positions get +inf
  then the `budget` best positions per (row, KV head) survive, in position order.
Controls (same budget, same protected window): "random" ranks by uniform noise (a fresh
draw per row, head, layer and compaction), "recent" by position (keeps the last `budget`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Tuple

import torch
import torch.nn.functional as F

POLICIES = ("score", "random", "recent")
LIGHTNING_BLOCK = 64


@dataclass(frozen=True)
class Eviction:
    budget: int  # tokens kept per KV head after a compaction (engine: zipage_kv_budget)
    buffer: int  # tokens added between two compactions (zipage_buffer)
    window: int = 16  # W
    decay: float = 0.8
    pooling: int = 5
    redundancy: str = "none"  # none | full | lightning
    redundancy_lambda: float = 0.2
    redundancy_tau: float = 0.4
    sink: int = 0
    policy: str = "score"  # score | random | recent
    seed: int = 0
    squeeze_to: int = 0  # the budget range's floor (budget.py A3), reached at step ...
    squeeze_at: int = 0  # ... squeeze_at, as the engine squeezes a request under overload
    own_prompt: bool = False  # the prompt compresses with the output (--zipage-compress-prompt)
    scorer: str = "window"  # window (the last W queries) | calibrated (query_stats.py: the
    # centroids at the next position) | mean (the single mean at geometric offsets)

    def __post_init__(self):
        assert self.policy in POLICIES, self.policy
        assert not self.squeeze_to or (self.window + self.sink <= self.squeeze_to < self.budget
                                       and self.squeeze_at > self.window), "squeeze"
        assert self.redundancy in ("none", "full", "lightning"), self.redundancy
        assert self.pooling >= 1 and self.pooling % 2 == 1
        assert self.budget >= self.window + self.sink and self.buffer >= self.window

    @property
    def limit(self) -> int:
        return self.budget + self.buffer


def window_attention(queries: torch.Tensor, keys: torch.Tensor, scale: float) -> torch.Tensor:
    """Stage 1: [B, Hkv, S] float32."""
    b, w, hq, d = queries.shape
    hkv = keys.shape[1]
    q = queries.float().view(b, w, hkv, hq // hkv, d)
    logits = torch.einsum("bwhgd,bhsd->bhwgs", q, keys.float()) * scale
    return torch.softmax(logits, dim=-1).amax(dim=3).mean(dim=2)


def max_pool(a: torch.Tensor, kernel: int) -> torch.Tensor:
    """Stage 2: max over positions s-k//2 .. s+k//2 that exist."""
    if kernel == 1:
        return a
    shape = a.shape
    out = F.max_pool1d(a.reshape(-1, 1, shape[-1]), kernel, stride=1, padding=kernel // 2)
    return out.view(shape)


def key_redundancy(keys: torch.Tensor, mode: str, tau: float) -> torch.Tensor:
    """Stage 4: softmax over positions of the mean cosine similarity to the other keys."""
    e = F.normalize(keys.float(), dim=-1)
    s = e.shape[2]
    sim = e @ e.transpose(-1, -2)  # [B, Hkv, S, S]
    pos = torch.arange(s, device=keys.device)
    same = torch.ones(s, s, dtype=torch.bool, device=keys.device)
    if mode == "lightning":
        same = (pos[:, None] // LIGHTNING_BLOCK) == (pos[None, :] // LIGHTNING_BLOCK)
    others = same & ~torch.eye(s, dtype=torch.bool, device=keys.device)
    count = others.sum(-1).clamp(min=1)
    mean = (sim * others).sum(-1) / count
    return torch.softmax(mean / tau, dim=-1)


def rank_scores(ev: Eviction, queries: torch.Tensor, keys: torch.Tensor,
                stored: Optional[torch.Tensor], first: bool, scale: float,
                generator: Optional[torch.Generator] = None) -> Tuple[torch.Tensor, torch.Tensor]:
    """(final, g): final ranks the S positions (+inf = kept for sure); g is the global
    score to store for the kept positions (stages 1-3)."""
    b, hkv, s, _ = keys.shape
    a = window_attention(queries, keys, scale)
    if first:
        a = max_pool(a, ev.pooling)
    g = a
    if ev.decay > 0 and stored is not None:
        prev = torch.zeros_like(a)
        prev[..., :stored.shape[-1]] = stored
        g = torch.maximum(a, ev.decay * prev)
    if ev.policy == "random":
        final = torch.rand(a.shape, generator=generator, device="cpu").to(a.device)
    elif ev.policy == "recent":
        final = torch.arange(s, dtype=torch.float32, device=a.device).expand(b, hkv, s).clone()
    elif ev.redundancy != "none":
        red = key_redundancy(keys, ev.redundancy, ev.redundancy_tau)
        final = ev.redundancy_lambda * g - (1 - ev.redundancy_lambda) * red
    else:
        final = g.clone()
    final[..., :ev.sink] = float("inf")
    final[..., s - ev.window:] = float("inf")
    return final, g


def select(final: torch.Tensor, budget: int) -> torch.Tensor:
    """[B, Hkv, budget] kept positions, ascending."""
    idx = torch.topk(final, budget, dim=-1, sorted=False).indices
    return torch.sort(idx, dim=-1).values
