"""The SGLang boundary: every SGLang 0.5.17 internal that sglang-zipage hooks, in two tables.

One row per hook: target, hook type, why (with the 0.5.17 line). The bodies are thin and
live with the process they run in: scheduler_hooks.py (the scheduler: they call the
ZipageRuntime, runtime.py) and frontend.py (the tokenizer manager). ``install()`` runs inside
every SGLang scheduler process (through ``proc.run_scheduler_process`` or the
``sglang.srt.plugins`` entry point), registers the table with SGLang's HookRegistry, applies
it, and verifies that every target now carries our wrapper: ``apply_hooks`` only logs a bad
target and carries on.

The integration layer, where ``sglang.srt`` is imported: this module, scheduler_hooks.py and
frontend.py (the hooks), model_support.model_facts (SGLang's own ModelConfig, before any
weight loads), server_args.device_memory_bytes (SGLang's reading of the device's memory),
engine.py, launch_server.py, proc.py (SGLang's entry points) and forcing.py
(a custom logit processor). Everything else duck-types SGLang objects.
"""

from __future__ import annotations

import logging
import pkgutil
from typing import Optional

from sglang_zipage import frontend as fe
from sglang_zipage import scheduler_hooks as sh
from sglang_zipage.config import ZipageConfig

logger = logging.getLogger("sglang_zipage")

SGLANG_VERSION = "0.5.17"
_INSTALLED = False
_FRONTEND_INSTALLED = False

_SRT = "sglang.srt."


def _hook_table():
    from sglang.srt.plugins.hook_registry import HookType as T

    return [
        # target, type, body, why (0.5.17 line)
        ("mem_cache.kv_cache_configurator.KVCacheConfigurator._profile_available_bytes",
         T.AFTER, sh.remember_kv_memory, "the memory SGLang sizes the KV pool from (L1614)"),
        ("mem_cache.kv_cache_configurator.KVCacheConfigurator._resolve_memory_pool_config",
         T.AROUND, sh.pool_makes_room,
         "zipage's buffers come out of the KV pool's memory, sized before it (L1774)"),
        ("model_executor.model_runner.ModelRunner.alloc_memory_pool", T.AFTER,
         sh.after_alloc_memory_pool, "allocate query window + global scores before graph capture (L769)"),
        ("models.deepseek_common.attention_forward_methods.forward_mla.DeepseekMLAForwardMixin."
         "_split_q_nope_pe", T.AFTER, sh.stash_mla_query,
         "MLA: the window keeps q_nope before absorption, a third of the bytes (L222)"),
        ("layers.radix_attention.RadixAttention.forward", T.AROUND, sh.capture_queries,
         "store post-RoPE decode queries; recorded into decode CUDA graphs; a calibration "
         "run's prefill queries (L150)"),
        ("model_executor.forward_batch_info.ForwardBatch.init_new", T.AFTER, sh.logical_positions,
         "RoPE positions stay logical while seq_lens are physical (L706, positions L904)"),
        ("managers.tp_worker.TpModelWorker.forward_batch_generation", T.AROUND,
         sh.flush_before_forward, "run planned compactions on the forward stream first (L558)"),
        ("managers.schedule_batch.ScheduleBatch.check_decode_mem", T.BEFORE,
         sh.compress_before_mem_check, "decide/plan compactions, free pages before the mem check (L2727)"),
        ("managers.scheduler.Scheduler.get_new_batch_prefill", T.BEFORE, sh.room_for_waiting,
         "elastic: running requests yield room to the first waiting request (L3067)"),
        ("managers.schedule_batch.ScheduleBatch._get_decode_retraction_order", T.AROUND,
         sh.retract_compressed_last, "retract uncompressed requests first (L2777)"),
        ("managers.schedule_policy.PrefillAdder._get_running_request_total_token_offset",
         T.AROUND, sh.running_reserve,
         "a compressing request's growth is booked with the others' (next row), not alone (L559)"),
        ("managers.schedule_policy.PrefillAdder.__init__", T.AFTER, sh.book_running_growth,
         "admission books the running requests' growth at its peak, and the fresh slots of "
         "asynchronous compactions (L445)"),
        ("managers.schedule_policy.PrefillAdder.add_one_req", T.AROUND, sh.admit_by_peak,
         "a new request is charged what it adds to the booked peak, not budget + buffer (L1059)"),
        ("managers.scheduler_components.invariant_checker.SchedulerInvariantChecker."
         "_get_total_uncached_sizes", T.AFTER, sh.count_shadow_slots,
         "the strict memory checker counts in-flight compactions' fresh slots as held (L224)"),
        ("managers.scheduler.Scheduler.init_req_max_new_tokens", T.AROUND, sh.lift_pool_cap,
         "no pool-size cap on output length; a budget below the model's sliding window is "
         "refused, HTTP 400 (L2110, called for every new request at L2529)"),
        ("mem_cache.memory_pool.ReqToTokenPool.free", T.BEFORE, sh.release_window,
         "a leaving request gives back its query-window slot and an in-flight "
         "asynchronous compaction's fresh slots (L319)"),
        ("managers.schedule_batch.Req.reset_for_retract", T.AFTER, sh.reset_on_retract,
         "a retracted request re-prefills; its suffix starts over (L1603)"),
        ("managers.schedule_batch.ScheduleBatch._evict_swa", T.AROUND, sh.physical_swa_eviction,
         "sliding-window slots are freed by physical column, not logical length (L3264)"),
        ("mem_cache.common.maybe_cache_unfinished_req", T.AROUND, sh.outputs_stay_private,
         "re-prefilled output KV stays out of the tree, so it compresses again (L98)"),
        ("managers.scheduler.Scheduler.get_internal_state", T.AFTER, sh.report_state,
         "/server_info shows the active zipage config and counters (L4165)"),
        ("managers.schedule_batch.Req.__init__", T.AFTER, sh.attach_meta_info,
         "meta_info gets zipage_compactions / zipage_kv_len via customized_info (L1057)"),
        ("managers.scheduler_components.pool_stats_observer.PoolStats.get_decode_usage_msg_parts",
         T.AFTER, sh.decode_log_parts, "the periodic decode log line shows compression (L88)"),
    ]


