"""KV layouts: how one SGLang KV pool holds a token, for the three places that read it.

The query window (which layers' decode queries to keep, in what shape), scoring (which key
buffers to read, and how to dequantize them) and compaction (which buffers to move, and
what else must follow the moved tokens) all go through one ``KVLayout``:

  MHALayout        ``MHATokenToKVPool``: per layer k and v [slots, Hkv, D]. Layers with a
                   sliding window in the same pool (Gemma 3; gpt-oss with
                   --disable-hybrid-swa-memory) keep their newest tokens, in order, so the
                   window reads exactly what it read before.
  MLALayout        ``MLATokenToKVPool`` (DeepSeek V2/V3, Kimi K2): one latent row
                   [slots, 1, kv_lora_rank + rope] per layer is key and value at once; the
                   queries are what MLA attention scores it with (absorbed q_nope | q_rope).
                   The window stores them compactly, before absorption (q_nope | q_rope,
                   192 wide for DeepSeek V3 instead of 576), and scoring absorbs them with
                   the layer's own w_kc: the same scores for a third of the bytes.
  HybridSWALayout  ``SWAKVPool`` (gpt-oss): full-attention layers compress in the full pool;
                   sliding-window layers live in a pool of their own, reached through
                   ``full_to_swa_index_mapping``, which a compaction shifts so the window's
                   tokens stay in the columns the window reads (``remap_window``).
FP8 KV (``--kv-cache-dtype fp8_e4m3 / fp8_e5m2``) is a key format on any of them: keys are
stored as uint8; scoring reads them as that FP8 type times the layer's k_scale, compaction
moves the stored bytes, so a budget in tokens costs half the bytes of bf16.

``detect(model_runner, kv_budget)`` picks the layout or raises ``ZipageUnsupported`` with the
pool and model named; ``buffer_shapes(model, ...)`` reads what the query window and global
scores will need from the model alone, before the pool exists (memory.py sizes them inside
the pool's share). This module duck-types SGLang objects and imports no sglang module.
"""

from __future__ import annotations

import dataclasses
from typing import Dict, List, Optional, Sequence, Tuple

import torch

from sglang_zipage.memory import BufferShapes
from sglang_zipage.scoring import LayerKV, QueryAbsorption

FP8_DTYPES = (torch.float8_e4m3fn, torch.float8_e5m2)
DISABLE_HINT = "pass --zipage-disable to serve it without compression"


class ZipageUnsupported(RuntimeError):
    """This model or KV pool cannot run with compression; the message names it."""


@dataclasses.dataclass(frozen=True)
class QueryShape:
    heads: int  # query heads of this rank
    dim: int  # what a query row is dotted with: head_dim, or kv_lora_rank + rope for MLA
    scale: float  # softmax scale of the attention
    stored_dim: int = 0  # what the window stores per head (0: dim; MLA compact: nope + rope)

    @property
    def width(self) -> int:
        return self.stored_dim or self.dim


class KVLayout:
    """Base: what every layout provides. Subclasses fill the fields in __init__."""

    name = "?"
    scored_layers: Tuple[int, ...]  # global layer ids scored; ring row i = scored_layers[i]
    query: QueryShape
    kv: LayerKV
    min_kv_budget: int = 1  # a sliding window needs at least this many kept tokens
    sliding_window: int = 0
    num_layers: int = 0  # attention layers of the model (highest layer id + 1)

    def ring_rows(self) -> List[int]:
        """[global layer id] -> query-window ring row, -1 for layers not scored."""
        rows = [-1] * self.num_layers
        for i, layer in enumerate(self.scored_layers):
            rows[layer] = i
        return rows

    def queries(self, layer_id: int, q: torch.Tensor, q_rope: Optional[torch.Tensor]) -> torch.Tensor:
        """What the window stores of what RadixAttention received, as [tokens, Hq, width]
        (the layer passes any layout: [tokens, Hq * D], [1, tokens, Hq, D] (Gemma 3), ...)."""
        return q.reshape(-1, self.query.heads, self.query.dim)

    def remap_window(self, req_to_token, items, k: int, allocator, reqs) -> None:
        """After a compaction is planned: make whatever else indexes the suffix's columns
        follow the kept tokens (hybrid SWA). Default: nothing does."""

    def describe(self) -> dict:
        return {"layout": self.name, "scored_layers": len(self.scored_layers),
                "recent_layers": len(self.kv.recent_keys), "key_dtype": str(self.kv.key_dtype),
                "query_heads": self.query.heads, "query_dim": self.query.dim,
                "stored_query_dim": self.query.width, "sliding_window": self.sliding_window}


