#!/usr/bin/env python3
"""Steady-state serving throughput, as a busy reasoning service sees it (issue 18).

One invocation measures one engine: it starts ``python -m sglang_zipage.launch_server``
(stock SGLang with ``--engine stock``, which adds ``--zipage-disable``), loads it with
SGLang's own ``sglang.bench_serving`` (Poisson arrivals at ``--request-rate``, random token
ids, ``ignore_eos``, streaming) and measures over a window [--window-start-s, --window-end-s]
after the load started, once the pool is full, compaction runs and the queue never empties.
Stock and zipage run in separate invocations (consecutive GPU calls); ``--merge`` puts
them side by side.

What is measured
  A sampler thread polls the server every --sample-interval-s: ``/metrics`` (the server
  runs with ``--enable-metrics``) for the counters sglang:realtime_tokens_total
  {mode="decode"} (one per running request per decode step: output tokens less each
  request's first, which prefill makes), sglang:num_retracted_requests_total and
  sglang:num_requests_total (finished); ``/v1/loads?include=core`` for running and
  waiting requests and KV slots in use; ``/server_info`` internal_states[0]["zipage"] for
  compactions and compaction_gpu_ms (polled for both engines: the same overhead).
  Over the window: output tok/s, mean running / waiting requests, mean pool use (KV slots
  held by requests / pool; the radix cache's evictable slots count as free), retractions
  per minute, finished requests per minute, compaction share (compaction GPU ms / window ms).
  bench_serving's own report (TTFT, TPOT, ITL, its output throughput) covers the whole run
  from the first arrival to the window end, ramp-up included, not the window.

How bench_serving ends at the window end
  Above capacity bench_serving would only end (and write its report) once every queued
  request has run to completion, hours later. So it runs in a child process (this file,
  ``bench-serving-child``) that calls ``sglang.benchmark.serving.cli_main()`` unchanged but
  for two wrappers: its arrival generator writes the load start time (t0) to a file and
  stops sending at t0 + --window-end-s, and a request that ended without a single token
  counts as failed. At the window end this process aborts every request on the server
  (POST /abort_request abort_all, repeated until the child exits); the streams end,
  bench_serving computes and writes its report: requests cut at the window end count with
  the tokens they got (TPOT = their decode time / tokens; E2E latency is cut), requests
  still queued (no token) are "failed" and left out, so TTFT percentiles cover only requests
  that started (queueing time grows without bound above capacity anyway).

Tokenizer: the dummy model folders hold only a config.json, and bench_serving's client needs
text in every streamed chunk (it times tokens by the chunks whose "text" is not empty). So a
word-level tokenizer with the model's vocabulary size is written to a temporary folder
(id i <-> "t<i>", 0 = "<unk>"; about 3.6 MB for Qwen3, made in a second, nothing to carry)
and serves both the server (--tokenizer-path) and bench_serving (--tokenizer, prompts sent
as ids with --tokenize-prompt). Every generated id decodes to text, so token timing is exact.
The server also always gets --incremental-streaming-output and --stream-interval 8 (one chunk
per 8 tokens, each holding only its new text): otherwise every chunk carries the whole text so
far and the single-threaded client parses O(n^2) bytes per request.

Output: --out JSON with the command line, git commit, engine, server command and info, load
arguments, the window metrics, the time series and bench_serving's report, rewritten every
--save-every-s (a run cut short keeps its data; "status" says how far it got). Logs beside it:
<out>-server.log, <out>-bench_serving.log.

CPU check (2-layer Qwen3 written to a temp folder; about 7 minutes on 2 busy cores, 5 of them
server start; it gave 150 output tok/s, 18 running, 163 compactions in the window):
  .venv/bin/python benchmarks/steady_state.py --tiny --engine zipage --num-prompts 40 \\
      --input-len 32 --output-len 200 --request-rate 4 --window-start-s 10 --window-end-s 40 \\
      --out /tmp/ss-tiny.json --zipage-kv-budget 64 --zipage-buffer 16 --max-total-tokens 2048

H200 (nvidia-h200), Qwen3-8B shape, default pool, budget 2048 + 256, 8k outputs (16k:
--output-len 16384 and -16k in the names). Arrivals at 8/s are far above capacity (about
1 request/s at 8k), so the queue only grows; 4400 prompts keep arrivals coming through the
window. One engine takes about 2 min to start, then the load runs to the window end, then
~20 s to drain: more than one 10-minute call, so it runs in the background and writes to
/tmp (each call has its own $OUT); follow-up calls must come before the machine is given
back (it stays warm ~30 s), and a pair must fit the ~28 minutes a session holds it.
benchmarks/steady_pair.sh runs both engines and the merge in one background chain (its
header has the windows that fit; results/steady-8k-h200.json is one such run); --add-row
MERGED RESULTS puts a merged file into throughput-h200.json as its steady-state row.
Both engines get the same flags (--zipage-* are ignored by stock; --cuda-graph-max-bs-decode
512 is what zipage sets by itself on a GPU, so stock gets it too).

What such a window shows (steady-8k-h200.json): with one output length, requests admitted
together finish together, so both engines run in waves for many request lifetimes (8k
tokens at ~37 ms a step is ~5 minutes); its "spans" (--merge --spans) give the ratio over
other spans of the same runs.
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
import threading
import time
import traceback
import types
from typing import Dict, List, Optional

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path[:0] = [HERE, os.path.join(REPO, "tests", "e2e")]
from bench_throughput import (git_commit, server_info, tiny_model_dir, vocab_size,  # noqa: E402
                              write_json)
from soak import get_json, load_snapshot, zipage_state  # noqa: E402
from throughput_load import log, rnd, zipage_progress  # noqa: E402
from zipage_server import Server  # noqa: E402

DEFAULT_MODEL = os.path.join(REPO, "benchmarks", "models", "qwen3-8b-dummy")
CHILD = "bench-serving-child"
NO_TOKEN_ERROR = "no output token before the window end (aborted while queued)"
OFFLINE_ENV = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
# sample key -> (Prometheus sample name, labels it must carry); summed over matching samples
PROM_COUNTERS = {
    "decode_tokens": ("sglang:realtime_tokens_total", {"mode": "decode"}),
    "prefill_tokens": ("sglang:realtime_tokens_total", {"mode": "prefill_compute"}),
    "retractions": ("sglang:num_retracted_requests_total", {}),
    "retracted_output_tokens": ("sglang:num_retracted_output_tokens_total", {}),
    "finished_requests": ("sglang:num_requests_total", {}),
}
ZIPAGE_KEYS = ("compactions", "pressure_compactions", "compaction_batches", "compaction_gpu_ms",
               "compaction_ms", "tokens_evicted", "running_compressed_requests")
BENCH_KEYS = ("completed", "duration", "total_output_tokens", "output_throughput",
              "median_ttft_ms", "p99_ttft_ms", "median_tpot_ms", "p99_tpot_ms",
              "median_itl_ms", "p99_itl_ms", "median_e2e_latency_ms", "concurrency")
WINDOW_KEYS = ("output_tok_s", "mean_running_reqs", "mean_waiting_reqs", "mean_pool_use",
               "retractions_per_min", "finished_per_min", "server_tpot_ms", "compaction_share")
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
    a("--commit", default=None, help="default: git rev-parse HEAD, else $ZIPAGE_COMMIT")
    a("--out", default="steady_state.json")
    a("--merge", nargs="+", metavar="JSON", help="merge single-engine (or merged) files into --out")
    a("--add-row", nargs=2, metavar=("MERGED", "RESULTS"), help="put a merged file's numbers "
      "into a bench_throughput result file as its steady-state row (e.g. "
      "results/steady-8k-h200.json results/throughput-h200.json)")
    a("--spans", default=None, help="with --merge: spans (s after the load started) to compare "
      "both engines over besides the window, e.g. 0-480,60-270 (default: the whole load and "
      "the window)")
    args, server_flags = p.parse_known_args(argv)
    if args.window_end_s <= args.window_start_s:
        p.error("--window-end-s must be > --window-start-s")
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
    info = get_json(url, "/server_info")
    # bench_throughput.server_info reads an engine's get_server_info(); /server_info is the same dict
    return server_info(types.SimpleNamespace(get_server_info=lambda: info))


# ------------------------------------------------------------------ sampling
def prometheus_counters(url: str) -> Dict[str, float]:
    from prometheus_client.parser import text_string_to_metric_families
    import requests

    text = requests.get(url + "/metrics", timeout=30).text
    out = {key: 0.0 for key in PROM_COUNTERS}  # a labelled counter appears on first use
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            for key, (name, labels) in PROM_COUNTERS.items():
                if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()):
                    out[key] += s.value
    return out


def loads_part(url: str) -> Dict:
    load = load_snapshot(url)
    return dict(running_reqs=load["num_running_reqs"], waiting_reqs=load["num_waiting_reqs"],
                used_tokens=load["num_used_tokens"], pool_tokens=load["max_total_num_tokens"])


def zipage_part(url: str) -> Dict:
    z = zipage_state(url)
    return {} if z is None else {"zipage": {k: z.get(k) for k in ZIPAGE_KEYS}}


def take_sample(url: str) -> Dict:
    s = {"epoch": round(time.time(), 3)}
    for part in (prometheus_counters, loads_part, zipage_part):
        try:
            s.update(part(url))
        except Exception as e:  # keep sampling; the window skips incomplete samples
            s.setdefault("errors", []).append(f"{part.__name__}: {e!r}"[:200])
    return s


class Sampler(threading.Thread):
    """Samples every interval into ``samples``; ``sample_now()`` adds one at once."""

    def __init__(self, url: str, interval_s: float):
        super().__init__(daemon=True)
        self.url, self.interval_s = url, interval_s
        self.samples: List[Dict] = []
        # not _stop: threading.Thread has a method of that name
        self._lock, self._halt = threading.Lock(), threading.Event()

    def sample_now(self) -> Dict:
        with self._lock:
            s = take_sample(self.url)
            self.samples.append(s)
            return s

    def run(self) -> None:
        next_t = time.time()
        while not self._halt.is_set():
            self.sample_now()
            next_t = max(next_t + self.interval_s, time.time())
            self._halt.wait(next_t - time.time())

    def stop(self) -> None:
        self._halt.set()
        self.join(timeout=60)


# ------------------------------------------------------------------ window
def with_times(samples: List[Dict], t0: Optional[float]) -> List[Dict]:
    return [{"t_s": None if t0 is None else round(s["epoch"] - t0, 3), **s} for s in samples]


def mean_of(samples: List[Dict], key: str, nd: int = 1) -> Optional[float]:
    xs = [s[key] for s in samples if s.get(key) is not None]
    return rnd(sum(xs) / len(xs), nd) if xs else None


def zipage_window(a: Dict, b: Dict, inside: List[Dict], span: float) -> Dict:
    za, zb = a["zipage"], b["zipage"]

    def d(key):
        return (zb.get(key) or 0) - (za.get(key) or 0)

    compressed = [s["zipage"].get("running_compressed_requests") for s in inside if "zipage" in s]
    return dict(compactions=d("compactions"), compactions_per_s=rnd(d("compactions") / span),
                pressure_compactions=d("pressure_compactions"),
                compaction_gpu_ms=rnd(d("compaction_gpu_ms"), 1),
                compaction_share=rnd(d("compaction_gpu_ms") / (span * 1e3), 4),
                compaction_launch_share=rnd(d("compaction_ms") / (span * 1e3), 4),
                tokens_evicted=d("tokens_evicted"),
                mean_compressed_running_reqs=rnd(sum(x or 0 for x in compressed) / len(compressed), 1)
                if compressed else None)


def window_metrics(samples: List[Dict], lo_s: float, hi_s: float) -> Dict:
    """Rates between the first and the last complete sample with lo_s <= t_s <= hi_s."""
    slack = 0.5
    inside = [s for s in samples if s["t_s"] is not None and "decode_tokens" in s
              and lo_s - slack <= s["t_s"] <= hi_s + slack]
    if len(inside) < 2:
        return {"error": f"fewer than 2 samples in [{lo_s}, {hi_s}] s"}
    a, b = inside[0], inside[-1]
    span = b["t_s"] - a["t_s"]
    pool = [dict(use=s["used_tokens"] / s["pool_tokens"]) for s in inside if s.get("pool_tokens")]
    out = dict(start_s=a["t_s"], end_s=b["t_s"], span_s=round(span, 3), samples=len(inside),
               output_tokens=b["decode_tokens"] - a["decode_tokens"],
               output_tok_s=rnd((b["decode_tokens"] - a["decode_tokens"]) / span, 1),
               prefill_tok_s=rnd((b["prefill_tokens"] - a["prefill_tokens"]) / span, 1),
               mean_running_reqs=mean_of(inside, "running_reqs"),
               min_running_reqs=min((s["running_reqs"] for s in inside if "running_reqs" in s), default=None),
               max_running_reqs=max((s["running_reqs"] for s in inside if "running_reqs" in s), default=None),
               mean_waiting_reqs=mean_of(inside, "waiting_reqs"),
               mean_pool_use=mean_of(pool, "use", 4),
               retractions=b["retractions"] - a["retractions"],
               retractions_per_min=rnd(60 * (b["retractions"] - a["retractions"]) / span),
               retracted_output_tokens=b["retracted_output_tokens"] - a["retracted_output_tokens"],
               finished=b["finished_requests"] - a["finished_requests"],
               finished_per_min=rnd(60 * (b["finished_requests"] - a["finished_requests"]) / span))
    if out["output_tok_s"] and out["mean_running_reqs"]:
        out["server_tpot_ms"] = rnd(1e3 * out["mean_running_reqs"] / out["output_tok_s"])
    if "zipage" in a and "zipage" in b:
        out["zipage"] = zipage_window(a, b, inside, span)
        out["compaction_share"] = out["zipage"]["compaction_share"]
    return out


def progress_line(prev: Dict, s: Dict) -> str:
    rate = None
    if prev and "decode_tokens" in prev and "decode_tokens" in s and s["epoch"] > prev["epoch"]:
        rate = (s["decode_tokens"] - prev["decode_tokens"]) / (s["epoch"] - prev["epoch"])
    use = s["used_tokens"] / s["pool_tokens"] if s.get("pool_tokens") else None
    return (f"t={s['t_s']}s tok/s={rnd(rate, 1)} running={s.get('running_reqs')} "
            f"waiting={s.get('waiting_reqs')} pool_use={rnd(use, 3)} retractions="
            f"{s.get('retractions')} finished={s.get('finished_requests')}{zipage_progress(s)}"
            + (f" errors={s['errors']}" if s.get("errors") else ""))


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


def start_bench_serving(bench_argv: List[str], t0_file: str, stop_after_s: float, log_path: str):
    cmd = [sys.executable, os.path.abspath(__file__), CHILD, "--t0-file", t0_file,
           "--stop-after-s", str(stop_after_s), "--", *bench_argv]
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


def bench_serving_child(argv: List[str]) -> None:
    """``steady_state.py bench-serving-child --t0-file F --stop-after-s S -- BENCH_SERVING_ARGS``"""
    split = argv.index("--")
    p = argparse.ArgumentParser(prog=f"steady_state.py {CHILD}")
    p.add_argument("--t0-file", required=True)
    p.add_argument("--stop-after-s", type=float, required=True)
    own = p.parse_args(argv[:split])
    from sglang.benchmark import serving

    serving.get_request = arrivals_until(serving.get_request, own.t0_file, own.stop_after_s)
    for backend in ("sglang", "sglang-native"):
        serving.ASYNC_REQUEST_FUNCS[backend] = tokens_required(serving.ASYNC_REQUEST_FUNCS[backend])
    sys.argv = ["sglang.bench_serving", *argv[split + 1:]]
    serving.cli_main()


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


def stop_process(proc, grace_s: float = 15.0) -> None:
    if proc is None or proc.poll() is not None:
        return
    proc.terminate()
    try:
        proc.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=grace_s)


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
        self.t0: Optional[float] = None
        self.t_start = time.time()
        with open(os.path.join(self.model_dir, "config.json")) as f:
            model_config = json.load(f)
        self.doc = dict(benchmark="steady_state", status="starting", engine=args.engine,
                        command=" ".join(shlex.quote(x) for x in [sys.argv[0], *argv]),
                        commit=args.commit or git_commit(), started=time.strftime("%Y-%m-%d %H:%M:%S"),
                        model_dir=("tiny (bench_throughput.tiny_model_dir)" if args.tiny
                                   else self.model_dir),
                        model_config=model_config, notes=NOTES,
                        load=dict(num_prompts=args.num_prompts, request_rate=args.request_rate,
                                  input_len=args.input_len, output_len=args.output_len,
                                  range_ratio=args.range_ratio, max_concurrency=args.max_concurrency,
                                  seed=args.seed, window_start_s=args.window_start_s,
                                  window_end_s=args.window_end_s),
                        server={}, window=None, samples=[], bench_serving=None)

    # -- steps
    def start_server(self) -> None:
        tok = write_tokenizer(os.path.join(self.work, "tokenizer"), vocab_size(self.model_dir))
        flags = server_flags_for(self.args, self.model_dir, tok, self.extra_flags)
        log(f"starting the {self.args.engine} server: {' '.join(flags)}")
        t = time.time()
        self.server = Server(flags, self.base + "-server.log", env=OFFLINE_ENV,
                             ready_timeout=self.args.server_timeout_s)
        self.doc["server"] = dict(
            command=" ".join(["python", "-m", "sglang_zipage.launch_server", "--host", "127.0.0.1",
                              "--port", str(self.server.port), *map(shlex.quote, flags)]),
            extra_flags=self.extra_flags, ready_s=round(time.time() - t, 1),
            log=self.base + "-server.log", info=server_summary(self.server.url))
        log(f"server ready in {self.doc['server']['ready_s']} s at {self.server.url}")
        self.sampler = Sampler(self.server.url, self.args.sample_interval_s)
        self.sampler.start()

    def start_load(self) -> None:
        bench_argv = bench_serving_argv(self.args, self.server.url,
                                        os.path.join(self.work, "tokenizer"), self.report_path)
        self.doc["load"]["bench_serving_argv"] = bench_argv
        self.child = start_bench_serving(bench_argv, self.t0_file, self.args.window_end_s,
                                         self.base + "-bench_serving.log")
        deadline = time.time() + self.args.load_start_timeout_s
        while not os.path.exists(self.t0_file):
            self.check_alive(child_may_end=False)
            if time.time() > deadline:
                raise RuntimeError("bench_serving did not start its load in time")
            time.sleep(0.5)
        with open(self.t0_file) as f:
            self.t0 = float(f.read())
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
                requests.post(self.server.url + "/abort_request", json={"abort_all": True}, timeout=30)
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
    def check_alive(self, child_may_end: bool) -> bool:
        """False once bench_serving has ended (if allowed); raises if anything died."""
        if self.server.proc.poll() is not None:
            raise RuntimeError(f"server exited with {self.server.proc.returncode}; see its log")
        code = self.child.poll()
        if code is None:
            return True
        if child_may_end and code == 0:
            return False
        raise RuntimeError(f"bench_serving exited with {code}; see {self.base}-bench_serving.log")

    def window(self) -> Dict:
        return window_metrics(with_times(list(self.sampler.samples), self.t0),
                              self.args.window_start_s, self.args.window_end_s)

    def print_progress(self) -> None:
        samples = with_times(list(self.sampler.samples[-12:]), self.t0)
        if samples:
            back = max(1, min(len(samples) - 1, round(self.args.progress_s / self.args.sample_interval_s)))
            print(f"[{self.args.engine}] " + progress_line(samples[-1 - back] if len(samples) > 1 else None,
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
            if self.server is not None:
                self.doc["server"]["pids_alive_after_stop"] = self.server.stop()
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
    print("SUMMARY " + json.dumps(summary(r.doc)), flush=True)
    return r.doc


def summary(doc: Dict) -> Dict:
    w, b = doc.get("window") or {}, doc.get("bench_serving") or {}
    return {"engine": doc["engine"], "status": doc["status"],
            **{k: w.get(k) for k in WINDOW_KEYS},
            "compactions": (w.get("zipage") or {}).get("compactions"),
            "bench_serving": {k: rnd(b.get(k)) for k in BENCH_KEYS if k in b}}


# ------------------------------------------------------------------ merge
def ratio(z, s) -> Optional[float]:
    return round(z / s, 3) if isinstance(z, (int, float)) and isinstance(s, (int, float)) and s else None


RUN_SPECIFIC = ("--base-url", "--tokenizer", "--output-file")  # a port and temporary paths


def same_load(a: Optional[Dict], b: Optional[Dict]) -> Optional[bool]:
    """Whether two runs had the same load, bench_serving's run-specific arguments aside."""
    if not a or not b:
        return None

    def norm(load):
        argv = list(load.get("bench_serving_argv") or [])
        for flag in RUN_SPECIFIC:
            if flag in argv and argv.index(flag) + 1 < len(argv):
                argv[argv.index(flag) + 1] = "*"
        return {**load, "bench_serving_argv": argv}
    return norm(a) == norm(b)


