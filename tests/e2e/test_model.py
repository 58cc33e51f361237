"""The bundled model: converted once, atomically, even when two processes race (issue 2).

Run: .venv/bin/python -m pytest tests/e2e/test_model.py   (about 2 minutes on 2 cores)
"""

import json
import os
import subprocess
import sys

from zipage_server import REPO

CONVERT = "from sglang_zipage.model import bundled_model_path; print(bundled_model_path())"


def test_concurrent_first_use_yields_one_complete_model(tmp_path):
    env = {**os.environ, "SGLANG_ZIPAGE_CACHE": str(tmp_path), "OMP_NUM_THREADS": "1"}
    procs = [subprocess.Popen([sys.executable, "-c", CONVERT], env=env, cwd=str(REPO),
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for _ in range(2)]
    results = [p.communicate(timeout=900) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], [r[1][-2000:] for r in results]
    paths = {r[0].strip().splitlines()[-1] for r in results}
    assert len(paths) == 1
    model = tmp_path / "SmolLM2-135M-Instruct"
    assert paths == {str(model)}
    assert sorted(os.listdir(tmp_path)) == ["SmolLM2-135M-Instruct"]  # no half-written copies
    config = json.loads((model / "config.json").read_text())
    assert (config["num_hidden_layers"], config["num_key_value_heads"], config["head_dim"]) == (30, 3, 64)
    # a dense bf16 checkpoint: SGLang must not see a GGUF quantization config
    assert "quantization_config" not in config and config.get("dtype") == "bfloat16"
    assert (model / "model.safetensors").stat().st_size > 100_000_000
    tok = json.loads((model / "tokenizer_config.json").read_text())
    assert tok["eos_token"] == "<|im_end|>"  # the converted tokenizer's EOS quirk is fixed
