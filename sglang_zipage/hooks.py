"""The SGLang boundary: every SGLang 0.5.17 internal that sglang-zipage touches.

One table, one row per hook: target, hook type, why. Hook bodies are thin: they read
SGLang objects, call the ZipageRuntime (runtime.py), and write results back. Nothing
outside this module names an ``sglang.srt`` path except for type hints.

``install()`` runs inside every SGLang scheduler process (through
``proc.run_scheduler_process`` or the ``sglang.srt.plugins`` entry point), registers the
table with SGLang's HookRegistry, applies it, and verifies that every target now carries
our wrapper: ``apply_hooks`` only logs a bad target and carries on.
"""

from __future__ import annotations

import logging
import pkgutil
from typing import Optional

from sglang_zipage.config import ZipageConfig

logger = logging.getLogger("sglang_zipage")

SGLANG_VERSION = "0.5.17"
RUNTIME = None  # the ZipageRuntime of this process, once installed with zipage enabled
FRONTEND_CONFIG = None  # the config, in the process that runs the tokenizer manager
_INSTALLED = False
_FRONTEND_INSTALLED = False

_SRT = "sglang.srt."


# ----------------------------------------------------------------- hook bodies
def _after_alloc_memory_pool(result, model_runner, *args, **kwargs):
    RUNTIME.attach(model_runner)


def _remember_kv_memory(result, kvc, *args, **kwargs):
    RUNTIME.kv_memory_bytes = result  # what SGLang sizes the pool from (memory.py M3)
    return result


def _pool_makes_room(original, kvc, *args, **kwargs):
    """SGLang sized the pool; zipage's buffers come out of it (memory.py), and SGLang's own
    configurator re-sizes the pool (and its request cap) for the tokens that remain."""
    config = original(kvc, *args, **kwargs)
    if kvc.is_draft_worker:
        return config
    from sglang.srt.model_executor.pool_configurator import create_memory_pool_configurator

    from sglang_zipage import kv_layout, memory

    configurator = create_memory_pool_configurator(kvc)
    cell = int(configurator._cell_size)  # KV bytes per token of max_total_num_tokens
    page = kvc.page_size
    arch = (kvc.model_config.hf_config.architectures or ["this model"])[0]
    shapes = kv_layout.buffer_shapes(kvc.model, mla=bool(kvc.use_mla_backend),
                                     dtype_bytes=kvc.model_dtype.itemsize,
                                     global_scores=RUNTIME.config.decay > 0)
    stock = config.max_total_num_tokens
    try:
        plan = RUNTIME.plan_memory(
            shapes, stock_pool_tokens=stock, cell_bytes=cell,
            available_bytes=getattr(RUNTIME, "kv_memory_bytes", None) or stock * cell,
            max_running=config.max_running_requests, page=page, model=arch)
    except memory.NoRoom as e:
        logger.error("%s", e)  # the line to read above SGLang's traceback
        raise
    if plan.pool_tokens == stock:
        return config
    new = configurator.calculate_pool_sizes_from_max_tokens(plan.pool_tokens, page)
    new.max_running_requests = min(config.max_running_requests,
                                   kvc.resolve_max_num_reqs(new.max_total_num_tokens))
    new = configurator.finalize_with_max_running_requests(new)
    new.mem_fraction_static = config.mem_fraction_static
    return new


def _stash_mla_query(result, attention, *args, **kwargs):
    RUNTIME.stash_query(attention.layer_id, result[0])  # (q_nope, q_pe, k_pe)
    return result


def _capture_queries(original, layer, q, k, v, forward_batch, *args, **kwargs):
    if forward_batch.forward_mode.is_decode() and RUNTIME.ready:
        RUNTIME.capture(layer.layer_id, q, kwargs.get("q_rope"), forward_batch)
    return original(layer, q, k, v, forward_batch, *args, **kwargs)


def _logical_positions(result, cls, batch, *args, **kwargs):
    if batch is not None and result.forward_mode.is_decode() and RUNTIME.ready:
        offsets = RUNTIME.position_offsets(batch)
        if offsets is not None:
            result.positions = result.positions + offsets
    return result


def _flush_before_forward(original, worker, *args, **kwargs):
    RUNTIME.flush()
    return original(worker, *args, **kwargs)


def _compress_before_mem_check(batch, selected_indices=None):
    if selected_indices is None and RUNTIME.ready:
        RUNTIME.before_decode(batch)


