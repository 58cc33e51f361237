"""The engines benchmarks start: model folders and ``sglang_zipage.Engine`` keywords.

Every benchmark engine runs dummy weights on a folder holding only a config.json
(``benchmarks/models/``; ``tiny_model_dir()`` writes a 2-layer Qwen3 for CPU runs), takes
and returns token ids (no tokenizer), samples with the pytorch sampler and has no grammar
backend: ``dummy_engine_kwargs``. Both sides of a comparison are ``sglang_zipage.Engine``:
"stock" passes ``zipage_enabled=False``, which installs no hook at all (only, on a machine
without a GPU, the CPU import fix stock SGLang 0.5.17 needs to start there), so SGLang's own
code runs; "zipage" passes ``zipage_<field>=value`` (``zipage_kwargs``).

``add_engine_args`` / ``engine_kwargs`` / ``warm_up``: the engine flags of bench_throughput.py
and step_profile.py and what they make of them.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import tempfile
import time
from typing import Dict, Iterable, Tuple

from sglang_zipage.harness.record import REPO

MODELS = os.path.join(REPO, "benchmarks", "models")
DEFAULT_MODEL = os.path.join(MODELS, "qwen3-8b-dummy")  # Qwen3-8B's shape
# Config overrides of a benchmark model beyond its layer count (coverage.py, pd_check.py):
# DeepSeek-V3's attention (128 query heads, the MLA latent, q_lora) is kept whole; its one MoE
# layer gets 32 of its 256 routed experts, so that engines can run side by side on one GPU
# (zipage touches attention only).
SHAPE_OVERRIDES = {"deepseek-v3": {"n_routed_experts": 32}}


def shape_override(model_dir: str, layers: int) -> Dict:
    """The config fields a benchmark changes in a model folder's shape: its layer count, the
    folder's SHAPE_OVERRIDES, and per-layer kinds (gpt-oss's layer_types) cut to ``layers``."""
    override = {"num_hidden_layers": layers,
                **SHAPE_OVERRIDES.get(os.path.basename(os.path.normpath(model_dir)), {})}
    cfg = model_config(model_dir)
    if "layer_types" in cfg:
        override["layer_types"] = cfg["layer_types"][:layers]
    return override
TINY_CONFIG = dict(hidden_size=256, intermediate_size=512, num_hidden_layers=2,
                   num_attention_heads=4, num_key_value_heads=2, head_dim=64,
                   vocab_size=32000, max_position_embeddings=40960, max_window_layers=2,
                   tie_word_embeddings=True, bos_token_id=1, eos_token_id=2)
TINY_NAME = "tiny 2-layer Qwen3: sglang_zipage.harness.engines.tiny_model_dir()"


# ---------------------------------------------------------------- models
def tiny_model_dir() -> str:
    """A 2-layer Qwen3 config (dummy weights) in a fresh temp folder (the caller removes it):
    fast on a CPU, where the model's quality does not matter."""
    with open(os.path.join(MODELS, "qwen3-1.7b-dummy", "config.json")) as f:
        cfg = json.load(f)
    cfg.update(TINY_CONFIG)
    folder = tempfile.mkdtemp(prefix="qwen3-tiny-dummy-")
    with open(os.path.join(folder, "config.json"), "w") as f:
        json.dump(cfg, f, indent=1)
    return folder


def model_config(model_dir: str) -> Dict:
    with open(os.path.join(model_dir, "config.json")) as f:
        return json.load(f)


def write_config(cfg: Dict, folder: str) -> str:
    """``folder`` (made if missing) holding ``cfg`` as its config.json, written whole (runs side
    by side may write the same folder). A model whose changed shape a speculative draft must
    read too needs one: SGLang applies --json-model-override-args to the draft's config as well."""
    os.makedirs(folder, exist_ok=True)
    tmp = os.path.join(folder, f"config.json.{os.getpid()}")
    with open(tmp, "w") as f:
        json.dump(cfg, f, indent=1)
    os.replace(tmp, os.path.join(folder, "config.json"))
    return folder


def vocab_size(model_dir: str) -> int:
    return model_config(model_dir)["vocab_size"]


# --------------------------------------------------------------- keywords
def on_gpu(device=None) -> bool:
    import torch

    return device != "cpu" and torch.cuda.is_available()


def dummy_engine_kwargs(model_path: str, page_size: int = 1, seed: int = 0,
                        log_level: str = "info", **more) -> Dict:
    """The keywords every benchmark engine shares, plus ``more``."""
    return dict(model_path=model_path, load_format="dummy", skip_tokenizer_init=True,
                sampling_backend="pytorch", grammar_backend="none", page_size=page_size,
                random_seed=seed, log_level=log_level, **more)


def zipage_kwargs(which: str, options: Dict) -> Dict:
    """stock: ``zipage_enabled=False``; zipage: ``zipage_<field>=value`` per ZipageConfig
    field in ``options``."""
    if which == "stock":
        return {"zipage_enabled": False}
    return {f"zipage_{k}": v for k, v in options.items()}


def start_engine(which: str, kw: Dict, options: Dict, log=print) -> Tuple[object, float]:
    """A stock or zipage ``sglang_zipage.Engine`` on ``kw``; (engine, seconds to start)."""
    from sglang_zipage import Engine

    extra = zipage_kwargs(which, options)
    log(f"starting {which} engine: {kw} {extra}")
    t0 = time.perf_counter()
    engine = Engine(**kw, **extra)
    return engine, time.perf_counter() - t0


