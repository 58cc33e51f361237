"""steady_state --merge: two single-engine runs are one load only if their load arguments
match; a port and temporary paths (which every run has its own) do not count."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import steady_state as ss  # noqa: E402


def load(port, tmp, output_len="8192"):
    return {"request_rate": 8.0, "bench_serving_argv": [
        "--backend", "sglang", "--base-url", f"http://127.0.0.1:{port}", "--dataset-name",
        "random-ids", "--tokenizer", f"/tmp/{tmp}/tokenizer", "--num-prompts", "4400",
        "--random-output-len", output_len, "--output-file", f"/tmp/{tmp}/report.jsonl"]}


def run(engine_load, tok_s):
    return {"load": engine_load, "window": {"output_tok_s": tok_s}, "bench_serving": {}}


def test_runs_on_their_own_ports_and_paths_are_one_load():
    out = ss.compare(run(load(27343, "a"), 100.0), run(load(22741, "b"), 120.0))
    assert "warning" not in out
    assert out["window.output_tok_s"]["ratio"] == 1.2


def test_a_different_load_argument_is_flagged():
    out = ss.compare(run(load(27343, "a"), 100.0), run(load(27343, "a", "16384"), 120.0))
    assert out["warning"] == "the two runs had different load arguments"