def _room_for_waiting(scheduler, running_batch, *args, **kwargs):
    if RUNTIME.ready and RUNTIME.budget.elastic:
        RUNTIME.admit_pressure(scheduler.waiting_queue, running_batch,
                               scheduler.max_running_requests)


def _retract_compressed_last(original, reqs, server_args):
    order = original(reqs, server_args)
    # Most-preferred first; compressed requests go first (kept longest): their lossy
    # state can only be rebuilt by re-prefill plus a new compaction.
    return sorted(order, key=lambda i: not _is_compressed(reqs[i]))


def _running_reserve(original, adder, req):
    reserve = RUNTIME.running_reserve(req)
    if reserve is None:  # compression off for this request: SGLang's own estimate
        return RUNTIME.stock_reserve(req) * adder.new_token_ratio
    return reserve


def _reserve_shadow_slots(result, adder, *args, **kwargs):
    adder.rem_total_token_offset += RUNTIME.shadow_reserve()


def _count_shadow_slots(result, checker, *args, **kwargs):
    full, swa = result
    return full + RUNTIME.shadows.held, swa


def _evict_for(batch, num_tokens):
    from sglang.srt.mem_cache.common import evict_from_tree_cache

    evict_from_tree_cache(batch.tree_cache, num_tokens)


def _lift_pool_cap(original, scheduler, req):
    requested = req.sampling_params.max_new_tokens
    original(scheduler, req)
    budget = RUNTIME.budget_of(req)
    if budget is None:
        return  # compression off for this request: SGLang's cap stands
    page = scheduler.page_size
    paged_input = -(-len(req.origin_input_ids) // page) * page
    if paged_input + budget.admission_reserve() + page < scheduler.max_total_num_tokens:
        # The footprint is bounded by the budget, so only the model's context length
        # (logical positions) bounds the output, not the KV pool.
        cap = scheduler.model_config.context_len - 1 - len(req.origin_input_ids) - 1
        limit = scheduler.max_new_tokens_limit
        want = requested if requested is not None else 1 << 30
        if limit is not None and limit > 0:
            want = min(want, limit)
        req.sampling_params.max_new_tokens = max(0, min(want, cap))


def _release_window(pool, req):
    RUNTIME.on_release(req)


def _reset_on_retract(result, req):
    RUNTIME.on_retract(req)


def _physical_swa_eviction(original, batch, req, pre_len):
    # SGLang passes the logical length (req.seqlen - 1); the columns are physical.
    return original(batch, req, RUNTIME.physical_len(req, pre_len) if RUNTIME.ready else pre_len)


def _outputs_stay_private(original, req, tree_cache, **kwargs):
    """A retracted request re-prefills prompt + output. Inserted into the tree, the output
    would be shared, so never compressible: each retraction would grow the request's
    footprint past its budget. Its output KV stays its own; like SGLang's own
    cache_unfinished_req, the next chunk starts from all KV written so far."""
    n = len(req.get_fill_ids())
    if not (RUNTIME.ready and RUNTIME.keeps_outputs_private(req, n)):
        return original(req, tree_cache, **kwargs)
    import torch

    req.prefix_indices = tree_cache.req_to_token_pool.req_to_token[
        req.req_pool_idx, :n].to(dtype=torch.int64, copy=True)


def _report_state(result, scheduler, *args, **kwargs):
    running = scheduler.running_batch.reqs if scheduler.running_batch is not None else []
    report = RUNTIME.report(running)
    # The ranks that run the same requests: all TP ranks, or with DP attention the ranks of
    # this attention-TP group. Each of them handles this control request: gather what each did.
    tp = scheduler.attn_tp_group
    if tp.world_size > 1:
        from sglang_zipage import decisions

        report.update(decisions.across_ranks(RUNTIME.decisions.summary(), tp.cpu_group))
    result.internal_state["zipage"] = report
    return result


def _decode_log_parts(result, observer, *args, **kwargs):
    return result + RUNTIME.log_parts()


def _attach_meta_info(result, req, *args, **kwargs):
    from sglang_zipage import meta_info

    meta_info.attach(req)


def _fold_meta_info(original, tokenizer_manager, *args, **kwargs):
    from sglang_zipage import meta_info

    async def responses():
        async for out in original(tokenizer_manager, *args, **kwargs):
            meta_info.fold(out)
            yield out

    return responses()


def _request_budget_to_custom_params(tokenizer_manager, obj, *args, **kwargs):
    from sglang_zipage import request_budget

    if isinstance(getattr(obj, "sampling_params", None), dict):
        obj.sampling_params = request_budget.move_to_custom_params(
            obj.sampling_params, FRONTEND_CONFIG, tokenizer_manager.server_args.page_size or 1)


def _openai_extra_budget(result, request, *args, **kwargs):
    from sglang_zipage.request_budget import FIELD

    extra = getattr(request, "model_extra", None) or {}
    if FIELD in extra:
        result[FIELD] = extra[FIELD]
    return result


def _openai_completion_budget(result, serving, request):
    return _openai_extra_budget(result, request)


def _is_compressed(req) -> bool:
    st = getattr(req, "zipage", None)
    return st is not None and st.compactions > 0


def _hook_table():
    from sglang.srt.plugins.hook_registry import HookType as T

    return [
        # target, type, body, why (0.5.17 line)
        ("mem_cache.kv_cache_configurator.KVCacheConfigurator._profile_available_bytes",
         T.AFTER, _remember_kv_memory, "the memory SGLang sizes the KV pool from (L1614)"),
        ("mem_cache.kv_cache_configurator.KVCacheConfigurator._resolve_memory_pool_config",
         T.AROUND, _pool_makes_room,
         "zipage's buffers come out of the KV pool's memory, sized before it (L1774)"),
        ("model_executor.model_runner.ModelRunner.alloc_memory_pool", T.AFTER,
         _after_alloc_memory_pool, "allocate query window + global scores before graph capture (L769)"),
        ("models.deepseek_common.attention_forward_methods.forward_mla.DeepseekMLAForwardMixin."
         "_split_q_nope_pe", T.AFTER, _stash_mla_query,
         "MLA: the window keeps q_nope before absorption, a third of the bytes (L222)"),
        ("layers.radix_attention.RadixAttention.forward", T.AROUND, _capture_queries,
         "store post-RoPE decode queries; recorded into decode CUDA graphs (L150)"),
        ("model_executor.forward_batch_info.ForwardBatch.init_new", T.AFTER, _logical_positions,
         "RoPE positions stay logical while seq_lens are physical (L706, positions L904)"),
        ("managers.tp_worker.TpModelWorker.forward_batch_generation", T.AROUND,
         _flush_before_forward, "run planned compactions on the forward stream first (L558)"),
        ("managers.schedule_batch.ScheduleBatch.check_decode_mem", T.BEFORE,
         _compress_before_mem_check, "decide/plan compactions, free pages before the mem check (L2727)"),
        ("managers.scheduler.Scheduler.get_new_batch_prefill", T.BEFORE, _room_for_waiting,
         "elastic: running requests yield room to the first waiting request (L3067)"),
        ("managers.schedule_batch.ScheduleBatch._get_decode_retraction_order", T.AROUND,
         _retract_compressed_last, "retract uncompressed requests first (L2777)"),
        ("managers.schedule_policy.PrefillAdder._get_running_request_total_token_offset",
         T.AROUND, _running_reserve, "running requests reserve up to the budget only (L559)"),
        ("managers.schedule_policy.PrefillAdder.__init__", T.AFTER, _reserve_shadow_slots,
         "admission leaves room for asynchronous compactions' fresh slots (L445)"),
        ("managers.scheduler_components.invariant_checker.SchedulerInvariantChecker."
         "_get_total_uncached_sizes", T.AFTER, _count_shadow_slots,
         "the strict memory checker counts in-flight compactions' fresh slots as held (L224)"),
        ("managers.scheduler.Scheduler.init_req_max_new_tokens", T.AROUND, _lift_pool_cap,
         "no pool-size cap on output length (L2110)"),
        ("mem_cache.memory_pool.ReqToTokenPool.free", T.BEFORE, _release_window,
         "a leaving request gives back its query-window slot and an in-flight "
         "asynchronous compaction's fresh slots (L319)"),
        ("managers.schedule_batch.Req.reset_for_retract", T.AFTER, _reset_on_retract,
         "a retracted request re-prefills; its suffix starts over (L1603)"),
        ("managers.schedule_batch.ScheduleBatch._evict_swa", T.AROUND, _physical_swa_eviction,
         "sliding-window slots are freed by physical column, not logical length (L3264)"),
        ("mem_cache.common.maybe_cache_unfinished_req", T.AROUND, _outputs_stay_private,
         "re-prefilled output KV stays out of the tree, so it compresses again (L98)"),
        ("managers.scheduler.Scheduler.get_internal_state", T.AFTER, _report_state,
         "/server_info shows the active zipage config and counters (L4165)"),
        ("managers.schedule_batch.Req.__init__", T.AFTER, _attach_meta_info,
         "meta_info gets zipage_compactions / zipage_kv_len via customized_info (L1057)"),
        ("managers.scheduler_components.pool_stats_observer.PoolStats.get_decode_usage_msg_parts",
         T.AFTER, _decode_log_parts, "the periodic decode log line shows compression (L88)"),
    ]


def _frontend_hook_table():
    from sglang.srt.plugins.hook_registry import HookType as T

    return [
        ("managers.tokenizer_manager.TokenizerManager._wait_one_response", T.AROUND,
         _fold_meta_info, "one integer per zipage meta_info key, not a per-token list (L1662)"),
        ("managers.tokenizer_manager.TokenizerManager._create_tokenized_object", T.BEFORE,
         _request_budget_to_custom_params, "validate zipage_kv_budget (HTTP 400), carry it (L1314)"),
        ("entrypoints.openai.protocol.ChatCompletionRequest.to_sampling_params", T.AFTER,
         _openai_extra_budget, "OpenAI extra_body zipage_kv_budget (L984)"),
        ("entrypoints.openai.serving_completions.OpenAIServingCompletion._build_sampling_params",
         T.AFTER, _openai_completion_budget, "the same for /v1/completions (L141)"),
    ]


def _keep_openai_extra_fields() -> None:
    """Keep unknown request fields (model_extra) so extra_body reaches our hooks; must run
    before http_server builds its FastAPI routes from these models."""
    from sglang.srt.entrypoints.openai import protocol

    for model in (protocol.ChatCompletionRequest, protocol.CompletionRequest):
        if model.model_config.get("extra") != "allow":
            model.model_config["extra"] = "allow"
            model.model_rebuild(force=True)


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
    }