def compare(stock: Dict, zipage: Dict) -> Dict:
    """zipage / stock for the window metrics and bench_serving's report."""
    out = {}
    for name, keys in (("window", WINDOW_KEYS), ("bench_serving", BENCH_KEYS)):
        for k in keys:
            s, z = (stock.get(name) or {}).get(k), (zipage.get(name) or {}).get(k)
            out[f"{name}.{k}"] = {"stock": s, "zipage": z, "ratio": ratio(z, s)}
    if same_load(stock.get("load"), zipage.get("load")) is False:
        out["warning"] = "the two runs had different load arguments"
    return out


SPAN_KEYS = ("start_s", "end_s", "output_tok_s", "finished", "mean_running_reqs",
             "min_running_reqs", "max_running_reqs", "mean_pool_use")


def compare_spans(stock: Dict, zipage: Dict, spans: List[List[float]]) -> List[Dict]:
    """Both engines over other spans of the same runs (the window is one span of a run that
    may move in waves; these say how much the ratio depends on where it is taken)."""
    def until_abort(run):  # samples after the window end see the abort (all "finished")
        end = (run.get("load") or {}).get("window_end_s", float("inf"))
        return [x for x in run.get("samples") or [] if x.get("t_s") is not None and x["t_s"] <= end]

    samples = [until_abort(stock), until_abort(zipage)]
    rows = []
    for start, end in spans:
        s, z = ({k: m.get(k) for k in SPAN_KEYS} if "error" not in m else m
                for m in (window_metrics(smp, start, end) for smp in samples))
        rows.append(dict(span_s=[start, end], stock=s, zipage=z,
                         ratio=ratio(z.get("output_tok_s"), s.get("output_tok_s"))))
    return rows


