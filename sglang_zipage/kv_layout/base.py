"""What every KV layout shares: the buffers a compaction reads and moves (LayerKV), the
query shape, the KVLayout base, and the readers of SGLang's attention modules and pools.
Duck-types SGLang objects; imports no sglang module."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence, Tuple

import torch

@dataclass(frozen=True)
class QueryAbsorption:
    """MLA's compact query window: each head's q_nope | q_rope is stored before absorption
    and absorbed here, per layer, with the weight the model absorbs it with.

    weights: per scored layer (w_kc [Hq, nope, kv_lora_rank], scale): the absorbed q_nope
             is q_nope @ (w_kc * scale) (scale 1, or an FP8 w_kc's per-tensor scale).
    rope_dim: the trailing rope part of a stored row, passed through unchanged."""

    weights: Sequence[Tuple[torch.Tensor, object]]
    rope_dim: int


@dataclass(frozen=True)
class LayerKV:
    """The KV buffers one compaction reads and moves, as a KV layout hands
    them over.

    keys:       scored layers' key storage, L tensors [slots, Hkv, D] (uint8 for FP8 KV).
    values:     their value storage, or None when the key row holds the value (MLA).
    key_dtype:  the FP8 type uint8 keys hold, or None (keys are in the model dtype).
    key_scales: [L] float32, key = stored * scale (FP8 k_scale), or None (1).
    recent_keys / recent_values: sliding-window layers of the same pool: they keep the
                newest k tokens of the suffix, in order, so the window reads what it read.
    absorb:     the window stores queries before absorption (MLA compact), or None.
    """

    keys: Sequence[torch.Tensor]
    values: Optional[Sequence[torch.Tensor]]
    key_dtype: Optional[torch.dtype] = None
    key_scales: Optional[torch.Tensor] = None
    recent_keys: Sequence[torch.Tensor] = ()
    recent_values: Optional[Sequence[torch.Tensor]] = None
    absorb: Optional[QueryAbsorption] = None


FP8_DTYPES = (torch.float8_e4m3fn, torch.float8_e5m2)
DISABLE_HINT = "pass --zipage-disable to serve it without compression"


class ZipageUnsupported(RuntimeError):
    """This model or KV pool cannot run with compression; the message names it."""


def below_window(arch: str, window: int, kv_budget: int, flag: str = "--zipage-kv-budget"):
    """Why a budget (or floor) ``kv_budget`` cannot serve a model whose sliding-window layers
    keep ``window`` tokens, or None: the one rule for the launcher (from the config),
    the scheduler's startup (from the layers) and a request's own budget (HTTP 400)."""
    if window and 0 < kv_budget < window:  # (0: no floor given)
        return (f"{flag} {kv_budget} is below {arch}'s sliding window ({window} tokens), "
                f"which its sliding-window layers must keep; use {flag} {window} or more")
    return None


def async_on_hybrid_swa(arch: str) -> str:
    """The refusal of --zipage-async on a hybrid sliding-window pool (SWAKVPool), whose
    window slots follow a compaction only when it is planned and run at once."""
    return (f"--zipage-async with {arch}'s hybrid sliding-window pool (SWAKVPool) is not "
            f"supported; drop --zipage-async, or pass --disable-hybrid-swa-memory")


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
    least_kv_budget: int = 1  # a sliding window needs at least this many kept tokens
    sliding_window: int = 0
    num_layers: int = 0  # attention layers of the model (highest layer id + 1)
    # Its compressed span may be followed by columns that stay (an answer, segments.py) and
    # may start inside the prompt (own_prompt.py); False where the window remap assumes the
    # compressed span ends the request (hybrid SWA).
    spans_anywhere: bool = True
    # Where the rotary dims of a stored query row begin (the calibrated scorer rotates them);
    # None where its rows are not pre-absorption queries (MLA's whole absorbed window).
    rope_start: Optional[int] = 0

    def stash(self, layer_id: int, q_nope: torch.Tensor) -> None:
        """The model split an MLA query before absorbing it (MLA only; others: nothing)."""

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

    def prefill_queries(self, attn, q: torch.Tensor, q_rope: Optional[torch.Tensor]) -> torch.Tensor:
        """``queries`` of a prefill (a calibration run reads them, query_capture.py)."""
        return self.queries(attn.layer_id, q, q_rope)

    def remap_window(self, req_to_token, items, k: int, allocator, reqs) -> None:
        """After a compaction is planned: make whatever else indexes the suffix's columns
        follow the kept tokens (hybrid SWA). Default: nothing does."""

    def describe(self) -> dict:
        return {"layout": self.name, "scored_layers": len(self.scored_layers),
                "recent_layers": len(self.kv.recent_keys), "key_dtype": str(self.kv.key_dtype),
                "query_heads": self.query.heads, "query_dim": self.query.dim,
                "stored_query_dim": self.query.width, "sliding_window": self.sliding_window}


def architecture(model_runner) -> str:
    archs = getattr(getattr(model_runner.model_config, "hf_config", None), "architectures", None)
    return archs[0] if archs else type(model_runner.model).__name__


def attention_layers(model) -> Dict[int, list]:
    """layer_id -> the RadixAttention modules of that layer (MLA has two: mha and mqa)."""
    out: Dict[int, list] = {}
    for m in model.modules():
        if hasattr(m, "tp_q_head_num") and hasattr(m, "scaling") and hasattr(m, "layer_id"):
            out.setdefault(m.layer_id, []).append(m)
    return out


def rope_of(model, layers: Sequence[int]) -> Tuple[torch.Tensor, bool]:
    """(cos_sin_cache [positions, R], neox) of the rotary embedding the attention modules of
    ``layers`` apply (SGLang's RotaryEmbedding, held beside the layer's RadixAttention): what
    the calibrated scorer rotates its queries with. One table for all of them, or refused."""
    found = {}
    for module in model.modules():
        rope = getattr(module, "rotary_emb", None)
        if rope is None or not hasattr(rope, "cos_sin_cache"):
            continue
        for child in module.children():
            if getattr(child, "layer_id", None) in layers and hasattr(child, "tp_q_head_num"):
                found[child.layer_id] = rope
    ropes = {id(r): r for r in found.values()}
    if set(found) != set(layers) or len(ropes) != 1:
        raise ZipageUnsupported(f"the calibrated scorer needs one rotary embedding table for "
                                f"the scored layers; found {len(ropes)} for layers "
                                f"{sorted(found)[:8]}; use --zipage-scorer window")
    rope = ropes.popitem()[1]
    return rope.cos_sin_cache, bool(rope.is_neox_style)


def window_of(attn) -> int:
    w = getattr(attn, "sliding_window_size", -1)
    return w if w is not None and w > 0 else 0


def uniform_query(attns: Sequence, what: str) -> QueryShape:
    shapes = {(a.tp_q_head_num, a.qk_head_dim, float(a.scaling)) for a in attns}
    if len(shapes) != 1:
        raise ZipageUnsupported(f"sglang-zipage needs one query shape across the {what} "
                                f"layers; this model has {sorted(shapes)}; {DISABLE_HINT}")
    heads, dim, scale = shapes.pop()
    return QueryShape(heads, dim, scale)


def key_format(pool, attns: Sequence) -> Tuple[Optional[torch.dtype], Optional[torch.Tensor]]:
    """(FP8 type, per-layer k_scale) for an FP8 pool; (None, None) otherwise."""
    if pool.dtype not in FP8_DTYPES:
        if pool.dtype != getattr(pool, "store_dtype", pool.dtype):
            raise ZipageUnsupported(f"KV cache dtype {pool.dtype} stored as {pool.store_dtype} "
                                    f"is not supported; {DISABLE_HINT}")
        return None, None
    scales = [float(a.k_scale_float) if getattr(a, "k_scale_float", None) is not None else 1.0
              for a in attns]
    return pool.dtype, torch.tensor(scales, dtype=torch.float32, device=pool.device)
