"""SGLang server arguments under zipage: our defaults, and what we refuse.

Defaults apply only to flags the user did not give; every one can be overridden.
- No --model-path: the bundled SmolLM2-135M-Instruct (model.py).
- No GPU: SGLang's CPU path with the settings measured in cpu-notes.md, and the outlines
  grammar backend: SGLang's default (xgrammar) allocates its token bitmask with CUDA, so one
  regex/JSON-constrained request kills a CPU scheduler (0.5.17, xgrammar_backend.py L64);
  llguidance runs on CPU but misreads the bundled tokenizer's byte-level spaces.
- Zipage on a GPU: an attention backend our compression supports (flashinfer), and decode
  CUDA graphs up to the batch a budget lets run (graph_max_bs: SGLang captures up to 256 on
  an H200, and past the largest graph decode runs eagerly: 72 ms a step at 657 requests on
  the H200 where the step line with graphs gives ~46, steady-8k-r05-warm-prompt-min1024-h200.json).
With --zipage-disable only the CPU and model defaults apply: stock SGLang behaviour.
"""

from __future__ import annotations

import os
from typing import Dict, List, Optional

from sglang_zipage import speculative
from sglang_zipage.config import ZipageConfig

SUPPORTED_BACKENDS = ("flashinfer", "triton", "torch_native")
GPU_GRAPH_MAX_BS = 512  # at one budget: 2048 + 256 runs ~300-380 requests on an H200
GPU_GRAPH_MAX_BS_CAP = 1024
CPU_DEFAULTS = {"device": "cpu", "attention_backend": "torch_native",
                "max_total_tokens": 8192, "sleep_on_idle": True, "grammar_backend": "outlines"}


def default_overrides(given: Dict, config: ZipageConfig, *, has_cuda: bool) -> Dict:
    """ServerArgs field -> value for every default that applies.

    given: the fields the user set (name -> value); they are never overridden."""
    out = {}
    if "model_path" not in given:
        from sglang_zipage.model import bundled_model_path

        out["model_path"] = bundled_model_path()
    on_cpu = given["device"] == "cpu" if "device" in given else not has_cuda
    if on_cpu:
        out.update({k: v for k, v in CPU_DEFAULTS.items() if k not in given})
    elif config.enabled:
        if "attention_backend" not in given:
            out["attention_backend"] = "flashinfer"
        # (not under speculative decoding: a verify graph holds each request's draft tokens,
        # and flashinfer's split-KV scratch for one at batch 512 outgrows the 512 MB SGLang
        # gives it for Qwen3, speculative-steady-cap512-attempt-h100.json: SGLang's own sizing)
        if (not {"cuda_graph_max_bs_decode", "cuda_graph_bs_decode"} & set(given)
                and not given.get("speculative_algorithm")):
            out["cuda_graph_max_bs_decode"] = graph_max_bs(config)
    return out