def default_spans(stock: Dict) -> List[List[float]]:
    """The whole load and the window."""
    load = stock.get("load") or {}
    start, end = load.get("window_start_s"), load.get("window_end_s")
    return [[0.0, end], [start, end]] if end else []


def merge(paths: List[str], out: str, spans: Optional[List[List[float]]] = None) -> Dict:
    """Single-engine files (or merged ones, whose engines are taken again) side by side."""
    sources = []  # (path, single-engine doc)
    for p in paths:
        d = json.load(open(p))
        if "engine" in d:
            sources.append((p, d))
        else:
            origin = {m["engine"]: m["path"] for m in d.get("merged_from", [])}
            sources += [(origin.get(name, p), e) for name, e in d.get("engines", {}).items()]
    docs = [d for _, d in sources]
    engines = {d["engine"]: d for d in docs}
    res = dict(benchmark="steady_state (merged)",
               merged_from=[dict(path=p, engine=d["engine"], command=d.get("command"),
                                 commit=d.get("commit"), status=d.get("status"))
                            for p, d in sources],
               summary=[summary(d) for d in docs], engines=engines)
    if "stock" in engines and "zipage" in engines:
        res["comparison"] = compare(engines["stock"], engines["zipage"])
        res["output_tok_s_ratio"] = res["comparison"]["window.output_tok_s"]["ratio"]
        res["spans"] = compare_spans(engines["stock"], engines["zipage"],
                                     spans or default_spans(engines["stock"]))
    write_json(res, out)
    print("MERGED " + json.dumps({k: res.get(k) for k in ("summary", "output_tok_s_ratio")}), flush=True)
    return res


