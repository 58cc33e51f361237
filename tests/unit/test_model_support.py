"""Which models zipage compresses, decided from the config before any weight loads (issue 15).

Each model is a folder holding only config.json (benchmarks/models/ for the families of
the GPU coverage matrix, small ones written here for the classes refused by design), read
through SGLang's own ModelConfig and pool classifiers (model_support.model_facts). Every refused
class has a test: the refusal names the model, what it has, and the way out.
Run: .venv/bin/python -m pytest tests/unit/test_model_support.py
"""

import json
from types import SimpleNamespace

import pytest

from sglang_zipage import model_support
from sglang_zipage.config import ZipageConfig

from pathlib import Path

MODELS = Path(__file__).resolve().parents[2] / "benchmarks" / "models"
SMALL = ZipageConfig(kv_budget=256, buffer=64)
# Minimal configs of the classes refused by design (no weights: nothing loads).
REFUSED = {
    "deepseek-v3.2": ({"architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3",
                       "index_topk": 2048, "index_head_dim": 128, "index_n_heads": 64,
                       "kv_lora_rank": 512, "qk_rope_head_dim": 64, "qk_nope_head_dim": 128,
                       "v_head_dim": 128, "q_lora_rank": 1536, "num_attention_heads": 128,
                       "hidden_size": 7168, "num_hidden_layers": 4, "vocab_size": 129280},
                      "DeepSeek sparse attention"),
    "whisper": ({"architectures": ["WhisperForConditionalGeneration"], "model_type": "whisper"},
                "encoder-decoder"),
    "qwen2-vl": ({"architectures": ["Qwen2VLForConditionalGeneration"], "model_type": "qwen2_vl",
                  "rope_scaling": {"type": "mrope", "mrope_section": [16, 24, 24]},
                  "vision_config": {}}, "mrope"),
    "llama4": ({"architectures": ["Llama4ForConditionalGeneration"], "model_type": "llama4",
                "text_config": {"model_type": "llama4_text", "attention_chunk_size": 8192},
                "vision_config": {"model_type": "llama4_vision_model"}}, "chunked local attention"),
}


def args(**kw):
    """The ServerArgs fields model_support reads."""
    base = dict(kv_cache_dtype="auto", attention_backend="triton", decode_attention_backend=None,
                max_total_tokens=None)
    return SimpleNamespace(**{**base, **kw})


def facts(path, **kw):
    return model_support.model_facts(str(path), **kw)


@pytest.mark.parametrize("name", ["qwen3-8b-dummy", "llama-3.1-8b", "deepseek-r1-distill-qwen-7b",
                                  "mistral-7b", "qwen3-30b-a3b"])
def test_dense_and_moe_mha_models_are_supported(name):
    f = facts(MODELS / name)
    assert not f["mla"] and not f["hybrid_swa"]
    assert model_support.refusals(f, SMALL, args()) == []


def test_mla_is_supported_on_the_backends_it_was_built_for():
    f = facts(MODELS / "deepseek-v2-lite")
    assert f["mla"] and not f["dsa"]
    for backend in model_support.MLA_BACKENDS:
        assert model_support.refusals(f, SMALL, args(attention_backend=backend)) == []
    (msg,) = model_support.refusals(f, SMALL, args(attention_backend="flashmla"))
    assert "flashmla" in msg and "DeepseekV2ForCausalLM" in msg


def test_fp8_kv_is_supported_and_other_kv_formats_refused():
    f = facts(MODELS / "qwen3-8b-dummy")
    for dtype in ("fp8_e4m3", "fp8_e5m2", "bf16"):
        assert model_support.refusals(f, SMALL, args(kv_cache_dtype=dtype)) == []
    (msg,) = model_support.refusals(f, SMALL, args(kv_cache_dtype="nvfp4"))
    assert "--kv-cache-dtype nvfp4" in msg


def test_sliding_window_models_need_a_budget_that_holds_the_window():
    f = facts(MODELS / "gemma-3-1b")
    assert f["sliding_window"] == 512
    (msg,) = model_support.refusals(f, SMALL, args())
    assert "Gemma3ForCausalLM" in msg and "--zipage-kv-budget 512" in msg
    assert model_support.refusals(f, ZipageConfig(kv_budget=512, buffer=64), args()) == []


def test_hybrid_swa_pool_is_supported_but_not_with_async_compaction():
    f = facts(MODELS / "gpt-oss-20b")
    assert f["hybrid_swa"] and f["sliding_window"] == 128
    assert model_support.refusals(f, SMALL, args()) == []
    (msg,) = model_support.refusals(f, ZipageConfig(kv_budget=256, buffer=64,
                                                    async_compaction=True), args())
    assert "--zipage-async" in msg and "--disable-hybrid-swa-memory" in msg
    # --disable-hybrid-swa-memory: one pool for every layer (the MHA layout)
    plain = facts(MODELS / "gpt-oss-20b", disable_hybrid_swa_memory=True)
    assert not plain["hybrid_swa"]


def test_linear_attention_hybrids_are_refused():
    f = facts(MODELS / "qwen3-next-80b-a3b")
    (msg,) = model_support.refusals(f, SMALL, args())
    assert "Qwen3NextForCausalLM" in msg and "linear-attention" in msg


@pytest.mark.parametrize("name", sorted(REFUSED))
def test_other_attention_kinds_are_refused_by_name(tmp_path, name):
    config, what = REFUSED[name]
    (tmp_path / "config.json").write_text(json.dumps({**config, "torch_dtype": "bfloat16"}))
    f = facts(tmp_path)
    msgs = model_support.refusals(f, SMALL, args())
    assert msgs and all(config["architectures"][0] in m for m in msgs)
    assert any(what in m for m in msgs), msgs