# --------------------------------------------------------------------------- detection
def detect(model_runner, kv_budget: int, async_compaction: bool = False) -> KVLayout:
    pool = model_runner.token_to_kv_pool
    cls = type(pool).__name__
    attns = _attention_layers(model_runner.model)
    arch = _architecture(model_runner)
    if cls == "MHATokenToKVPool":
        layout = MHALayout(pool, attns)
    elif cls == "MLATokenToKVPool" and not getattr(pool, "use_dsa", False):
        layout = MLALayout(pool, attns, model_runner.model)
    elif cls == "SWAKVPool" and type(pool.full_kv_pool).__name__ == "MHATokenToKVPool":
        if async_compaction:
            raise ZipageUnsupported(
                f"--zipage-async with {arch}'s hybrid sliding-window pool (SWAKVPool) is not "
                f"supported; drop --zipage-async, or pass --disable-hybrid-swa-memory")
        layout = HybridSWALayout(pool, attns)
    else:
        raise ZipageUnsupported(f"sglang-zipage cannot compress {arch}: its KV pool {cls} is "
                                f"not a layout it knows (MHA, MLA, hybrid SWA); {DISABLE_HINT}")
    layout.num_layers = max(attns) + 1
    if kv_budget < layout.min_kv_budget:
        raise ZipageUnsupported(
            f"--zipage-kv-budget {kv_budget} is below {arch}'s sliding window "
            f"({layout.sliding_window} tokens): its sliding-window layers need that many "
            f"tokens kept; use --zipage-kv-budget {layout.min_kv_budget} or more")
    return layout


def _architecture(model_runner) -> str:
    archs = getattr(getattr(model_runner.model_config, "hf_config", None), "architectures", None)
    return archs[0] if archs else type(model_runner.model).__name__


def _attention_layers(model) -> Dict[int, list]:
    """layer_id -> the RadixAttention modules of that layer (MLA has two: mha and mqa)."""
    out: Dict[int, list] = {}
    for m in model.modules():
        if hasattr(m, "tp_q_head_num") and hasattr(m, "scaling") and hasattr(m, "layer_id"):
            out.setdefault(m.layer_id, []).append(m)
    return out


def _window(attn) -> int:
    w = getattr(attn, "sliding_window_size", -1)
    return w if w is not None and w > 0 else 0


def _uniform_query(attns: Sequence, what: str) -> QueryShape:
    shapes = {(a.tp_q_head_num, a.qk_head_dim, float(a.scaling)) for a in attns}
    if len(shapes) != 1:
        raise ZipageUnsupported(f"sglang-zipage needs one query shape across the {what} "
                                f"layers; this model has {sorted(shapes)}; {DISABLE_HINT}")
    heads, dim, scale = shapes.pop()
    return QueryShape(heads, dim, scale)


def _key_format(pool, attns: Sequence) -> Tuple[Optional[torch.dtype], Optional[torch.Tensor]]:
    """(FP8 type, per-layer k_scale) for an FP8 pool; (None, None) otherwise."""
    if pool.dtype not in FP8_DTYPES:
        if pool.dtype != getattr(pool, "store_dtype", pool.dtype):
            raise ZipageUnsupported(f"KV cache dtype {pool.dtype} stored as {pool.store_dtype} "
                                    f"is not supported; {DISABLE_HINT}")
        return None, None
    scales = [float(a.k_scale_float) if getattr(a, "k_scale_float", None) is not None else 1.0
              for a in attns]
    return pool.dtype, torch.tensor(scales, dtype=torch.float32, device=pool.device)