# ------------------------------------------------------------------- install
def apply_cpu_fixes() -> None:
    """SGLang 0.5.17 on a CPU-only PyPI install imports vllm's rotary kernel unless the
    rotary module believes it runs on CPU (see ../shared/design/cpu-notes.md)."""
    from sglang.srt.layers.rotary_embedding import base

    base._is_cpu = True


def install(config: Optional[ZipageConfig], *, device: Optional[str] = None,
            page_size: int = 1) -> None:
    """Activate zipage in this process (idempotent). config None/disabled = stock SGLang."""
    global RUNTIME, _INSTALLED
    import sglang

    if sglang.__version__ != SGLANG_VERSION:
        raise RuntimeError(f"sglang-zipage supports sglang=={SGLANG_VERSION}; "
                           f"found {sglang.__version__}")
    if device == "cpu":
        apply_cpu_fixes()
    if _INSTALLED or config is None or not config.enabled:
        return
    from sglang.srt.managers import schedule_policy
    from sglang_zipage.runtime import ZipageRuntime

    # SGLang's own output estimate stays for requests that opted out of compression ...
    RUNTIME = ZipageRuntime(config, evict=_evict_for,
                            stock_clip=schedule_policy.CLIP_MAX_NEW_TOKENS)
    # ... new requests reserve prompt + budget + buffer, not max_new_tokens (read at call time).
    schedule_policy.CLIP_MAX_NEW_TOKENS = config.kv_budget + config.buffer + page_size
    _apply(_hook_table())
    _INSTALLED = True
    logger.info("sglang-zipage active: %s", config.to_json())


def install_frontend(config: Optional[ZipageConfig]) -> None:
    """Hooks of the process that runs SGLang's tokenizer manager (HTTP server / Engine)."""
    global _FRONTEND_INSTALLED, FRONTEND_CONFIG
    if _FRONTEND_INSTALLED or config is None or not config.enabled:
        return
    FRONTEND_CONFIG = config
    _keep_openai_extra_fields()
    _apply(_frontend_hook_table())
    _FRONTEND_INSTALLED = True


def _apply(table) -> None:
    from sglang.srt.plugins.hook_registry import HookRegistry

    before = {t: _raw(_SRT + t) for t, *_ in table}
    for target, kind, body, _why in table:
        HookRegistry.register(_SRT + target, body, kind)
    HookRegistry.apply_hooks()
    missing = [t for t in before if _raw(_SRT + t) is before[t]]
    if missing:
        raise RuntimeError(f"sglang-zipage: hooks did not apply to {missing}")


def _raw(target: str):
    """The attribute as stored (classmethod/staticmethod objects unwrapped by identity)."""
    obj_path, attr = target.rsplit(".", 1)
    obj = pkgutil.resolve_name(obj_path)
    return obj.__dict__.get(attr) if isinstance(obj, type) else getattr(obj, attr)