def _speculative_hook_table(algorithm: Optional[str]):
    """Speculative decoding (docs/internals/sglang-speculative.md): the draft reads its pool
    and the verify snapshots its KV index inside the speculative worker, before the target's
    forward; the overlap scheduler reads a step's lengths from the device. Harmless without
    it (the workers never run; the length hook passes a batch without draft through)."""
    from sglang.srt.plugins.hook_registry import HookType as T

    rows = [
        ("speculative.eagle_worker_v2.EAGLEWorkerV2.forward_batch_generation", T.AROUND,
         sh.flush_before_forward, "EAGLE, EAGLE3, NEXTN, STANDALONE: compactions run before "
         "the draft reads its pool (L1103)"),
        ("managers.overlap_utils.FutureMap.resolve_seq_lens_cpu", T.AROUND,
         sh.published_lengths, "a step's lengths come from the device's last publish, "
         "before the compactions since (L412)"),
        ("layers.attention.flashinfer_backend.FlashInferMultiStepDraftBackend.common_template",
         T.AROUND, sh.physical_draft_lengths, "the draft's KV index is laid out by its "
         "positions, read as physical lengths (L2260)"),
        ("layers.attention.triton_backend.TritonMultiStepDraftBackend.common_template",
         T.AROUND, sh.physical_draft_lengths, "the same for the Triton backend (L1912)"),
    ]
    if algorithm == "NGRAM":  # (its module needs the GPU build of sgl_kernel to import)
        rows.append(("speculative.ngram_worker.NGRAMWorker.forward_batch_generation", T.AROUND,
                     sh.flush_before_forward, "NGRAM: compactions before its verify (L403)"))
    return rows


def _pd_decode_hook_table():
    """A PD decode server (docs/internals/sglang-pd-hicache.md): its own request pool, and a
    retraction that copies a request's KV to host and restores it instead of re-prefilling."""
    from sglang.srt.plugins.hook_registry import HookType as T

    return [
        ("disaggregation.decode.DecodeReqToTokenPool.free", T.BEFORE, sh.release_window,
         "the decode server's request pool is not a ReqToTokenPool (L186)"),
        ("managers.schedule_batch.Req.offload_kv_cache", T.AROUND, sh.offload_physical,
         "a retraction copies the columns a request holds, not its logical length (L1648)"),
        ("managers.schedule_batch.Req.load_kv_cache", T.AROUND, sh.load_physical,
         "and copies them back into as many (L1657)"),
        ("disaggregation.decode.DecodePreallocQueue._pre_alloc_fill_len", T.AROUND,
         sh.physical_fill_len, "a resumed request is preallocated its columns (L638)"),
        ("disaggregation.decode_schedule_batch_mixin.ScheduleBatchDisaggregationDecodeMixin."
         "prepare_for_prebuilt", T.AFTER, sh.physical_prebuilt,
         "the batch that resumes it carries its physical length (L25)"),
        ("disaggregation.decode.DecodePreallocQueue._active_reserved_tokens", T.AROUND,
         sh.decode_reserve, "admission books the running compressing requests at their "
         "growth's peak, not 512 tokens each (L1341)"),
        ("disaggregation.decode.DecodePreallocQueue.pop_preallocated", T.AROUND,
         sh.decode_admission_pass, "a newcomer's output estimate is what it adds to the "
         "running requests' peak, not min(max_new_tokens, 4096) (L1059)"),
        ("disaggregation.decode.DecodePreallocQueue._rebootstrap_prefill_len", T.AROUND,
         sh.decode_newcomer_charge, "the pass asks it first of each newcomer (L1011)"),
        ("disaggregation.decode.DecodePreallocQueue._need_space_for_single_req", T.AROUND,
         sh.decode_single_request_room, "room for the largest running request to end alone: "
         "a compressing one's ends at its limit, not at prompt + max_new_tokens (L1315)"),
        ("disaggregation.decode.DecodePreallocQueue._swa_aware_allocatable_token_budgets",
         T.AROUND, sh.decode_running_estimate, "and with sliding-window layers (L1444)"),
    ]


