"""steady_state --merge (sglang_zipage.harness.merge): two single-engine runs are one load only
if their load arguments match; a port and temporary paths (which every run has its own) do not
count. Spans, re-merging and the steady-state row of the throughput table."""

import json

import pytest

from sglang_zipage.harness import merge, rows
from sglang_zipage.harness.windows import pd_failures, steady_window


def load(port, tmp, output_len="8192"):
    return {"request_rate": 8.0, "bench_serving_argv": [
        "--backend", "sglang", "--base-url", f"http://127.0.0.1:{port}", "--dataset-name",
        "random-ids", "--tokenizer", f"/tmp/{tmp}/tokenizer", "--num-prompts", "4400",
        "--random-output-len", output_len, "--output-file", f"/tmp/{tmp}/report.jsonl"]}


def run(engine_load, tok_s):
    return {"load": engine_load, "window": {"output_tok_s": tok_s}, "bench_serving": {}}


def test_runs_on_their_own_ports_and_paths_are_one_load():
    out = merge.compare(run(load(27343, "a"), 100.0), run(load(22741, "b"), 120.0))
    assert "warning" not in out
    assert out["window.output_tok_s"]["ratio"] == 1.2


def test_a_different_load_argument_is_flagged():
    out = merge.compare(run(load(27343, "a"), 100.0), run(load(27343, "a", "16384"), 120.0))
    assert out["warning"] == "the two runs had different load arguments"


def samples(tok_s, finished_at, window_end, aborted):
    """One sample a second: decode at tok_s, one request finished at each finished_at time,
    then, after the window end, the abort: every request left counts as finished."""
    out = []
    for t in [*range(0, window_end + 1), window_end + 0.3, window_end + 1.3]:  # 0.3: the abort
        done = sum(1 for f in finished_at if f <= t) + (aborted if t > window_end else 0)
        out.append({"t_s": float(t), "decode_tokens": tok_s * min(t, window_end),
                    "prefill_tokens": 0, "retractions": 0, "retracted_output_tokens": 0,
                    "finished_requests": done, "running_reqs": 0 if t > window_end else 10,
                    "waiting_reqs": 5, "used_tokens": 50, "pool_tokens": 100})
    return out


def engine_run(tok_s, finished_at, aborted=40):
    load = {"window_start_s": 20.0, "window_end_s": 40.0}
    return {"load": load, "samples": samples(tok_s, finished_at, 40, aborted)}


def test_spans_compare_both_engines_and_stop_at_the_window_end():
    stock, zipage = engine_run(100.0, [30]), engine_run(150.0, [5, 25, 35])
    whole, window = merge.compare_spans(stock, zipage, merge.default_spans(stock))
    assert whole["span_s"] == [0.0, 40.0] and window["span_s"] == [20.0, 40.0]
    assert whole["ratio"] == 1.5 and window["ratio"] == 1.5
    # the abort after the window end is not a finish
    assert (whole["stock"]["finished"], whole["zipage"]["finished"]) == (1, 3)
    assert (window["stock"]["finished"], window["zipage"]["finished"]) == (1, 2)
    assert window["zipage"]["min_running_reqs"] == 10


def test_a_merged_file_merges_again_with_other_spans(tmp_path):
    files = []
    for name, tok_s in (("stock", 100.0), ("zipage", 150.0)):
        doc = {**engine_run(tok_s, [30]), "engine": name, "status": "done",
               "command": f"run {name}", "window": {"output_tok_s": tok_s}, "bench_serving": {}}
        files.append(tmp_path / f"{name}.json")
        files[-1].write_text(json.dumps(doc))
    first = merge.merge_steady([str(f) for f in files], str(tmp_path / "m.json"))
    again = merge.merge_steady([str(tmp_path / "m.json")], str(tmp_path / "m2.json"), [[10.0, 30.0]])
    assert [m["path"] for m in again["merged_from"]] == [str(f) for f in files]
    assert again["output_tok_s_ratio"] == first["output_tok_s_ratio"] == 1.5
    assert [r["span_s"] for r in again["spans"]] == [[10.0, 30.0]]
    assert again["spans"][0]["ratio"] == 1.5
    # the merged file stands for its stock run beside a later zipage run, which replaces its own
    later = {**json.loads(files[1].read_text()), "command": "run zipage again",
             "window": {"output_tok_s": 180.0}}
    (tmp_path / "later.json").write_text(json.dumps(later))
    third = merge.merge_steady([str(tmp_path / "m.json"), str(tmp_path / "later.json")],
                               str(tmp_path / "m3.json"))
    assert [m["path"] for m in third["merged_from"]] == [str(files[0]), str(tmp_path / "later.json")]
    assert [s["engine"] for s in third["summary"]] == ["stock", "zipage"]
    assert third["output_tok_s_ratio"] == 1.8


