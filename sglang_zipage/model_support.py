"""Which models sglang-zipage compresses, decided before any weight loads.

Supported KV layouts (kv_layout/): MHA (Llama, Qwen, Mistral, Gemma 3 with its
sliding-window layers, ...), MLA (DeepSeek V2/V3, Kimi K2), hybrid sliding-window pools
(gpt-oss), each in bf16/fp16 or FP8 (fp8_e4m3, fp8_e5m2). Everything else is refused
here, by name, with the advice to pass --zipage-disable; what only shows once the model
is built (a pool type, per-layer shapes) is refused by kv_layout.detect in the scheduler.
``model_facts`` reads the config through SGLang's own ModelConfig (the one sglang.srt import
here, inside it: this module stays light for the launcher).
"""

from __future__ import annotations

from typing import List

from sglang_zipage import memory
from sglang_zipage.config import ZipageConfig
from sglang_zipage.kv_layout.base import async_on_hybrid_swa, below_window

KV_DTYPES = ("auto", "bf16", "bfloat16", "fp8_e4m3", "fp8_e5m2")
# Models whose sliding window the launcher can read from the config (others: at startup
# of the scheduler, from the attention layers themselves).
SLIDING_WINDOW_ARCHS = ("GptOssForCausalLM", "Gemma3ForCausalLM", "Gemma3ForConditionalGeneration")
MLA_BACKENDS = ("triton", "flashinfer", "torch_native")


def refusals(facts: dict, config: ZipageConfig, server_args) -> List[str]:
    """Reasons this model cannot be compressed (empty = supported). ``facts``:
    model_facts(server_args)."""
    arch = facts["architecture"]
    kinds = [
        ("deepseek_v4", "DeepSeek V4's compressed sparse attention pool"),
        ("dsa", "DeepSeek sparse attention (DSA: an indexer picks the tokens each step)"),
        ("linear_attention", "linear-attention / Mamba state layers (no per-token KV to "
                             "compress in those layers)"),
        ("encoder_decoder", "encoder-decoder attention"),
        ("chunked_attention", "chunked local attention (Llama 4)"),
        ("mrope", "multimodal rotary positions (mrope)"),
    ]
    bad = [f"model {arch}: {what} is not supported" for key, what in kinds if facts[key]]
    if server_args.kv_cache_dtype not in KV_DTYPES:
        bad.append(f"--kv-cache-dtype {server_args.kv_cache_dtype}: zipage supports "
                   f"{', '.join(KV_DTYPES)}")
    if facts["mla"]:
        for name in ("attention_backend", "decode_attention_backend"):
            v = getattr(server_args, name, None)
            if v is not None and v not in MLA_BACKENDS:
                bad.append(f"--{name.replace('_', '-')} {v} with the MLA model {arch}: zipage "
                           f"compresses MLA with {', '.join(MLA_BACKENDS)}")
    window = facts["sliding_window"] if arch in SLIDING_WINDOW_ARCHS else 0
    bad += [p for p in (below_window(arch, window, config.kv_budget),
                        below_window(arch, window, config.min_kv_budget,
                                     "--zipage-min-kv-budget")) if p]
    bad += _memory_refusals(facts, config, server_args)
    if facts["hybrid_swa"] and config.async_compaction:
        bad.append(async_on_hybrid_swa(arch))
    if config.scorer == "calibrated":
        bad += _calibrated_refusals(facts, config, server_args.model_path)
    return bad


def with_scorer(config: ZipageConfig, model_path: str) -> ZipageConfig:
    """``--zipage-scorer auto`` as the scorer it stands for on this model: calibrated where
    its statistics are found (--zipage-query-stats, the bundled model's own file,
    MODEL_PATH/zipage_query_stats.safetensors), else window, said once here. Resolved by the
    entry points (launch_server, Engine, a scheduler started by ``sglang serve``), so every
    process of a server runs one scorer."""
    if not config.enabled or config.scorer != "auto":
        return config
    import dataclasses
    import logging

    from sglang_zipage import calibrate

    path = calibrate.stats_file(config.query_stats, model_path)
    if config.query_stats or path.is_file():
        return dataclasses.replace(config, scorer="calibrated")
    logging.getLogger("sglang_zipage").warning(
        "zipage: the window scorer (no query statistics for %s at %s; the calibrated scorer "
        "keeps better tokens at no query memory: `%s`)", model_path, path,
        calibrate.command(model_path, path))
    return dataclasses.replace(config, scorer="window")


