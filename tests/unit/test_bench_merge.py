"""bench_throughput --merge (sglang_zipage.harness.merge.merge_first_wave): single-engine
result files become side-by-side rows.

One row per (load, sizes, variant): an FP8 run never lands beside a bf16 one; each engine's
numbers keep the command and commit that measured them; re-merging a merged file keeps the
files it was merged from.
"""

import json

from sglang_zipage.harness.merge import merge_first_wave

SPEC = {"name": "fixed", "num_requests": 256, "input_len": 512, "output_len": 6144,
        "shared_prefix_len": 0, "until": "complete"}


def result_file(tmp_path, name, engine, tok_s, commit, kv_cache_dtype=None):
    entry = {"load": "fixed", "spec": SPEC, engine: {"output_tok_s": tok_s}}
    if kv_cache_dtype:
        entry["kv_cache_dtype"] = kv_cache_dtype
    doc = {"command": f"bench_throughput.py --engines {engine} ({name})", "commit": commit,
           "engines": {engine: {}}, "loads": [entry]}
    path = tmp_path / f"{name}.json"
    path.write_text(json.dumps(doc))
    return str(path)


def test_merge_pairs_engines_per_variant_and_keeps_provenance(tmp_path):
    files = [result_file(tmp_path, "stock", "stock", 4000.0, "aaa"),
             result_file(tmp_path, "zipage", "zipage", 6000.0, "bbb"),
             result_file(tmp_path, "stock-fp8", "stock", 5000.0, "ccc", "fp8_e4m3")]
    first = tmp_path / "first.json"
    merge_first_wave(files, str(first))
    later = result_file(tmp_path, "zipage-fp8", "zipage", 7500.0, "ddd", "fp8_e4m3")
    out = merge_first_wave([str(first), later], str(tmp_path / "out.json"))

    rows = {e["kv_cache_dtype"]: e for e in out["loads"]}
    assert set(rows) == {"auto", "fp8_e4m3"} and len(out["loads"]) == 2
    assert rows["auto"]["ratio"] == 1.5 and rows["fp8_e4m3"]["ratio"] == 1.5
    assert rows["fp8_e4m3"]["stock"]["commit"] == "ccc"
    assert rows["fp8_e4m3"]["zipage"]["commit"] == "ddd"
    assert rows["auto"]["zipage"]["command"].endswith("(zipage)")
    assert [m["commit"] for m in out["merged_from"]] == ["aaa", "bbb", "ccc", "ddd"]