def test_a_merged_file_becomes_one_steady_state_row_of_the_results(tmp_path):
    files = []
    for name, tok_s, flags in (("stock", 100.0, "--zipage-disable"),
                               ("zipage", 150.0, "--zipage-mode fixed --kv-cache-dtype fp8_e4m3")):
        run_doc = engine_run(tok_s, [30])
        run_doc["load"].update(num_prompts=64, request_rate=8.0, input_len=512, output_len=8192)
        doc = {**run_doc, "engine": name, "status": "done", "command": f"run {name}",
               "commit": "0123456789abcdef", "bench_serving": {"completed": 7, "duration": 40.0},
               "server": {"command": f"python -m sglang_zipage.launch_server {flags}"}}
        doc["window"] = steady_window(doc["samples"], 20.0, 40.0)
        files.append(tmp_path / f"{name}.json")
        files[-1].write_text(json.dumps(doc))
    merged = tmp_path / "steady-tiny.json"
    windows = {f.stem: json.loads(f.read_text())["window"]["output_tok_s"] for f in files}
    ratio = merge.merge_steady([str(f) for f in files], str(merged))["output_tok_s_ratio"]
    results = tmp_path / "throughput.json"
    results.write_text(json.dumps({"loads": [{"load": "steady", "regime": "first-wave"}]}))
    for _ in range(2):  # a second time replaces the row
        rows.add_row(str(merged), str(results))
    loads = json.loads(results.read_text())["loads"]
    assert [e["load"] for e in loads] == ["steady", "poisson:rate=8:output_len=8192"]
    row = loads[1]
    assert (row["regime"], row["output_len"], row["ratio"]) == ("steady-state", 8192, ratio)
    assert (row["stock_output_tok_s"], row["zipage_output_tok_s"]) == (windows["stock"],
                                                                        windows["zipage"])
    assert 1.45 < ratio < 1.55 and row["spans"][0]["ratio"] == 1.5
    assert (row["zipage_mode"], row["kv_cache_dtype"]) == ("fixed", "fp8_e4m3")
    assert row["zipage"]["commit"] == "0123456" and row["spec"]["num_requests"] == 64
    assert row["stock"]["bench_serving"] == {"completed": 7}
    assert row["source"].startswith("steady-tiny.json")
    # spread output lengths are another load; the same load on another backend another row
    for f in files:
        doc = json.loads(f.read_text())
        doc["load"]["range_ratio"] = 0.5
        doc["server"]["info"] = {"attention_backend": "flashinfer"}
        f.write_text(json.dumps(doc))
    merge.merge_steady([str(f) for f in files], str(merged))
    rows.add_row(str(merged), str(results))
    loads = json.loads(results.read_text())["loads"]
    assert [e["load"] for e in loads][1:] == ["poisson:rate=8:output_len=8192",
                                              "poisson:rate=8:output_len=8192:range_ratio=0.5"]
    assert loads[2]["spec"]["range_ratio"] == 0.5


def wave_samples(finished_at, running):
    """One sample a second from t=0 to 40; ``running(t)`` requests run."""
    return [{"t_s": float(t), "finished_requests": 2 + sum(1 for f in finished_at if f <= t),
             "running_reqs": running(t)} for t in range(0, 41)]


def test_the_first_running_set_turns_over_when_as_many_finished_as_it_held():
    # three run from the start; they finish at 10, 12 and 15 while others join
    run = {"load": {"window_end_s": 40.0},
           "samples": wave_samples([10, 12, 15, 30], lambda t: 3 if t < 10 else 5)}
    assert merge.turnover_s(run) == 15.0
    # before the window end only: a run cut there has not turned over
    assert merge.turnover_s({**run, "load": {"window_end_s": 14.0}}) is None
    # a set whose requests never finish within the samples
    assert merge.turnover_s({"load": {}, "samples": wave_samples([], lambda t: 4)}) is None