def _frontend_hook_table():
    from sglang.srt.plugins.hook_registry import HookType as T

    return [
        ("managers.tokenizer_manager.TokenizerManager._wait_one_response", T.AROUND,
         fe.fold_meta_info, "one integer per zipage meta_info key, not a per-token list (L1662)"),
        ("managers.tokenizer_manager.TokenizerManager._create_tokenized_object", T.BEFORE,
         fe.request_options_to_custom_params,
         "validate zipage_kv_budget / _think_end / _answer_budget (HTTP 400), carry them (L1314)"),
        ("entrypoints.openai.protocol.ChatCompletionRequest.to_sampling_params", T.AFTER,
         fe.openai_extra_budget, "OpenAI extra_body zipage options (L984)"),
        ("entrypoints.openai.serving_completions.OpenAIServingCompletion._build_sampling_params",
         T.AFTER, fe.openai_completion_budget, "the same for /v1/completions (L141)"),
        ("entrypoints.engine._wait_for_scheduler_ready", T.AROUND, fe.scheduler_refusals,
         "a scheduler that cannot fit zipage's buffers says why on its init pipe (L1688)"),
    ]


# ------------------------------------------------------------------- install
def apply_cpu_fixes() -> None:
    """SGLang 0.5.17 on a CPU-only PyPI install imports vllm's rotary kernel unless the
    rotary module believes it runs on CPU (see ../shared/design/cpu-notes.md)."""
    from sglang.srt.layers.rotary_embedding import base

    base._is_cpu = True


def install(config: Optional[ZipageConfig], *, device: Optional[str] = None,
            page_size: int = 1, speculative: Optional[str] = None,
            pd_mode: Optional[str] = None) -> None:
    """Activate zipage in this process (idempotent). config None/disabled = stock SGLang.
    ``speculative``: the --speculative-algorithm, if any; ``pd_mode``: the
    --disaggregation-mode (a prefill server decodes nothing: it runs stock)."""
    global _INSTALLED
    import sglang

    if sglang.__version__ != SGLANG_VERSION:
        raise RuntimeError(f"sglang-zipage supports sglang=={SGLANG_VERSION}; "
                           f"found {sglang.__version__}")
    if device == "cpu":
        apply_cpu_fixes()
    if _INSTALLED or config is None or not config.enabled or pd_mode == "prefill":
        return
    from sglang.srt.managers import schedule_policy
    from sglang_zipage.budget import Budget
    from sglang_zipage.runtime import ZipageRuntime

    # SGLang's own output estimate stays for requests that opted out of compression ...
    sh.RUNTIME = ZipageRuntime(config, evict=sh.evict_for,
                               stock_clip=schedule_policy.CLIP_MAX_NEW_TOKENS)
    # ... new requests reserve prompt + budget + buffer, not max_new_tokens (read at call time).
    schedule_policy.CLIP_MAX_NEW_TOKENS = Budget.from_config(config, page_size).admission_reserve()
    _apply(_hook_table() + _speculative_hook_table(speculative)
           + (_pd_decode_hook_table() if pd_mode == "decode" else []))
    _INSTALLED = True
    logger.info("sglang-zipage active: %s", config.to_json())


def install_frontend(config: Optional[ZipageConfig]) -> None:
    """Hooks of the process that runs SGLang's tokenizer manager (HTTP server / Engine)."""
    global _FRONTEND_INSTALLED
    if _FRONTEND_INSTALLED or config is None or not config.enabled:
        return
    fe.CONFIG = config
    fe.keep_openai_extra_fields()
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