def _calibrated_refusals(facts: dict, config: ZipageConfig, model_path: str) -> List[str]:
    """--zipage-scorer calibrated needs the model's statistics, measured on this model."""
    from sglang_zipage import calibrate
    from sglang_zipage.query_stats import QueryStats

    arch = facts["architecture"]
    path = calibrate.stats_file(config.query_stats, model_path)
    make = calibrate.command(model_path, path)
    if not path.is_file():
        return [f"--zipage-scorer calibrated: no query statistics at {path}; make them with "
                f"`{make}` (or pass --zipage-query-stats FILE)"]
    try:
        stats = QueryStats.load(str(path))
    except ValueError as e:
        return [f"--zipage-query-stats: {e}"]
    have = (max(stats.layer_ids) + 1, *stats.mean.shape[1:])  # (scored layers may be fewer)
    want = (facts["layers"], facts["query_heads"], facts["query_width"])
    if facts["query_width"] and (have[0] > want[0] or have[1:] != want[1:]):
        return [f"--zipage-scorer calibrated: {path} holds statistics of layers x query heads x "
                f"query width {have}, {arch} has {want}; calibrate it: `{make}`"]
    return []


def _memory_refusals(facts: dict, config: ZipageConfig, server_args) -> List[str]:
    """memory.py M4, the part known from the config: global scores beyond the share. Only
    where every layer is scored (a sliding-window layer's KV has no scores: less share), and
    where the user did not cap the pool (--max-total-tokens: the memory beside it may hold
    them; server_args.memory_refusals checks that against the device's memory)."""
    if (config.decay == 0 or facts["sliding_window"] or facts["hybrid_swa"]
            or server_args.max_total_tokens):
        return []
    kv_bytes = 1 if str(server_args.kv_cache_dtype).startswith("fp8") else facts["dtype_bytes"]
    row = facts["kv_row_elements"] * kv_bytes
    if row <= 0:
        return []
    needed = memory.score_share(row)
    if needed < config.memory_fraction:
        return []
    return [memory.scores_exceed_share(facts["architecture"], config.memory_fraction, needed)]


# ------------------------------------------------------------- model facts
def model_facts(model_path: str, *, trust_remote_code: bool = False, revision=None,
                model_override_args: str = "{}", disable_hybrid_swa_memory: bool = False) -> dict:
    """What SGLang itself will decide about this model's KV pool, read from its config
    before any weight loads (the same ModelConfig and classifiers SGLang's KV-cache
    configurator uses, L413 and configs/hybrid_arch.py), as plain values for
    model_support.refusals."""
    from sglang.srt.configs.hybrid_arch import mambaish_config
    from sglang.srt.configs.model_config import (AttentionArch, ModelConfig, is_deepseek_dsa,
                                                 is_deepseek_v4)

    mc = ModelConfig(model_path, trust_remote_code=trust_remote_code, revision=revision,
                     model_override_args=model_override_args,
                     disable_hybrid_swa_memory=disable_hybrid_swa_memory)
    text = mc.hf_text_config
    rope = getattr(text, "rope_scaling", None) or getattr(text, "rope_parameters", None) or {}
    return {
        "architecture": (mc.hf_config.architectures or ["?"])[0],
        "mla": mc.attention_arch == AttentionArch.MLA,
        "dsa": is_deepseek_dsa(mc.hf_config),
        "deepseek_v4": is_deepseek_v4(mc.hf_config),
        "linear_attention": mambaish_config(mc) is not None,
        "encoder_decoder": bool(mc.is_encoder_decoder),
        "hybrid_swa": bool(mc.is_hybrid_swa),
        "chunked_attention": getattr(mc, "attention_chunk_size", None) is not None,
        "mrope": isinstance(rope, dict) and "mrope_section" in rope,
        "sliding_window": getattr(text, "sliding_window", None) or 0,
        # one layer's KV row per KV head, in elements (MLA: the latent row), for the share
        # of the pool the global scores take (memory.score_share)
        "kv_row_elements": ((mc.kv_lora_rank + mc.qk_rope_head_dim)
                            if mc.attention_arch == AttentionArch.MLA
                            else (mc.head_dim or 0) + (mc.v_head_dim or mc.head_dim or 0)),
        "dtype_bytes": mc.dtype.itemsize,
        # the model's attention shape, for the launcher's memory plan (server_args.py)
        "layers": mc.num_attention_layers, "kv_heads": mc.get_total_num_kv_heads(),
        "query_heads": mc.num_attention_heads, "head_dim": mc.head_dim or 0,
        # what a query row holds before RoPE and absorption (MLA: q_nope | q_rope)
        "query_width": ((mc.qk_nope_head_dim + mc.qk_rope_head_dim)
                        if mc.attention_arch == AttentionArch.MLA else mc.head_dim or 0),
    }