def buffer_shapes(model, *, mla: bool, dtype_bytes: int, global_scores: bool) -> BufferShapes:
    """What the query window and the global scores need per slot, from the model's
    attention modules (the pool does not exist yet): the scored layers, their KV heads,
    query heads and the stored query width, as the layout built on the pool will have them."""
    attns = _attention_layers(model)
    if mla:
        mqa = _mla_modules(attns)
        query = _mla_query(mqa, _mla_parents(model))
        layers, kv_heads = len(mqa), 1
    else:
        scored = [attns[l][0] for l in sorted(attns) if not _window(attns[l][0])]
        if not scored:
            raise ZipageUnsupported(f"every attention layer has a sliding window: nothing "
                                    f"to compress; {DISABLE_HINT}")
        query = _uniform_query(scored, "full-attention")
        layers, kv_heads = len(scored), scored[0].tp_k_head_num
    return BufferShapes(scored_layers=layers, kv_heads=kv_heads, query_heads=query.heads,
                        query_width=query.width, query_bytes=dtype_bytes,
                        global_scores=global_scores)


# ------------------------------------------------------------------------------ layouts
class MHALayout(KVLayout):
    name = "mha"

    def __init__(self, pool, attns: Dict[int, list]):
        layers = sorted(attns)
        if len(layers) != len(pool.k_buffer):
            raise ZipageUnsupported(f"{len(layers)} attention layers for {len(pool.k_buffer)} "
                                    f"KV layers (layers without KV?); {DISABLE_HINT}")
        one = {l: attns[l][0] for l in layers}
        windows = {l: _window(one[l]) for l in layers}
        self.scored_layers = tuple(l for l in layers if not windows[l])
        recent = [l for l in layers if windows[l]]
        if not self.scored_layers:
            raise ZipageUnsupported(f"every attention layer has a sliding window: nothing "
                                    f"to compress; {DISABLE_HINT}")
        scored = [one[l] for l in self.scored_layers]
        self.query = _uniform_query(scored, "full-attention")
        self.sliding_window = max(windows.values())
        self.min_kv_budget = self.sliding_window or 1
        key_dtype, scales = _key_format(pool, scored)
        idx = lambda l: l - getattr(pool, "start_layer", 0)
        self.kv = LayerKV(
            keys=[pool.k_buffer[idx(l)] for l in self.scored_layers],
            values=[pool.v_buffer[idx(l)] for l in self.scored_layers],
            key_dtype=key_dtype, key_scales=scales,
            recent_keys=[pool.k_buffer[idx(l)] for l in recent],
            recent_values=[pool.v_buffer[idx(l)] for l in recent])
        if recent:
            self.name = "mha+sliding-window"


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
        mqa = _mla_modules(attns)
        if len(mqa) != len(pool.kv_buffer):
            raise ZipageUnsupported(f"MLA pool without an absorbed attention per layer "
                                    f"({len(mqa)} for {len(pool.kv_buffer)} KV layers); "
                                    f"{DISABLE_HINT}")
        self.scored_layers = tuple(sorted(mqa))
        parents = _mla_parents(model) if model is not None else {}
        self.query = _mla_query(mqa, parents)
        self.rope_dim = pool.qk_rope_head_dim
        self.nope_dim = self.query.width - self.rope_dim
        key_dtype, scales = _key_format(pool, [mqa[l] for l in self.scored_layers])
        absorb = None
        if self.query.stored_dim:
            absorb = QueryAbsorption([_absorption_weight(parents[l]) for l in self.scored_layers],
                                     self.rope_dim)
            self.name = "mla-compact"
        self.kv = LayerKV(keys=list(pool.kv_buffer), values=None, key_dtype=key_dtype,
                          key_scales=scales, absorb=absorb)
        self._nope: Dict[int, torch.Tensor] = {}  # layer id -> this forward's q_nope

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


