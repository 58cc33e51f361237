#!/usr/bin/env python3
"""Steady-state serving throughput, as a busy reasoning service sees it (issue 18).

One invocation measures one engine: it starts ``python -m sglang_zipage.launch_server``
(``--engine stock`` adds ``--zipage-disable``), loads it with SGLang's own
``sglang.bench_serving`` (Poisson arrivals at --request-rate, random token ids, ignore_eos,
streaming) and measures over the window [--window-start-s, --window-end-s] after the load
started: output tok/s, running and waiting requests, pool use, retractions and finished
requests per minute, compaction share; bench_serving's own report (TTFT, TPOT, ITL) covers the
whole run. At the window end every request is aborted, so bench_serving writes its report.
--warm-start auto begins the load with a long run's running set; --merge puts a stock and a
zipage run side by side (--long-run, --spans); --add-row MERGED RESULTS puts a merged file into
throughput-h200.json as its steady-state row. The JSON (--out, rewritten every --save-every-s)
holds the command, commit, GPU, server command, window metrics, time series and bench_serving's
report; logs beside it. How it measures, and every row's exact calls: docs/benchmarks.md.

CPU check (2-layer Qwen3 written to a temp folder; about 7 minutes on 2 busy cores):
  .venv/bin/python benchmarks/steady_state.py --tiny --engine zipage --num-prompts 40 \\
      --input-len 32 --output-len 200 --request-rate 4 --window-start-s 10 --window-end-s 40 \\
      --out /tmp/ss-tiny.json --zipage-kv-budget 64 --zipage-buffer 16 --max-total-tokens 2048 \\
      --zipage-memory-fraction 0.5  # a tiny pool needs a larger share for its window slots
On a GPU, benchmarks/steady_pair.sh runs both engines and the merge in one background chain.
--pd measures a PD pair on one machine instead (issue 47): the engine as the decode server (give
it a --mem-fraction-static that leaves the prefill server its share), a stock prefill server
started first (--pd-prefill-flags), mooncake, SGLang's mini load balancer; CPU check: the
command above with --pd --zipage-mode fixed.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import traceback
from typing import Dict, List, Optional

from sglang_zipage.harness import probe, warm_start
from sglang_zipage.harness.engines import DEFAULT_MODEL, TINY_NAME, model_config, tiny_model_dir, vocab_size
from sglang_zipage.harness.merge import WINDOW_KEYS, merge_steady, parse_spans, steady_summary
from sglang_zipage.harness.rows import add_row
from sglang_zipage.harness.record import REPO, command_line, git_commit, gpu_name, write_json
from sglang_zipage.harness.server import (OFFLINE_ENV, PD_ENV, PD_LOAD_ENV, PD_TRANSFER, Server,
                                          free_port, mini_balancer, stop_process)
from sglang_zipage.harness.windows import (PD_FAILURE_COUNTERS, Sampler, log, pd_failures,
                                           progress_line, steady_window, with_times)

CHILD = "bench-serving-child"
NO_TOKEN_ERROR = "no output token before the window end (aborted while queued)"
# sample key -> (Prometheus sample name, labels it must carry); summed over matching samples
# (spec_accept_length: SGLang's gauge of the last logged decode stretch, 0 without speculative
# decoding; the window takes its mean)
PROM_COUNTERS = {
    "decode_tokens": ("sglang:realtime_tokens_total", {"mode": "decode"}),
    "prefill_tokens": ("sglang:realtime_tokens_total", {"mode": "prefill_compute"}),
    "retractions": ("sglang:num_retracted_requests_total", {}),
    "retracted_output_tokens": ("sglang:num_retracted_output_tokens_total", {}),
    "finished_requests": ("sglang:num_requests_total", {}),
    "spec_accept_length": ("sglang:spec_accept_length", {}),
    **PD_FAILURE_COUNTERS,  # PD (issue 47): requests the decode server failed
}
ZIPAGE_KEYS = ("compactions", "pressure_compactions", "compaction_batches", "compaction_gpu_ms",
               "compaction_ms", "tokens_evicted", "running_compressed_requests",
               "squeezed_compactions", "windowless_compactions", "loop_guard_triggers",
               "decode_steps_past_graphs")
NOTES = {
    "output_tok_s": "sglang:realtime_tokens_total{mode=decode} difference / window span: "
                    "every output token but each request's first (made by its prefill)",
    "server_tpot_ms": "1000 * mean_running_reqs / output_tok_s: decode time per token of "
                      "a running request, from the server's side",
    "mean_pool_use": "mean of /v1/loads num_used_tokens / max_total_num_tokens: KV slots held "
                     "by requests; the radix cache's evictable slots count as free",
    "compaction_share": "zipage compaction_gpu_ms difference / window ms (CUDA events around "
                        "the scoring + compaction kernels; wall time on a CPU)",
    "bench_serving": "bench_serving's own report: the whole run from the first arrival to the "
                     "window end (ramp-up included). Arrivals stop at the window end, then every "
                     "request is aborted: cut requests count with the tokens they got, queued "
                     "ones (no token) count as failed, so TTFT covers only requests that started",
    "t_s": "seconds since the load started (bench_serving's first arrival); negative: before",
}


# ------------------------------------------------------------------ arguments
def warm_size(text: str):
    if text == "auto":
        return text
    n = int(text)
    if n < 0:
        raise argparse.ArgumentTypeError(f"a warm start of {n} requests")
    return n


def parse_args(argv: List[str]):
    """Our flags, and the rest: server flags passed through unchanged."""
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0], allow_abbrev=False,
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog="Any other flag goes to the server (sglang_zipage."
                                       "launch_server), e.g. --attention-backend triton.")
    a = p.add_argument
    a("--engine", choices=("stock", "zipage"), default="zipage")
    a("--model", default=DEFAULT_MODEL, help="folder with a config.json (dummy weights)")
    a("--tiny", action="store_true", help="2-layer Qwen3 in a temp folder (CPU checks)")
    a("--num-prompts", type=int, default=4400)
    a("--request-rate", type=float, default=8.0, help="Poisson arrivals per second")
    a("--input-len", type=int, default=512)
    a("--output-len", type=int, default=8192)
    a("--range-ratio", type=float, default=1.0, help="bench_serving --random-range-ratio")
    a("--max-concurrency", type=int, default=None, help="bench_serving's in-flight cap")
    a("--seed", type=int, default=1, help="bench_serving --seed")
    a("--warm-start", type=warm_size, default=0, metavar="N|auto",
      help="send N requests at once before the Poisson stream, drawn as a long run's running "
           "set (harness/warm_start.py): remaining lengths, and for stock the ages as prompt; "
           "auto: as many as the engine's pool holds in a long run (harness/sizing.py)")
    a("--temperature", type=float, default=1.0,
      help="sampling temperature of every request (bench_serving's sglang client sends its "
           "args.temperature, 0 unless set, which its CLI does not expose): greedy outputs "
           "of dummy weights repeat a few tokens forever, and the loop guard (on by default) "
           "then raises every budget to 4x, a dummy-weight artifact; sampled ones do not")
    a("--pd", action="store_true",
      help="a PD pair on this machine: the engine runs as the decode server, a stock prefill "
           "server (--pd-prefill-flags) beside it, the KV sent by mooncake (over TCP unless "
           "MC_FORCE_TCP=0), SGLang's mini load balancer in front; the load goes to the "
           "balancer, the samples come from the decode server")
    a("--pd-prefill-flags", default="--mem-fraction-static 0.25 --disable-cuda-graph",
      help="the prefill server's own flags, one string (beside the model, the tokenizer and "
           "the engine's --attention-backend)")
    a("--bench-serving-args", default="", help="more bench_serving flags, one string")
    a("--stream-interval", type=int, default=8, help="server: tokens per streamed chunk")
    a("--window-start-s", type=float, default=300.0, help="after the load started")
    a("--window-end-s", type=float, default=540.0, help="arrivals stop, requests are aborted")
    a("--sample-interval-s", type=float, default=1.0)
    a("--save-every-s", type=float, default=15.0, help="rewrite --out this often")
    a("--progress-s", type=float, default=10.0)
    a("--server-timeout-s", type=float, default=900.0, help="until /health answers")
    a("--load-start-timeout-s", type=float, default=600.0, help="until the first arrival")
    a("--drain-timeout-s", type=float, default=180.0,
      help="after the window: until bench_serving has written its report")
    a("--commit", default=None, help="default: $ZIPAGE_COMMIT, else git rev-parse HEAD")
    a("--out", default="steady_state.json")
    a("--merge", nargs="+", metavar="JSON", help="merge single-engine (or merged) files into --out")
    a("--add-row", nargs=2, metavar=("MERGED", "RESULTS"), help="put a merged file's numbers "
      "into a bench_throughput result file as its steady-state row (e.g. "
      "results/steady-8k-h200.json results/throughput-h200.json)")
    a("--long-run", action="store_true", help="with --merge: both windows from stock's "
      "turnover to the earlier window end (runs of one engine per session)")
    a("--spans", default=None, help="with --merge: spans (s after the load started) to compare "
      "both engines over besides the window, e.g. 0-480,60-270 (default: the whole load and "
      "the window)")
    args, server_flags = p.parse_known_args(argv)
    if args.window_end_s <= args.window_start_s:
        p.error("--window-end-s must be > --window-start-s")
    if args.pd and args.warm_start:
        # stock's warm requests carry their ages as prompt: under PD the prefill server would
        # prefill them and send them over the transfer engine, where a long run's decode
        # server makes them itself (on an H100, 237k prompt tokens over mooncake's TCP
        # against zipage's 68k: steady-8k-pd-failed-h100.json)
        p.error("--warm-start with --pd: stock's warm requests carry their ages as prompt, "
                "which the prefill server would prefill and send; measure a PD pair as a long "
                "run (windows from stock's turnover)")
    return args, server_flags


# ---------------------------------------------------------------- tokenizer
def write_tokenizer(folder: str, vocab: int) -> str:
    """A word-level tokenizer of ``vocab`` ids: id i <-> "t<i>", 0 = "<unk>"; decoding joins
    tokens with spaces, so every id (and every streamed chunk) has text."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    words = {"<unk>": 0, **{f"t{i}": i for i in range(1, vocab)}}
    tok = Tokenizer(models.WordLevel(words, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    os.makedirs(folder, exist_ok=True)
    tok.save(os.path.join(folder, "tokenizer.json"))
    with open(os.path.join(folder, "tokenizer_config.json"), "w") as f:
        json.dump({"tokenizer_class": "PreTrainedTokenizerFast", "unk_token": "<unk>",
                   "model_max_length": 1 << 20}, f)
    return folder


# ------------------------------------------------------------------ server
def server_flags_for(args, model_dir: str, tokenizer_dir: str, extra: List[str]) -> List[str]:
    """Flags after --host/--port; the user's extra flags last, so they win."""
    flags = ["--model-path", model_dir, "--load-format", "dummy", "--tokenizer-path", tokenizer_dir,
             "--enable-metrics", "--incremental-streaming-output",
             "--stream-interval", str(args.stream_interval),
             "--sampling-backend", "pytorch", "--grammar-backend", "none"]
    if args.engine == "stock":
        flags.append("--zipage-disable")
    return flags + extra


def server_summary(url: str) -> Dict:
    return probe.info_summary(probe.server_info(url))


# ------------------------------------------------------------ bench_serving
def bench_serving_argv(args, url: str, tokenizer_dir: str, report_path: str) -> List[str]:
    argv = ["--backend", "sglang", "--base-url", url, "--dataset-name", "random-ids",
            "--tokenize-prompt", "--tokenizer", tokenizer_dir,
            "--num-prompts", str(args.num_prompts), "--request-rate", str(args.request_rate),
            "--random-input-len", str(args.input_len), "--random-output-len", str(args.output_len),
            "--random-range-ratio", str(args.range_ratio), "--seed", str(args.seed),
            "--output-file", report_path, "--disable-tqdm"]
    if args.max_concurrency:
        argv += ["--max-concurrency", str(args.max_concurrency)]
    return argv + shlex.split(args.bench_serving_args)


def start_bench_serving(bench_argv: List[str], t0_file: str, stop_after_s: float, log_path: str,
                        temperature: float, warm: List[str]):
    cmd = [sys.executable, os.path.abspath(__file__), CHILD, "--t0-file", t0_file,
           "--stop-after-s", str(stop_after_s), "--temperature", str(temperature), *warm, "--",
           *bench_argv]
    log("bench_serving: " + " ".join(shlex.quote(c) for c in cmd))
    return subprocess.Popen(cmd, stdout=open(log_path, "w"), stderr=subprocess.STDOUT,
                            env={**os.environ, **OFFLINE_ENV}, cwd=REPO)


def arrivals_until(get_request, t0_file: str, stop_after_s: float):
    """bench_serving's arrival generator, writing t0 at its start and ending at t0 + stop_after_s."""
    async def arrivals(*a, **kw):
        t0 = time.time()
        with open(t0_file + ".tmp", "w") as f:
            f.write(repr(t0))
        os.replace(t0_file + ".tmp", t0_file)
        async with contextlib.aclosing(get_request(*a, **kw)) as requests_:
            async for request in requests_:
                if time.time() - t0 >= stop_after_s:
                    print(f"[steady_state] arrivals stop at the window end ({stop_after_s} s)", flush=True)
                    return
                yield request
    return arrivals


def tokens_required(request_func):
    """A request that ended without a token (aborted while queued) counts as failed:
    bench_serving's sglang client would count it as a full-length output with TTFT 0."""
    async def wrapped(request_func_input, pbar=None):
        out = await request_func(request_func_input=request_func_input, pbar=pbar)
        if out.success and out.ttft == 0.0:
            out.success, out.error = False, NO_TOKEN_ERROR
        return out
    return wrapped


def with_temperature(run_benchmark, temperature: float):
    """bench_serving's run_benchmark with its args' temperature set (its sglang client reads
    args.temperature; run_benchmark sets 0 only where it is missing)."""
    def run(args_):
        args_.temperature = temperature
        return run_benchmark(args_)
    return run


def warm_dataset(get_dataset, own):
    """bench_serving's get_dataset with its first rows made the warm set (warm_start.py),
    written to --warm-file."""
    def load(args_, *a, **kw):
        rows = get_dataset(args_, *a, **kw)
        made = warm_start.warm_rows(rows, own.warm, args_.random_output_len,
                                    args_.random_range_ratio, args_.seed,
                                    own.warm_ages_in_prompt, own.vocab)
        write_json(made, own.warm_file, indent=None)
        print(f"[steady_state] warm start: {own.warm} requests at once, ages "
              f"{'in' if own.warm_ages_in_prompt else 'not in'} their prompts", flush=True)
        return rows
    return load


def bench_serving_child(argv: List[str]) -> None:
    """``steady_state.py bench-serving-child --t0-file F --stop-after-s S --temperature T --
    BENCH_SERVING_ARGS``"""
    split = argv.index("--")
    p = argparse.ArgumentParser(prog=f"steady_state.py {CHILD}")
    p.add_argument("--t0-file", required=True)
    p.add_argument("--stop-after-s", type=float, required=True)
    p.add_argument("--temperature", type=float, required=True)
    p.add_argument("--warm", type=int, default=0)
    p.add_argument("--warm-file", default=None, help="where the warm set's rows are written")
    p.add_argument("--warm-ages-in-prompt", action="store_true")
    p.add_argument("--vocab", type=int, default=None)
    own = p.parse_args(argv[:split])
    from sglang.benchmark import serving

    serving.run_benchmark = with_temperature(serving.run_benchmark, own.temperature)
    get_request = serving.get_request
    if own.warm:
        serving.get_dataset = warm_dataset(serving.get_dataset, own)
        get_request = warm_start.burst_then(get_request, own.warm)
    serving.get_request = arrivals_until(get_request, own.t0_file, own.stop_after_s)
    for backend in ("sglang", "sglang-native"):
        serving.ASYNC_REQUEST_FUNCS[backend] = tokens_required(serving.ASYNC_REQUEST_FUNCS[backend])
    sys.argv = ["sglang.bench_serving", *argv[split + 1:]]
    serving.cli_main()


def warm_summary(rows: List[Dict], ages_in_prompt: bool) -> Dict:
    """What the warm set was: its size, mean age and remaining length, prefill tokens."""
    n = len(rows)
    return dict(requests=n, ages_in_prompt=ages_in_prompt,
                mean_length=round(sum(r["length"] for r in rows) / n, 1),
                mean_age=round(sum(r["age"] for r in rows) / n, 1),
                mean_output_len=round(sum(r["output_len"] for r in rows) / n, 1),
                prompt_tokens=sum(r["prompt_len"] for r in rows), rows=rows)


def read_report(path: str) -> Optional[Dict]:
    if not os.path.exists(path):
        return None
    with open(path) as f:
        lines = [line for line in f if line.strip()]
    if not lines:
        return None
    report = json.loads(lines[-1])
    report.pop("server_info", None)  # the JSON has its own
    return report


# ------------------------------------------------------------------ the run
class Run:
    """One engine under load: server, sampler, bench_serving child, and the JSON document."""

    def __init__(self, args, extra_flags: List[str], argv: List[str]):
        self.args, self.extra_flags = args, extra_flags
        self.base = os.path.splitext(args.out)[0]
        self.work = tempfile.mkdtemp(prefix="steady-state-")
        self.model_dir = tiny_model_dir() if args.tiny else os.path.abspath(args.model)
        self.t0_file = os.path.join(self.work, "load_start")
        self.report_path = os.path.join(self.work, "bench_serving.jsonl")
        self.server = self.sampler = self.child = None
        self.prefill = self.balancer = None  # --pd: the prefill server and the balancer
        self.load_url = None  # where bench_serving sends the load
        self.t0: Optional[float] = None
        self.t_start = time.time()
        self.doc = dict(benchmark="steady_state", status="starting", engine=args.engine,
                        command=command_line(argv), commit=args.commit or git_commit(),
                        started=time.strftime("%Y-%m-%d %H:%M:%S"),
                        model_dir=TINY_NAME if args.tiny else self.model_dir,
                        model_config=model_config(self.model_dir), notes=NOTES,
                        load=dict(num_prompts=args.num_prompts, request_rate=args.request_rate,
                                  input_len=args.input_len, output_len=args.output_len,
                                  range_ratio=args.range_ratio, max_concurrency=args.max_concurrency,
                                  warm_start=args.warm_start,
                                  temperature=args.temperature,
                                  seed=args.seed, window_start_s=args.window_start_s,
                                  window_end_s=args.window_end_s),
                        server={}, window=None, samples=[], bench_serving=None)

    # -- steps
    def start_server(self) -> None:
        tok = write_tokenizer(os.path.join(self.work, "tokenizer"), vocab_size(self.model_dir))
        flags = server_flags_for(self.args, self.model_dir, tok, self.extra_flags)
        log(f"starting the {self.args.engine} server: {' '.join(flags)}")
        t = time.time()
        if self.args.pd:
            self.start_pd(flags, tok)
        else:
            self.server = Server(flags, self.base + "-server.log", env=OFFLINE_ENV,
                                 ready_timeout=self.args.server_timeout_s)
            self.load_url = self.server.url
        self.doc["server"] = dict(
            command=command_line(self.server.command()[1:], prog="python"),
            extra_flags=self.extra_flags, ready_s=round(time.time() - t, 1),
            log=self.base + "-server.log", info=server_summary(self.server.url))
        log(f"server ready in {self.doc['server']['ready_s']} s at {self.server.url}")
        self.sampler = Sampler(self.server.url, self.args.sample_interval_s, ZIPAGE_KEYS, PROM_COUNTERS)
        self.sampler.start()

    def start_pd(self, decode_flags: List[str], tok: str) -> None:
        """The decode server (the engine), a stock prefill server, the balancer in front."""
        bootstrap = free_port()
        stock = argparse.Namespace(**{**vars(self.args), "engine": "stock"})
        given = self.extra_flags
        backend = next((given[i + 1] for i in range(len(given) - 2, -1, -1)
                        if given[i] == "--attention-backend"), None)
        prefill = (server_flags_for(stock, self.model_dir, tok, [])
                   + (["--attention-backend", backend] if backend else [])
                   + shlex.split(self.args.pd_prefill_flags)
                   + ["--disaggregation-mode", "prefill", *PD_TRANSFER,
                      "--disaggregation-bootstrap-port", str(bootstrap)])
        decode = decode_flags + ["--disaggregation-mode", "decode", *PD_TRANSFER]
        env = {**OFFLINE_ENV, **PD_ENV, **PD_LOAD_ENV}
        # one after the other: a server sizes its pool from the memory free when it starts
        self.prefill = Server(prefill, self.base + "-prefill.log", env=env,
                              ready_timeout=self.args.server_timeout_s)
        self.server = Server(decode, self.base + "-server.log", env=env,
                             ready_timeout=self.args.server_timeout_s)
        self.balancer, self.load_url = mini_balancer(self.prefill.url, bootstrap, self.server.url,
                                                     self.base + "-balancer.log")
        self.doc["pd"] = dict(prefill_command=command_line(self.prefill.command()[1:],
                                                           prog="python"),
                              prefill_log=self.base + "-prefill.log", transfer=PD_TRANSFER,
                              mc_force_tcp=env["MC_FORCE_TCP"],
                              transfer_env={k: env[k] for k in PD_LOAD_ENV},
                              balancer="sglang_router.launch_router --mini-lb")

    def start_load(self) -> None:
        bench_argv = bench_serving_argv(self.args, self.load_url,
                                        os.path.join(self.work, "tokenizer"), self.report_path)
        self.doc["load"]["bench_serving_argv"] = bench_argv
        warm_file = os.path.join(self.work, "warm_start.json")
        warm, n = [], self.args.warm_start
        if n == "auto":
            n = warm_start.own_count(self.doc["server"]["info"], self.args.input_len,
                                     self.args.output_len, self.args.range_ratio)
            log(f"warm start: {n} requests, the {self.args.engine} pool's long-run running set")
        if n:
            warm = ["--warm", str(n), "--warm-file", warm_file,
                    "--vocab", str(vocab_size(self.model_dir))]
            if not warm_start.compresses(self.doc["server"]["info"], self.args.input_len,
                                         self.args.output_len, self.args.range_ratio):
                warm.append("--warm-ages-in-prompt")
        self.child = start_bench_serving(bench_argv, self.t0_file, self.args.window_end_s,
                                         self.base + "-bench_serving.log", self.args.temperature,
                                         warm)
        deadline = time.time() + self.args.load_start_timeout_s
        while not os.path.exists(self.t0_file):
            self.check_alive(child_may_end=False)
            if time.time() > deadline:
                raise RuntimeError("bench_serving did not start its load in time")
            time.sleep(0.5)
        with open(self.t0_file) as f:
            self.t0 = float(f.read())
        if warm:
            self.doc["warm_start"] = warm_summary(json.load(open(warm_file)),
                                                  ages_in_prompt="--warm-ages-in-prompt" in warm)
        self.doc.update(status="running", load_started=time.strftime(
            "%Y-%m-%d %H:%M:%S", time.localtime(self.t0)))
        log(f"load started; window {self.args.window_start_s}-{self.args.window_end_s} s")

    def watch(self) -> None:
        """Until the window end (or bench_serving is done): progress lines, periodic saves."""
        end = self.t0 + self.args.window_end_s
        last_save = last_print = 0.0
        while time.time() < end and self.check_alive(child_may_end=True):
            now = time.time()
            if now - last_print >= self.args.progress_s:
                self.print_progress()
                last_print = now
            if now - last_save >= self.args.save_every_s:
                self.save()
                last_save = now
            time.sleep(min(1.0, max(0.0, end - time.time())))
        self.doc["load_ended_before_window_end"] = self.child.poll() is not None
        self.sampler.sample_now()  # the window's last sample, before any abort
        self.doc["window"] = self.window()
        if self.args.pd:
            self.doc["pd"]["failed_requests"] = pd_failures(
                with_times(list(self.sampler.samples), self.t0), self.args.window_end_s)
        self.print_progress()
        log("window: " + json.dumps({k: self.doc["window"].get(k) for k in WINDOW_KEYS}))

    def drain(self) -> None:
        """Abort everything until bench_serving has written its report and exited."""
        import requests

        self.doc["status"] = "draining"
        self.save()
        t, calls = time.time(), 0
        while self.child.poll() is None and time.time() - t < self.args.drain_timeout_s:
            try:
                for server in filter(None, (self.server, self.prefill)):
                    requests.post(server.url + "/abort_request", json={"abort_all": True},
                                  timeout=30)
                calls += 1
            except requests.RequestException:
                pass
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.child.wait(timeout=2)
        exited = self.child.poll() is not None
        stop_process(self.child)
        self.doc["drain"] = dict(seconds=round(time.time() - t, 1), abort_calls=calls,
                                 bench_serving_exited=exited, returncode=self.child.returncode)
        self.doc["bench_serving"] = read_report(self.report_path)
        log(f"drain: {self.doc['drain']}")

    # -- helpers
    def check_pd(self) -> None:
        """A PD run whose decode server failed requests (handshake or KV transfer) before the
        window end measured a pair that lost its load, not a steady state: it fails (its data
        kept), and the merge refuses it."""
        failed = (self.doc.get("pd") or {}).get("failed_requests")
        if failed:
            raise RuntimeError(
                f"the decode server failed {failed:.0f} requests in the PD handshake or KV "
                f"transfer before the window end (see {self.base}-server.log and "
                f"{self.base}-prefill.log): not a steady state")

    def check_alive(self, child_may_end: bool) -> bool:
        """False once bench_serving has ended (if allowed); raises if anything died."""
        for name, proc in (("server", self.server.proc),
                           ("prefill server", self.prefill and self.prefill.proc),
                           ("balancer", self.balancer)):
            if proc is not None and proc.poll() is not None:
                raise RuntimeError(f"{name} exited with {proc.returncode}; see its log")
        code = self.child.poll()
        if code is None:
            return True
        if child_may_end and code == 0:
            return False
        raise RuntimeError(f"bench_serving exited with {code}; see {self.base}-bench_serving.log")

    def window(self) -> Dict:
        return steady_window(with_times(list(self.sampler.samples), self.t0),
                             self.args.window_start_s, self.args.window_end_s)

    def print_progress(self) -> None:
        samples = with_times(list(self.sampler.samples[-12:]), self.t0)
        if samples:
            back = max(1, min(len(samples) - 1, round(self.args.progress_s / self.args.sample_interval_s)))
            print(progress_line(self.args.engine, samples[-1 - back] if len(samples) > 1 else None,
                                samples[-1]), flush=True)

    def save(self) -> None:
        if self.sampler is not None:
            self.doc["samples"] = with_times(list(self.sampler.samples), self.t0)
            if self.t0 is not None and self.doc["status"] == "running":
                self.doc["window_so_far"] = self.window()
        self.doc["elapsed_s"] = round(time.time() - self.t_start, 1)
        write_json(self.doc, self.args.out)

    def close(self) -> None:
        """Stop everything this run started; the server and the temp folders even if an
        earlier step fails."""
        try:
            stop_process(self.child)
            if self.sampler is not None:
                self.sampler.stop()
        finally:
            stop_process(self.balancer)
            if self.prefill is not None:
                self.doc.setdefault("pd", {})["prefill_pids_alive_after_stop"] = self.prefill.stop()
            if self.server is not None:
                self.doc["server"]["pids_alive_after_stop"] = self.server.stop()
            # which card (a call for one kind of GPU may get another): after the server, so
            # this process's CUDA context never shrinks the pool it sized
            self.doc["gpu"] = gpu_name()
            self.doc.pop("window_so_far", None)
            self.save()
            shutil.rmtree(self.work, ignore_errors=True)
            if self.args.tiny:
                shutil.rmtree(self.model_dir, ignore_errors=True)  # its config is in the JSON


def run(args, extra_flags: List[str], argv: List[str]) -> Dict:
    r = Run(args, extra_flags, argv)
    try:
        r.save()
        r.start_server()
        r.start_load()
        r.watch()
        r.drain()
        r.check_pd()
        r.doc["status"] = "done"
    except BaseException as e:
        r.doc["status"] = "failed"
        r.doc["error"] = traceback.format_exc()[-4000:]
        log(f"FAILED: {e!r}")
        if not isinstance(e, Exception):
            raise
    finally:
        r.close()
    log(f"wrote {args.out} (status {r.doc['status']})")
    print("SUMMARY " + json.dumps(steady_summary(r.doc)), flush=True)
    return r.doc


def main(argv: Optional[List[str]] = None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == [CHILD]:
        bench_serving_child(argv[1:])
        return
    args, extra_flags = parse_args(argv)
    if args.merge:
        merge_steady(args.merge, args.out, parse_spans(args.spans), args.long_run)
        return
    if args.add_row:
        add_row(*args.add_row)
        return
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # cleanup runs in run()'s finally
    run(args, extra_flags, argv)


if __name__ == "__main__":
    main()
