"""MLATokenToKVPool (DeepSeek V2/V3/R1, Kimi K2): the latent row, the compact query window."""

from __future__ import annotations

import dataclasses
from typing import Dict, Optional, Tuple

import torch

from sglang_zipage.kv_layout.base import (DISABLE_HINT, FP8_DTYPES, KVLayout, LayerKV,
                                          QueryAbsorption, QueryShape, ZipageUnsupported,
                                          key_format, uniform_query)


class MLALayout(KVLayout):
    """One latent row per token and layer, [slots, 1, kv_lora_rank + qk_rope_head_dim]: the
    key (scored whole, rope part included) and the value (its first kv_lora_rank entries).

    Decode attention scores the row with the absorbed query q_nope @ w_kc | q_rope (576
    wide for DeepSeek V3). The window stores q_nope | q_rope instead (192 wide), taken where
    the model splits its query (``stash``) and where attention receives the rotated rope
    part (``queries``); scoring absorbs it with the layer's own w_kc (``LayerKV.absorb``).
    Where the absorption weight is not a plain tensor (DeepGEMM block-scaled FP8) or the
    model scales the absorbed query (Llama 4 scaling), the absorbed query is stored whole."""

    name = "mla"

    def __init__(self, pool, attns: Dict[int, list], model=None):
        mqa = mla_modules(attns)
        if len(mqa) != len(pool.kv_buffer):
            raise ZipageUnsupported(f"MLA pool without an absorbed attention per layer "
                                    f"({len(mqa)} for {len(pool.kv_buffer)} KV layers); "
                                    f"{DISABLE_HINT}")
        self.scored_layers = tuple(sorted(mqa))
        parents = mla_parents(model) if model is not None else {}
        self.query = mla_query(mqa, parents)
        if self.query.dim != pool.kv_lora_rank + pool.qk_rope_head_dim:
            raise ZipageUnsupported(f"MLA attention of width {self.query.dim} over a latent row of "
                                    f"{pool.kv_lora_rank} + {pool.qk_rope_head_dim}; {DISABLE_HINT}")
        self.rope_dim = pool.qk_rope_head_dim
        self.nope_dim = self.query.width - self.rope_dim
        key_dtype, scales = key_format(pool, [mqa[l] for l in self.scored_layers])
        absorb = None
        if self.query.stored_dim:
            absorb = QueryAbsorption([_absorption_weight(parents[l]) for l in self.scored_layers],
                                     self.rope_dim)
            self.name = "mla-compact"
        self.rope_start = self.nope_dim if absorb is not None else None
        self.kv = LayerKV(keys=list(pool.kv_buffer), values=None, key_dtype=key_dtype,
                          key_scales=scales, absorb=absorb)
        self._nope: Dict[int, torch.Tensor] = {}  # layer id -> this forward's q_nope
        self._absorbed = {id(m) for m in mqa.values()}  # the attentions of the absorbed path

    def stash(self, layer_id: int, q_nope: torch.Tensor) -> None:
        """The model split its query: keep q_nope [tokens, Hq, nope] (before absorption)
        for the layer's attention call, which stores it with the rotated rope part."""
        if self.query.stored_dim:
            self._nope[layer_id] = q_nope

    def queries(self, layer_id, q, q_rope):
        """Compact: q_nope (stashed) | q_rope. Whole: the absorbed query; backends that take
        the rope part apart (flashinfer, fa3, ...) get q_nope and q_rope, the others get them
        concatenated, [tokens, Hq, kv_lora_rank + rope]."""
        heads = self.query.heads
        rope = (q_rope.reshape(-1, heads, self.rope_dim) if q_rope is not None
                else q.reshape(-1, heads, self.query.dim)[..., -self.rope_dim:])
        if self.query.stored_dim:
            return torch.cat([self._nope[layer_id].reshape(-1, heads, self.nope_dim), rope], dim=-1)
        if q_rope is None:
            return q.reshape(-1, heads, self.query.dim)
        return torch.cat([q.reshape(-1, heads, self.query.dim - self.rope_dim), rope], dim=-1)

    def prefill_queries(self, attn, q, q_rope):
        """A prefill runs the absorbed attention (then as a decode: ``queries``) or the MHA
        form, whose query is already q_nope | q_rope, post-RoPE."""
        if id(attn) in self._absorbed:
            return self.queries(attn.layer_id, q, q_rope)
        return q.reshape(-1, self.query.heads, self.query.width)


def mla_modules(attns: Dict[int, list]) -> Dict[int, object]:
    """layer id -> attn_mqa: the absorbed decode attention, one KV head of the latent width,
    the widest of the layer (DeepSeek layers also hold attn_mha, the prefill attention)."""
    mqa = {l: max(mods, key=lambda a: a.qk_head_dim) for l, mods in attns.items()}
    missing = [l for l, a in mqa.items() if a.tp_k_head_num != 1]
    if missing:
        raise ZipageUnsupported(f"MLA pool without an absorbed attention per layer "
                                f"(layers {missing[:4]}); {DISABLE_HINT}")
    return mqa


def mla_parents(model) -> Dict[int, object]:
    """layer id -> the model's MLA attention module (it holds w_kc and the head split); none
    where the model scales the absorbed query (Llama 4 scaling: not in q_nope | q_rope)."""
    mods = list(model.modules())
    if any(getattr(m, "llama_4_scaling_config", None) is not None for m in mods):
        return {}
    return {m.attn_mqa.layer_id: m for m in mods if hasattr(m, "attn_mqa") and hasattr(m, "w_kc")}


def mla_query(mqa: Dict[int, object], parents: Dict[int, object]) -> QueryShape:
    query = uniform_query(list(mqa.values()), "MLA")
    if all(_absorption_weight(parents.get(l)) is not None for l in mqa):
        one = parents[min(mqa)]
        stored = one.qk_nope_head_dim + one.qk_rope_head_dim
        if stored < query.dim:
            return dataclasses.replace(query, stored_dim=stored)
    return query


def _absorption_weight(module) -> Optional[Tuple[torch.Tensor, object]]:
    """(w_kc [Hq, nope, kv_lora_rank], scale) as the model absorbs q_nope with it, or None
    where the compact form could not score identically (or the model is not known)."""
    if module is None or getattr(module, "use_deep_gemm_bmm", False):
        return None
    w = getattr(module, "w_kc", None)
    if not isinstance(w, torch.Tensor) or w.dim() != 3:
        return None
    if w.dtype in FP8_DTYPES:
        scale = getattr(module, "w_scale", 1.0)
        return (w, scale) if not isinstance(scale, torch.Tensor) or scale.numel() == 1 else None
    if not w.dtype.is_floating_point:
        return None
    return w, 1.0