def test_a_row_is_long_run_when_its_window_starts_after_stocks_turnover(tmp_path):
    files = []
    for name, tok_s, flags in (("stock", 100.0, "--zipage-disable"),
                               ("zipage", 150.0, "--zipage-min-kv-budget 1024 --zipage-compress-prompt")):
        doc = {"load": {"window_start_s": 20.0, "window_end_s": 40.0, "num_prompts": 64,
                        "request_rate": 8.0, "input_len": 512, "output_len": 8192},
               "samples": wave_samples([5, 8, 11, 18], lambda t: 2 if t < 5 else 4),
               "engine": name, "status": "done", "command": f"run {name}", "commit": "0",
               "bench_serving": {},
               "window": {"output_tok_s": tok_s, "start_s": 20.0, "end_s": 40.0},
               "server": {"command": f"python -m sglang_zipage.launch_server {flags}",
                          "info": {"attention_backend": "flashinfer"}}}
        files.append(tmp_path / f"{name}.json")
        files[-1].write_text(json.dumps(doc))
    merged, results = tmp_path / "m.json", tmp_path / "throughput.json"
    merge.merge_steady([str(f) for f in files], str(merged))
    results.write_text(json.dumps({"loads": []}))
    row = rows.add_row(str(merged), str(results))
    assert row["stock"]["turnover_s"] == 8.0  # two ran before the first finish at 5
    assert (row["span"], row["attention_backend"], row["zipage_min_kv_budget"]) == (
        "long-run", "flashinfer", 1024)
    assert row["zipage_compress_prompt"] is True
    late = json.loads(files[0].read_text())
    late["samples"] = wave_samples([5, 30], lambda t: 2 if t < 5 else 4)  # turns over at 30
    files[0].write_text(json.dumps(late))
    merge.merge_steady([str(f) for f in files], str(merged))
    assert rows.add_row(str(merged), str(results))["span"] == "first-wave"
    for f in files:  # the same load begun with a long run's running set: a row of its own
        doc = json.loads(f.read_text())
        doc["load"]["warm_start"] = 200
        f.write_text(json.dumps(doc))
    merge.merge_steady([str(f) for f in files], str(merged))
    row = rows.add_row(str(merged), str(results))
    assert (row["span"], row["warm_start"]) == ("warm-start", 200)
    assert [r["span"] for r in json.loads(results.read_text())["loads"]] == ["first-wave",
                                                                            "warm-start"]


def test_long_run_windows_start_at_stocks_turnover_in_both_runs(tmp_path):
    """Runs of one engine per session: the merge moves both windows to [stock's turnover, the
    earlier window end]; the windows the runs measured stay beside them."""
    files = []
    for name, tok_s, finished_at, end in (("stock", 100.0, [12, 26, 27], 40),
                                          ("zipage", 150.0, [5, 8, 9], 36)):
        doc = {**engine_run(tok_s, finished_at), "engine": name, "status": "done",
               "command": f"run {name}", "bench_serving": {}}
        doc["load"]["window_end_s"] = float(end)
        doc["samples"] = [x for x in doc["samples"] if x["t_s"] <= end]
        for x in doc["samples"]:  # two ran until the first finish, then 10
            x["running_reqs"] = 2 if x["t_s"] < finished_at[0] else 10
        doc["window"] = steady_window(doc["samples"], 20.0, float(end))
        files.append(tmp_path / f"{name}.json")
        files[-1].write_text(json.dumps(doc))
    res = merge.merge_steady([str(f) for f in files], str(tmp_path / "m.json"), long_run=True)
    stock, zipage = res["engines"]["stock"], res["engines"]["zipage"]
    assert merge.turnover_s(stock) == 26.0  # two ran before the first finish at 12
    assert (stock["window"]["start_s"], stock["window"]["end_s"]) == (26.0, 36.0)
    assert (zipage["window"]["start_s"], zipage["window"]["end_s"]) == (26.0, 36.0)
    assert stock["window_as_run"]["start_s"] == 20.0 and res["window_rule"] == merge.LONG_RUN_RULE
    assert stock["window"]["finished"] == 1 and res["output_tok_s_ratio"] == 1.5
    files[0].write_text(json.dumps({**json.loads(files[0].read_text()),
                                    "samples": engine_run(100.0, [12])["samples"][:41]}))
    with pytest.raises(SystemExit, match="no long-run window"):  # stock never turned over
        merge.merge_steady([str(f) for f in files], str(tmp_path / "m.json"), long_run=True)


