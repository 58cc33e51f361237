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

from sglang_zipage.harness import warm_start
from sglang_zipage.harness.record import REPO
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


def test_a_warm_start_goes_first_with_its_remaining_lengths_and_ages(zipage_server, tmp_path):
    """benchmarks/steady_state.py's bench_serving child with a warm start of 3 (stock's kind:
    ages in the prompts): bench_serving sends the warm requests first, each asking for its
    remaining tokens with its age as more prompt, then the rest of its load unchanged."""
    warm_file, report, t0 = tmp_path / "warm.json", tmp_path / "bench.jsonl", tmp_path / "t0"
    cmd = [sys.executable, os.path.join(REPO, "benchmarks", "steady_state.py"),
           "bench-serving-child", "--t0-file", str(t0), "--stop-after-s", "900",
           "--temperature", "0", "--warm", "3", "--warm-file", str(warm_file),
           "--warm-ages-in-prompt", "--vocab", "49152", "--",
           "--backend", "sglang", "--base-url", zipage_server.url, "--dataset-name", "random-ids",
           "--tokenize-prompt", "--random-input-len", str(INPUT_LEN), "--random-output-len",
           str(OUTPUT_LEN), "--random-range-ratio", "0.5", "--num-prompts", "5", "--seed", "4",
           "--tokenizer", bundled_model_path(), "--output-file", str(report), "--disable-tqdm",
           "--output-details"]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
           "HF_DATASETS_OFFLINE": "1"}
    run = subprocess.run(cmd, capture_output=True, text=True, timeout=900, env=env, cwd=REPO)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    warm = json.loads(warm_file.read_text())
    assert [(w["length"], w["age"]) for w in warm] == warm_start.draw(3, OUTPUT_LEN, 0.5, 4)
    result = json.loads(report.read_text().splitlines()[-1])
    assert result["completed"] == 5
    assert result["output_lens"][:3] == [w["output_len"] for w in warm]  # ignore_eos
    assert all(w["output_len"] == w["length"] - w["age"] for w in warm)
    assert result["input_lens"][:3] == [w["prompt_len"] for w in warm]
    assert all(INPUT_LEN // 2 + w["age"] <= w["prompt_len"] <= INPUT_LEN + w["age"] for w in warm)
    assert all(OUTPUT_LEN // 2 <= n <= OUTPUT_LEN for n in result["output_lens"][3:])
    assert_healthy(zipage_server)