def parse_engine_args(items: Iterable[str]) -> Dict:
    """KEY=VALUE pairs (``--engine-arg``) as Engine keywords; VALUE is JSON when it parses."""
    out = {}
    for item in items:
        k, _, v = item.partition("=")
        try:
            v = json.loads(v)
        except ValueError:
            pass
        out[k] = v
    return out


# ------------------------------------------------------ the engine flags
def add_engine_args(p: argparse.ArgumentParser) -> None:
    """The flags of the model, the engine and its warm-up (bench_throughput.py, step_profile.py)."""
    a = p.add_argument
    a("--model", default=DEFAULT_MODEL, help="folder with a config.json (dummy weights)")
    a("--tiny", action="store_true", help="2-layer small Qwen3 written to a temp folder (CPU checks)")
    a("--device", default=None, help="default: cuda if available, else cpu")
    a("--attention-backend", default=None, help="default: triton on GPU, torch_native on CPU")
    a("--mem-fraction-static", type=float, default=None, help="default 0.85 on GPU")
    a("--max-total-tokens", type=int, default=None, help="KV pool size (default: SGLang's; 4096 with --tiny)")
    a("--max-running-requests", type=int, default=None)
    a("--kv-cache-dtype", default="auto", help="SGLang's --kv-cache-dtype (both engines), "
      "e.g. fp8_e4m3; a load's JSON entry records it and merges key on it")
    a("--page-size", type=int, default=1)
    a("--chunked-prefill-size", type=int, default=None)
    a("--tp-size", type=int, default=None, help="SGLang tensor parallel (GPUs per replica)")
    a("--dp-size", type=int, default=None, help="SGLang data parallel (replicas)")
    a("--disable-cuda-graph", action="store_true")
    a("--disable-overlap-schedule", action="store_true")
    a("--disable-prefill-cuda-graph", action="store_true",
      help="saves ~45 s of engine start on the H200 (decode graphs stay on)")
    a("--cuda-graph-max-bs", type=int, default=512, help="decode CUDA graphs up to this batch (both engines)")
    a("--stream-interval", type=int, default=8, help="tokens between streamed chunks (sampling param)")
    a("--zipage-kv-budget", type=int, default=2048)
    a("--zipage-buffer", type=int, default=256)
    a("--zipage-option", action="append", default=[], metavar="NAME=VALUE",
      help="any other ZipageConfig field, e.g. redundancy=lightning (repeatable)")
    a("--warmup-requests", type=int, default=None,
      help="default 40 on GPU (1 + 39 later: zipage compacts batches of 1, 32 and 7, the "
           "Triton specialisations seen under load), 8 on CPU")
    a("--warmup-output-len", type=int, default=None,
      help="default: zipage budget + 2 buffers + 32 (two compactions each, so the kernels "
           "compile before timing); stock 64")
    a("--seed", type=int, default=0)
    a("--log-level", default="info")


def zipage_options(args) -> Dict:
    """ZipageConfig fields from --zipage-kv-budget, --zipage-buffer and --zipage-option."""
    from sglang_zipage.config import ZipageConfig

    fields = {f.name: f for f in dataclasses.fields(ZipageConfig)}
    opts = {"kv_budget": args.zipage_kv_budget, "buffer": args.zipage_buffer}
    for item in args.zipage_option:
        name, _, text = item.partition("=")
        if name not in fields:
            raise SystemExit(f"--zipage-option {item}: unknown field; known {sorted(fields)}")
        typ = {"int": int, "float": float, "str": str, "bool": lambda s: s.lower() in ("1", "true")}
        opts[name] = typ[fields[name].type if isinstance(fields[name].type, str)
                         else fields[name].type.__name__](text)
    return opts


def engine_kwargs(args, model_dir: str) -> Dict:
    """Engine keywords from the engine flags (defaults for a GPU where it has one)."""
    kw = dummy_engine_kwargs(model_dir, page_size=args.page_size, seed=args.seed,
                             log_level=args.log_level)
    gpu = on_gpu(args.device)
    if args.device:
        kw["device"] = args.device
    if args.attention_backend or gpu:
        kw["attention_backend"] = args.attention_backend or "triton"
    if args.mem_fraction_static is not None or gpu:
        kw["mem_fraction_static"] = args.mem_fraction_static or 0.85
    max_total = args.max_total_tokens or (4096 if args.tiny else None)
    if max_total:
        kw["max_total_tokens"] = max_total
    if args.kv_cache_dtype != "auto":
        kw["kv_cache_dtype"] = args.kv_cache_dtype
    for name in ("max_running_requests", "chunked_prefill_size", "tp_size", "dp_size"):
        if getattr(args, name) is not None:
            kw[name] = getattr(args, name)
    if args.disable_overlap_schedule:
        kw["disable_overlap_schedule"] = True
    if gpu:
        if args.disable_cuda_graph:
            kw["disable_cuda_graph"] = True
        else:
            kw["cuda_graph_max_bs_decode"] = args.cuda_graph_max_bs
        if args.disable_prefill_cuda_graph:
            kw["disable_prefill_cuda_graph"] = True
    return kw


def warm_up(engine, which: str, args, input_len: int, vocab: int) -> Tuple[int, int]:
    """--warmup-requests requests of --warmup-output-len tokens (defaults in their help);
    returns (requests, output length)."""
    from sglang_zipage.harness.loads import warmup

    out_len = args.warmup_output_len or (
        args.zipage_kv_budget + 2 * args.zipage_buffer + 32 if which == "zipage" else 64)
    n_warm = args.warmup_requests or (40 if on_gpu(args.device) else 8)
    engine.loop.run_until_complete(warmup(engine, n_warm, out_len, input_len, vocab, args.seed))
    return n_warm, out_len
