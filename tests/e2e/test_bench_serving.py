"""`python -m sglang.bench_serving --backend sglang` runs unchanged against a zipage server
(issue 6), its requests compressing as they go.

`--dataset-name random-ids` builds prompts from token ids (the `random` dataset samples
ShareGPT text and downloads it when --dataset-path is not a local file); the tokenizer is
the bundled model's checkpoint folder, and the HF offline switches make any attempt to reach
a hub fail instead of downloading.

Run: .venv/bin/python -m pytest tests/e2e/test_bench_serving.py
"""

import json
import os
import re
import subprocess
import sys

from sglang_zipage.model import bundled_model_path
from zipage_server import assert_healthy

PROMPTS, INPUT_LEN, OUTPUT_LEN = 4, 32, 90  # 90 > 80: every request compresses once


def test_bench_serving_completes_every_request(zipage_server, tmp_path):
    before = zipage_server.zipage_state()["compactions"]
    out = tmp_path / "bench.jsonl"
    cmd = [sys.executable, "-m", "sglang.bench_serving", "--backend", "sglang",
           "--base-url", zipage_server.url, "--dataset-name", "random-ids",
           "--random-input-len", str(INPUT_LEN), "--random-output-len", str(OUTPUT_LEN),
           "--random-range-ratio", "1", "--num-prompts", str(PROMPTS),
           "--tokenizer", bundled_model_path(), "--output-file", str(out), "--disable-tqdm"]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
           "HF_DATASETS_OFFLINE": "1"}
    run = subprocess.run(cmd, capture_output=True, text=True, timeout=900, env=env)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]

    printed = re.search(r"Successful requests:\s+(\d+)", run.stdout)
    assert printed and int(printed.group(1)) == PROMPTS, run.stdout[-3000:]
    result = json.loads(out.read_text().splitlines()[-1])
    assert result["completed"] == PROMPTS
    assert result["total_output_tokens"] == PROMPTS * OUTPUT_LEN  # ignore_eos: full length
    assert zipage_server.zipage_state()["compactions"] - before >= PROMPTS
    assert_healthy(zipage_server)
