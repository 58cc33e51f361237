"""``python -m sglang_zipage.calibrate``: the calibrated scorer's query statistics of a model.

Runs the model over the texts shipped in calibration_texts.json (prose and math by default;
disjoint from the fidelity benchmark's texts) in chunks, collects every layer's pre-RoPE
queries and writes their statistics (query_stats.py: K centroids per head, the mean and the
pair magnitudes) to a safetensors file that ``--zipage-scorer calibrated`` loads:

  python -m sglang_zipage.calibrate --model-path M --out M/zipage_query_stats.safetensors

A server looks for its statistics in --zipage-query-stats, else the bundled model's own
(shipped beside this module), else MODEL_PATH/zipage_query_stats.safetensors. The model runs
through transformers with its own modules (harness/fidelity/hf_reference.py's loop: Llama-style
attention, q_proj and rotate_half RoPE), on the CPU in about a minute for the bundled model.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import List, Optional, Sequence

HERE = Path(__file__).parent
TEXTS = HERE / "calibration_texts.json"
BUNDLED_STATS = HERE / "query_stats_smollm2_135m.safetensors"
FILE_NAME = "zipage_query_stats.safetensors"
QUERIES = 64  # centroids per head (fidelity-calibrated-cpu.json: 16 costs what the window does)
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


def calibrate(model_path: str, queries: int = QUERIES, domains: Sequence[str] = DOMAINS,
              chunk: int = 1024, device: str = "cpu", dtype: str = "float32"):
    """QueryStats of the model over the calibration texts."""
    import torch
    from transformers import AutoTokenizer

    from sglang_zipage.harness.fidelity.hf_reference import HFReference

    tok = AutoTokenizer.from_pretrained(model_path)
    parts = chunks(lambda t: tok(t, add_special_tokens=False)["input_ids"], domains, chunk)
    ref = HFReference(model_path, dtype=getattr(torch, dtype), device=device)
    meta = {"model": os.path.basename(os.path.normpath(model_path)), "domains": list(domains), "chunk": chunk, "queries": queries,
            "texts": str(TEXTS.name)}
    return ref.calibrate(parts).stats(queries, meta)


def main(argv: Optional[List[str]] = None) -> None:
    p = argparse.ArgumentParser(prog="python -m sglang_zipage.calibrate",
                                description=__doc__.split("\n\n")[0])
    p.add_argument("--model-path", default=None, help="default: the bundled SmolLM2-135M")
    p.add_argument("--out", default=None, help=f"default: MODEL_PATH/{FILE_NAME}")
    p.add_argument("--queries", type=int, default=QUERIES, help="centroids per head (K)")
    p.add_argument("--domains", default=",".join(DOMAINS),
                   help="calibration texts: prose, math, code (comma-separated)")
    p.add_argument("--chunk", type=int, default=1024, help="tokens per forward")
    p.add_argument("--device", default="cpu")
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    args = p.parse_args(argv)
    if args.queries < 1:
        p.error("--queries must be at least 1")
    from sglang_zipage.model import bundled_model_path

    model = args.model_path or bundled_model_path()
    out = Path(args.out) if args.out else Path(model) / FILE_NAME
    stats = calibrate(model, args.queries, args.domains.split(","), args.chunk, args.device,
                      args.dtype)
    stats.save(str(out))
    print(f"wrote {out}: {stats.centroids.shape[0]} layers x {stats.centroids.shape[1]} heads "
          f"x {stats.centroids.shape[2]} queries over {stats.tokens} tokens", file=sys.stderr)


if __name__ == "__main__":
    main()