def _mla_modules(attns: Dict[int, list]) -> Dict[int, object]:
    """layer id -> attn_mqa: the absorbed decode attention, one KV head of the latent width,
    the widest of the layer (DeepSeek layers also hold attn_mha, the prefill attention)."""
    mqa = {l: max(mods, key=lambda a: a.qk_head_dim) for l, mods in attns.items()}
    missing = [l for l, a in mqa.items() if a.tp_k_head_num != 1]
    if missing:
        raise ZipageUnsupported(f"MLA pool without an absorbed attention per layer "
                                f"(layers {missing[:4]}); {DISABLE_HINT}")
    return mqa


def _mla_parents(model) -> Dict[int, object]:
    """layer id -> the model's MLA attention module (it holds w_kc and the head split); none
    where the model scales the absorbed query (Llama 4 scaling: not in q_nope | q_rope)."""
    mods = list(model.modules())
    if any(getattr(m, "llama_4_scaling_config", None) is not None for m in mods):
        return {}
    return {m.attn_mqa.layer_id: m for m in mods if hasattr(m, "attn_mqa") and hasattr(m, "w_kc")}


def _mla_query(mqa: Dict[int, object], parents: Dict[int, object]) -> QueryShape:
    query = _uniform_query(list(mqa.values()), "MLA")
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


class HybridSWALayout(KVLayout):
    """SWAKVPool: full-attention layers in ``full_kv_pool`` (indexed by the request's
    columns' slots), sliding-window layers in ``swa_kv_pool`` (indexed through
    ``full_to_swa_index_mapping``; slots outside the window are freed as decode goes on)."""

    name = "hybrid-swa"

    def __init__(self, pool, attns: Dict[int, list]):
        # layers the model has (a pool sized from a longer config may map more)
        mapping = {l: v for l, v in pool.layers_mapping.items() if l in attns}
        full = sorted(l for l, (_, is_swa) in mapping.items() if not is_swa)
        swa = sorted(l for l, (_, is_swa) in mapping.items() if is_swa)
        if not full:
            raise ZipageUnsupported(f"every attention layer has a sliding window: nothing "
                                    f"to compress; {DISABLE_HINT}")
        self.scored_layers = tuple(full)
        scored = [attns[l][0] for l in full]
        self.query = _uniform_query(scored, "full-attention")
        self.sliding_window = max([_window(attns[l][0]) for l in swa] or [0])
        self.min_kv_budget = max(1, self.sliding_window)
        fpool = pool.full_kv_pool
        key_dtype, scales = _key_format(fpool, scored)
        rows = [pool.layers_mapping[l][0] for l in full]
        self.kv = LayerKV(keys=[fpool.k_buffer[i] for i in rows],
                          values=[fpool.v_buffer[i] for i in rows],
                          key_dtype=key_dtype, key_scales=scales)

    def remap_window(self, req_to_token, items, k: int, allocator, reqs) -> None:
        """Shift each request's live sliding-window tokens to the columns they occupy after
        the compaction: the newest n columns [c0 + S - n, c0 + S) become [c0 + k - n, c0 + k)
        (n = the window, page aligned, at most k). Their SWA slots move with them in
        ``full_to_swa_index_mapping``; every other SWA slot of the suffix is freed and its
        mapping cleared, so the full slots freed next carry no SWA slot; the request's
        ``swa_evicted_seqlen`` moves down to c0 + k - n."""
        mapping = allocator.full_to_swa_index_mapping
        page = allocator.page_size
        n = min(k, -(-self.sliding_window // page) * page)
        for it, req in zip(items, reqs):
            row = req_to_token[it.req_pool_idx]
            suffix_slots = row[it.c0:it.c0 + it.suffix].to(torch.int64)
            old = mapping[suffix_slots]
            moved = old[it.suffix - n:]  # the window's SWA slots, oldest first
            keep = torch.zeros_like(old, dtype=torch.bool)
            keep[it.suffix - n:] = moved > 0
            dropped = old[~keep]
            allocator.swa_attn_allocator.free(dropped[dropped > 0])
            mapping[suffix_slots] = 0
            mapping[suffix_slots[k - n:k]] = moved
            req.kv.swa_evicted_seqlen = it.c0 + k - n