def graph_max_bs(config: ZipageConfig) -> int:
    """The largest decode CUDA graph zipage captures by default on a GPU. A budget range lets
    about budget / floor times as many requests run as one budget does (those squeezed hold
    their floor: 657 requests at floor 1024 with prompts compressed, 331 at budget 2048, 8k
    outputs on the H200), so the graphs grow by that factor, to SGLang's next graph size
    (steps of 32 past 512), at most 1024: SGLang sets 2 MB of GPU memory aside per graph
    batch when it sizes the pool itself (no --mem-fraction-static), and capture time grows
    with the graph count."""
    floor = config.min_kv_budget or config.kv_budget
    scaled = -(-GPU_GRAPH_MAX_BS * config.kv_budget // floor)
    return min(GPU_GRAPH_MAX_BS_CAP, max(GPU_GRAPH_MAX_BS, -(-scaled // 32) * 32))


def set_process_env(device: str, page_size: int = 1) -> None:
    if device == "cpu":
        # Two OpenMP threads thrash on a 2-core machine as soon as anything else runs.
        os.environ.setdefault("OMP_NUM_THREADS", "1")
        # A PD prefill server sends a prompt's cached prefix early, after recording a CUDA
        # event on the overlap scheduler's stream: on the CPU that raises ("expected stream to
        # be a torch.Stream"), whenever a prompt's chunk or its tree's match precedes the rest.
        # Without the early send the whole prompt's KV goes at its last chunk.
        os.environ.setdefault("SGLANG_DISAGG_PREFILL_EARLY_SEND_CACHED_PREFIX", "0")
        if (page_size or 1) > 1:
            # SGLang's paged allocator is a Triton kernel: without a GPU it only runs in
            # Triton's interpreter (else the first prefill dies with "0 active drivers").
            os.environ.setdefault("TRITON_INTERPRET", "1")


def incompatibilities(server_args, config: ZipageConfig, invalid=()) -> List[str]:
    """Reasons this SGLang configuration cannot run with zipage on (empty = fine), after
    ``invalid``: what validating the config found (launch_server.prepare, Engine)."""
    if not config.enabled:
        return []
    bad = list(invalid)
    if server_args.disaggregation_mode != "prefill":
        # (a PD prefill server decodes nothing: it runs SGLang's own scheduler, hooks.install,
        # so nothing zipage refuses applies to it; its decode server is checked there)
        bad += refusals(server_args, config)
    if bad:
        bad.append("pass --zipage-disable to run stock SGLang with these settings")
    return bad


def refusals(server_args, config: ZipageConfig) -> List[str]:
    """What zipage cannot run beside on a server that decodes."""
    a, bad = server_args, []
    for name in ("attention_backend", "decode_attention_backend"):
        v = getattr(a, name, None)
        if v is not None and v not in SUPPORTED_BACKENDS:
            bad.append(f"--{name.replace('_', '-')} {v}: zipage supports "
                       f"{', '.join(SUPPORTED_BACKENDS)}")
    checks = [
        (a.enable_mixed_chunk, "--enable-mixed-chunk (mixes logical positions with KV lengths)"),
        (a.enable_hierarchical_cache and a.device == "cpu", "--enable-hierarchical-cache on "
         "the CPU (SGLang's host pool pins its memory with cudaHostRegister and copies with "
         "sgl_kernel's CUDA kernels: HiCache runs on a GPU)"),
        (a.enable_hierarchical_cache and config.async_compaction, "--zipage-async with "
         "--enable-hierarchical-cache (a load from host, on HiCache's own stream, may fill a "
         "slot that a compaction on the side stream still reads)"),
        (a.pp_size != 1, "--pp-size > 1 (pipeline parallelism)"),
        (a.enable_torch_compile, "--enable-torch-compile"),
    ]
    bad += [f"{what} is not supported" for cond, what in checks if cond]
    bad += pd_refusals(a)
    bad += speculative.refusals(a, config)
    bad += model_refusals(a, config)
    return bad


def pd_refusals(server_args) -> List[str]:
    """PD disaggregation: the decode server compresses (docs/scale-out.md); a prefill server
    decodes nothing, so it runs SGLang's own scheduler (hooks.install), with zipage's request
    options accepted. What a decode server cannot run yet, by name (speculative decoding there:
    speculative.refusals; HiCache there runs, benchmarks/results/pd-check-hicache-h100.json)."""
    a = server_args
    if a.disaggregation_mode != "decode":
        return []
    checks = [
        (a.disaggregation_decode_enable_offload_kvcache,
         "--disaggregation-decode-enable-offload-kvcache",
         "it stores a request's KV to host by token position, which a compressed request no "
         "longer holds"),
    ]
    return [f"{flag} is not supported with zipage yet: {why}" for cond, flag, why in checks if cond]


def model_refusals(server_args, config: ZipageConfig) -> List[str]:
    """What the model itself rules out (model_support.py), read from its config before
    any weight loads, then a memory plan no start on this device could fit. A config SGLang
    cannot read is left for SGLang to report."""
    from sglang_zipage import model_support

    a = server_args
    try:
        facts = model_support.model_facts(a.model_path, trust_remote_code=a.trust_remote_code,
                                  revision=a.revision,
                                  model_override_args=a.json_model_override_args,
                                  disable_hybrid_swa_memory=a.disable_hybrid_swa_memory)
    except Exception:  # noqa: BLE001 - SGLang's own startup names the problem
        return []
    return (model_support.refusals(facts, config, server_args)
            or memory_refusals(facts, config, server_args))


def memory_refusals(facts: dict, config: ZipageConfig, server_args) -> List[str]:
    """memory.py M5 before anything starts: the plan with all of the device's memory, for a
    model whose every attention layer is scored and whose query rows are its heads (MHA/GQA,
    no sliding window). The shapes are the scheduler's (kv_layout.buffer_shapes), read from
    the config with SGLang's rules (heads split over --tp-size; KV heads at least one per
    rank); the pool's bytes per token as SGLang's configurator counts them. Everything else
    (MLA, sliding windows) the scheduler plans once the model is built (proc.Refused)."""
    from sglang_zipage import memory

    a = server_args
    if facts["mla"] or facts["sliding_window"] or facts["hybrid_swa"] or not facts["head_dim"]:
        return []
    device = device_memory_bytes(a.device)
    if device is None:
        return []
    kv_heads = max(1, facts["kv_heads"] // a.tp_size)
    shapes = memory.BufferShapes(
        scored_layers=facts["layers"], kv_heads=kv_heads,
        query_heads=max(1, facts["query_heads"] // a.tp_size), query_width=facts["head_dim"],
        query_bytes=facts["dtype_bytes"], global_scores=config.decay > 0)
    kv_bytes = 1 if str(a.kv_cache_dtype).startswith("fp8") else facts["dtype_bytes"]
    try:
        memory.plan_before_start(
            shapes, cell_bytes=facts["layers"] * kv_heads * facts["kv_row_elements"] * kv_bytes,
            device_bytes=device, max_total_tokens=a.max_total_tokens,
            limit=config.kv_budget + config.buffer,
            window=config.window, page=a.page_size or 1, share=config.memory_fraction,
            model=facts["architecture"])
    except memory.NoRoom as e:
        return [str(e)]
    return []


def device_memory_bytes(device: str) -> Optional[int]:
    """All of one device's memory as SGLang reads it without touching the device
    (nvidia-smi; on a CPU, the RAM of one NUMA node, of which SGLang's CPU path sizes the
    pool), None where unknown: more than SGLang can ever give the KV pool."""
    from sglang.srt.utils.common import get_cpu_memory_capacity, get_device_memory_capacity

    try:
        mib = get_cpu_memory_capacity() if device == "cpu" else get_device_memory_capacity(device)
    except Exception:  # noqa: BLE001 - unknown: the scheduler plans with what it profiles
        return None
    return int(mib * (1 << 20)) if mib else None


def decode_graph_max_bs(server_args, device) -> Optional[int]:
    """The largest decode batch SGLang captured a CUDA graph for; None where decode has none."""
    decode = server_args.cuda_graph_config.decode
    if device.type != "cuda" or server_args.disable_cuda_graph or decode.backend == "disabled":
        return None
    return max(decode.bs) if decode.bs else decode.max_bs