def test_runs_on_different_cards_are_not_merged(tmp_path):
    """A call for one kind of GPU may get another: a ratio of an H200 run to an H100 run would
    compare pools of different sizes, so the merge refuses it and names both cards."""
    def write(name, tok_s, gpu):
        doc = {**engine_run(tok_s, [30]), "engine": name, "status": "done",
               "command": f"run {name}", "window": {"output_tok_s": tok_s}, "bench_serving": {},
               "gpu": gpu}
        (tmp_path / f"{name}-{gpu}.json").write_text(json.dumps(doc))
        return str(tmp_path / f"{name}-{gpu}.json")

    stock = write("stock", 100.0, "NVIDIA H200")
    with pytest.raises(SystemExit, match="NVIDIA H100 80GB HBM3"):
        merge.merge_steady([stock, write("zipage", 150.0, "NVIDIA H100 80GB HBM3")],
                           str(tmp_path / "m.json"))
    merged = merge.merge_steady([stock, write("zipage", 150.0, "NVIDIA H200")],
                                str(tmp_path / "m.json"))
    assert merged["gpu"] == "NVIDIA H200" and merged["output_tok_s_ratio"] == 1.5


def test_a_steady_window_counts_the_compactions_made_without_a_query_window():
    counts = {0: (0, 0), 20: (100, 3), 40: (180, 10)}  # t -> (compactions, windowless)
    out = []
    for s in samples(100.0, [30], 40, 40)[:41]:
        c, w = counts.get(int(s["t_s"]), (None, None))
        if c is not None:
            s["zipage"] = {"compactions": c, "windowless_compactions": w}
        out.append(s)
    z = steady_window([s for s in out if "zipage" in s], 20.0, 40.0)["zipage"]
    assert (z["compactions"], z["windowless_compactions"]) == (80, 7)


def test_pd_failures_count_from_the_load_start_to_the_window_end():
    """A PD decode server's handshake and transfer failures (its Prometheus counters) from the
    last sample before the load to the window end (0.5 s of slack, as the window's); the
    aborts that end the run, a second or more later, do not count."""
    def sample(t, boot, transfer):
        return {"t_s": float(t), "pd_bootstrap_failed": boot, "pd_transfer_failed": transfer}

    ok = [sample(-2, 0, 0), sample(0, 1, 0), sample(20, 1, 0), sample(40, 1, 0),
          sample(41.3, 90, 0)]  # 1 before the load (warm-up); 89 aborted after the window
    assert pd_failures(ok, 40.0) == 0
    lost = ok[:2] + [sample(20, 326, 2), sample(40, 500, 2), sample(41.3, 600, 2)]
    assert pd_failures(lost, 40.0) == 326 + 2 - 1 + 174
    assert pd_failures([{"t_s": 0.0}, {"t_s": 40.0}], 40.0) is None  # not a PD run


def test_a_failed_run_is_not_merged(tmp_path):
    files = []
    for name, status in (("stock", "failed"), ("zipage", "done")):
        doc = {**engine_run(100.0, [30]), "engine": name, "status": status,
               "command": f"run {name}", "window": {"output_tok_s": 100.0}, "bench_serving": {},
               "error": "Traceback ...\nRuntimeError: the decode server failed 326 requests"}
        files.append(tmp_path / f"{name}.json")
        files[-1].write_text(json.dumps(doc))
    with pytest.raises(SystemExit, match="stock.*failed 326 requests"):
        merge.merge_steady([str(f) for f in files], str(tmp_path / "m.json"))
    assert not (tmp_path / "m.json").exists()


def test_a_pd_pair_refuses_a_warm_start():
    """stock's warm requests carry their ages as prompt, which under PD the prefill server would
    prefill and send: a PD pair is measured as a long run."""
    import importlib.util
    import os

    path = os.path.join(os.path.dirname(__file__), "..", "..", "benchmarks", "steady_state.py")
    spec = importlib.util.spec_from_file_location("steady_state_cli", path)
    cli = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(cli)
    assert cli.parse_args(["--pd", "--window-start-s", "300"])[0].pd
    assert cli.parse_args(["--warm-start", "auto"])[0].warm_start == "auto"
    with pytest.raises(SystemExit):
        cli.parse_args(["--pd", "--warm-start", "auto"])
