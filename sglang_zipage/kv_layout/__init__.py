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

from sglang_zipage.kv_layout.base import (DISABLE_HINT, FP8_DTYPES, KVLayout, LayerKV, QueryAbsorption,
                                          QueryShape, ZipageUnsupported, architecture,
                                          async_on_hybrid_swa, attention_layers, below_window,
                                          rope_of, uniform_query, window_of)
from sglang_zipage.kv_layout.hybrid_swa import HybridSWALayout
from sglang_zipage.kv_layout.mha import MHALayout
from sglang_zipage.kv_layout.mla import MLALayout, mla_modules, mla_parents, mla_query
from sglang_zipage.memory import BufferShapes

__all__ = ["detect", "buffer_shapes", "KVLayout", "LayerKV", "QueryAbsorption", "QueryShape",
           "ZipageUnsupported", "MHALayout", "MLALayout", "HybridSWALayout", "FP8_DTYPES",
           "DISABLE_HINT", "below_window", "async_on_hybrid_swa", "rope_of"]


def detect(model_runner, kv_budget: int, async_compaction: bool = False,
           min_kv_budget: int = 0) -> KVLayout:
    pool = model_runner.token_to_kv_pool
    cls = type(pool).__name__
    attns = attention_layers(model_runner.model)
    arch = architecture(model_runner)
    if cls == "MHATokenToKVPool":
        layout = MHALayout(pool, attns)
    elif cls == "MLATokenToKVPool" and not getattr(pool, "use_dsa", False):
        layout = MLALayout(pool, attns, model_runner.model)
    elif cls == "SWAKVPool" and type(pool.full_kv_pool).__name__ == "MHATokenToKVPool":
        if async_compaction:
            raise ZipageUnsupported(async_on_hybrid_swa(arch))
        layout = HybridSWALayout(pool, attns)
    else:
        raise ZipageUnsupported(f"sglang-zipage cannot compress {arch}: its KV pool {cls} is "
                                f"not a layout it knows (MHA, MLA, hybrid SWA); {DISABLE_HINT}")
    layout.num_layers = max(attns) + 1
    problem = (below_window(arch, layout.least_kv_budget, kv_budget)
               or below_window(arch, layout.least_kv_budget, min_kv_budget,
                               "--zipage-min-kv-budget"))
    if problem:
        raise ZipageUnsupported(problem)
    return layout


def buffer_shapes(model, *, mla: bool, dtype_bytes: int, global_scores: bool,
                  stats_queries: int = 0) -> BufferShapes:
    """What the query window and the global scores need per slot, from the model's
    attention modules (the pool does not exist yet): the scored layers, their KV heads,
    query heads and the stored query width, as the layout built on the pool will have them."""
    attns = attention_layers(model)
    if mla:
        mqa = mla_modules(attns)
        query = mla_query(mqa, mla_parents(model))
        layers, kv_heads = len(mqa), 1
    else:
        scored = [attns[l][0] for l in sorted(attns) if not window_of(attns[l][0])]
        if not scored:
            raise ZipageUnsupported(f"every attention layer has a sliding window: nothing "
                                    f"to compress; {DISABLE_HINT}")
        query = uniform_query(scored, "full-attention")
        layers, kv_heads = len(scored), scored[0].tp_k_head_num
    return BufferShapes(scored_layers=layers, kv_heads=kv_heads, query_heads=query.heads,
                        query_width=query.width, query_bytes=dtype_bytes,
                        global_scores=global_scores, stats_queries=stats_queries)