ROW_BENCH_KEYS = ("completed", "total_output_tokens", "output_throughput", "median_e2e_latency_ms",
                  "median_ttft_ms", "p99_ttft_ms", "median_tpot_ms", "p99_tpot_ms",
                  "median_itl_ms", "p99_itl_ms")
ROW_WINDOW_KEYS = ("output_tok_s", "mean_running_reqs", "min_running_reqs", "max_running_reqs",
                   "mean_waiting_reqs", "mean_pool_use", "retractions_per_min",
                   "finished_per_min", "server_tpot_ms", "compaction_share")


def flag_value(command: str, flag: str, default: str) -> str:
    words = shlex.split(command or "")
    return words[words.index(flag) + 1] if flag in words[:-1] else default


def throughput_row(merged: Dict, source: str) -> Dict:
    """A merged steady-state file as a row of bench_throughput's result file (its "loads"),
    with "regime": "steady-state"; the time series stay in ``source``. The merged file's
    hand-written "device_command" and "caveat" come along."""
    engines, load = merged["engines"], merged["engines"]["stock"]["load"]

    def engine(run):
        w = run["window"]
        return dict(command=run["command"], commit=(run.get("commit") or "")[:7],
                    server_command=run["server"].get("command"),
                    window_start_s=w["start_s"], window_end_s=w["end_s"],
                    **{k: w.get(k) for k in ROW_WINDOW_KEYS},
                    bench_serving={k: rnd(run["bench_serving"][k], 2) for k in ROW_BENCH_KEYS
                                   if k in run["bench_serving"]})

    stock, zipage = engine(engines["stock"]), engine(engines["zipage"])
    zipage_cmd = zipage["server_command"]
    return dict(
        load=f"poisson:rate={load['request_rate']:g}:output_len={load['output_len']}",
        spec=dict(name="poisson", num_requests=load["num_prompts"], input_len=load["input_len"],
                  output_len=load["output_len"], shared_prefix_len=0, until="window",
                  request_rate=load["request_rate"],
                  arrivals=f"sglang.bench_serving --request-rate {load['request_rate']:g} "
                           "(Poisson), random ids, ignore_eos"),
        kv_cache_dtype=flag_value(zipage_cmd, "--kv-cache-dtype", "auto"),
        zipage_mode=flag_value(zipage_cmd, "--zipage-mode", "elastic"),
        stock=stock, zipage=zipage, stock_output_tok_s=stock["output_tok_s"],
        zipage_output_tok_s=zipage["output_tok_s"], ratio=merged["output_tok_s_ratio"],
        compaction_share=zipage["compaction_share"], regime="steady-state",
        output_len=load["output_len"], source=f"{source} (time series, spans, notes)",
        device_command=merged.get("device_command"), caveat=merged.get("caveat"),
        spans=merged.get("spans"))


def add_row(merged_path: str, results_path: str) -> Dict:
    """Put a merged file's row into a bench_throughput result file, replacing the row of the
    same load, and write it back."""
    with open(merged_path) as f:
        row = throughput_row(json.load(f), os.path.basename(merged_path))
    with open(results_path) as f:
        res = json.load(f)
    loads = res.setdefault("loads", [])
    same = [i for i, e in enumerate(loads) if e.get("load") == row["load"]]
    if same:
        loads[same[0]] = row
    else:
        loads.append(row)
    write_json(res, results_path)
    return row


def parse_spans(text: Optional[str]) -> Optional[List[List[float]]]:
    """'0-480,60-270' -> [[0, 480], [60, 270]]."""
    if not text:
        return None
    return [[float(x) for x in part.split("-")] for part in text.split(",")]


def main(argv: Optional[List[str]] = None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == [CHILD]:
        bench_serving_child(argv[1:])
        return
    args, extra_flags = parse_args(argv)
    if args.merge:
        merge(args.merge, args.out, parse_spans(args.spans))
        return
    if args.add_row:
        add_row(*args.add_row)
        return
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # cleanup runs in run()'s finally
    run(args, extra_flags, argv)


if __name__ == "__main__":
    main()
