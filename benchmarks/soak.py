#!/usr/bin/env python3
"""Soak a running server with mixed requests and client aborts, then look for leaks (issue 7).

Sends --num-requests requests to ``URL/generate``, at most --concurrency at a time, drawn from
a seeded mix: short or long outputs (ignore_eos, so a completed one has exactly
max_new_tokens), shared-prefix or unique prompts (some longer than a prefill chunk), the
server's budget, a small ``zipage_kv_budget`` or 0, streaming or not, and streams dropped by the
client after a random number of tokens (half of them near the first compaction). Prompts are
text, or token ids with --input-ids. Then it waits until the server is idle and records
``leaked_slots`` (KV slots used at idle + shadow tokens + window slots held: /v1/loads and
/server_info) and ``errors`` (non-200 answers, broken streams, wrong completion_tokens, missing
meta_info keys, a request holding more KV than prompt + budget + buffer); run the server under
SGLang's strict memory checker so a leak kills it. Works against stock SGLang too (zipage
checks skipped). The JSON goes to --out (and stdout).

  python benchmarks/soak.py --url http://127.0.0.1:30000 --num-requests 300 \\
      --concurrency 8 --seed 0 --out /tmp/soak.json
--start-server "SERVER FLAGS" (instead of --url) starts the launcher itself on a 2-layer Qwen3
with dummy weights under the strict memory checker (pass --input-ids), and records the server
command and the tracebacks in its log. The H200 run (results/soak-h200.json):
  python3 benchmarks/soak.py --out $OUT/soak-h200.json --start-server "--attention-backend \\
      triton --page-size 16 --zipage-mode fixed --zipage-async --zipage-kv-budget 256 \\
      --zipage-buffer 64 --max-total-tokens 32768 --disable-prefill-cuda-graph" \\
      --input-ids --num-requests 10000 --concurrency 256 --seed 0
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shlex
import shutil
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from typing import List, Optional

import requests

from sglang_zipage.config import async_lag
from sglang_zipage.harness.engines import TINY_NAME, tiny_model_dir
from sglang_zipage.harness.probe import get_json, healthy, server_info, wait_idle, zipage_state
from sglang_zipage.harness.record import command_line
from sglang_zipage.harness.server import STRICT_MEM_ENV, Server

META_KEYS = ("prompt_tokens", "completion_tokens", "finish_reason")
ZIPAGE_META_KEYS = ("zipage_compactions", "zipage_kv_len")
WORDS = ("river stone light garden paper window music winter market bridge forest number "
         "engine silver letter mountain question cloud harbor lantern orchard signal "
         "village copper morning ladder").split()


@dataclass
class Job:
    index: int
    prompt: object  # str or List[int]
    prompt_kind: str  # shared / unique / long
    max_new_tokens: int
    budget: Optional[int]  # None: server default
    stream: bool
    abort_after: Optional[int]  # output tokens after which the client drops the stream
    near_compaction: bool = False


@dataclass
class Outcome:
    index: int
    status: str  # completed / aborted / error
    detail: str = ""
    compactions: Optional[int] = None
    tokens: int = 0
    retractions: int = 0


@dataclass
class Tally:
    lock: threading.Lock = field(default_factory=threading.Lock)
    outcomes: List[Outcome] = field(default_factory=list)

    def add(self, o: Outcome) -> None:
        with self.lock:
            self.outcomes.append(o)


def ceil_to(n: int, page: int) -> int:
    return -(-n // page) * page


# ------------------------------------------------------------------ server facts
def server_facts(url: str) -> dict:
    info = server_info(url)
    state = info["internal_states"][0]
    z = state.get("zipage")
    facts = dict(page_size=info.get("page_size") or 1,
                 incremental=bool(info.get("incremental_streaming_output")),
                 skip_tokenizer_init=bool(info.get("skip_tokenizer_init")),
                 context_len=get_json(url, "/v1/models")["data"][0].get("max_model_len"),
                 zipage=z is not None and bool(z.get("active")))
    if facts["zipage"]:
        cfg = z["config"]
        facts.update(kv_budget=cfg["kv_budget"], buffer=cfg["buffer"], window=cfg["window"],
                     sink=cfg["sink"], async_compaction=bool(cfg.get("async_compaction")),
                     mode=cfg.get("mode", "fixed"))
    return facts


# ------------------------------------------------------------------ the workload
class Workload:
    def __init__(self, args, facts: dict):
        self.args, self.facts = args, facts
        self.rng = random.Random(args.seed)
        page = facts["page_size"]
        if facts["zipage"]:
            least = ceil_to(facts["window"] + facts["sink"], page)
            self.small_budget = args.small_budget or max(least, facts["kv_budget"] // 2 // page * page)
            self.lag = async_lag(page) if facts["async_compaction"] else 0
            default_long = facts["kv_budget"] + facts["buffer"] + 2 * facts["buffer"]
        else:
            self.small_budget, self.lag, default_long = None, 0, 256
        self.long_len = args.long_len or default_long
        self.short_len = args.short_len
        self.shared_prefix = self._text(args.prefix_words) if not args.input_ids else self._ids(args.prefix_words)

    def _text(self, n: int) -> str:
        return " ".join(self.rng.choice(WORDS) for _ in range(n))

    def _ids(self, n: int) -> List[int]:
        return [self.rng.randrange(100, self.args.vocab_size - 100) for _ in range(n)]

    def _prompt(self):
        a, r = self.args, self.rng.random()
        if r < 0.4:  # shared prefix + a short own part: radix hits on the prefix
            kind, own = "shared", 4 + self.rng.randrange(12)
            if a.input_ids:
                return kind, self.shared_prefix + self._ids(own)
            return kind, f"{self.shared_prefix}\nQuestion {self._text(own)}?\nAnswer:"
        kind, n = ("long", a.long_prompt_words) if r > 0.85 else ("unique", 8 + self.rng.randrange(24))
        if a.input_ids:
            return kind, self._ids(n)
        return kind, f"Write about {self._text(n)}."

    def trigger(self, budget: Optional[int]) -> Optional[int]:
        """Output tokens at which a request's first compaction starts (about: the suffix
        also holds the prompt's partial last page)."""
        if not self.facts["zipage"] or budget == 0:
            return None
        k = budget if budget is not None else self.facts["kv_budget"]
        return k + self.facts["buffer"] - self.lag

    def jobs(self) -> List[Job]:
        out = []
        a = self.args
        for i in range(a.num_requests):
            kind, prompt = self._prompt()
            long = self.rng.random() < a.long_share
            n = self.long_len if long else self.short_len
            if self.facts["zipage"]:
                budget = self.rng.choice([None, None, self.small_budget, 0])
            else:
                budget = None
            stream = self.rng.random() < 0.5
            abort_after, near = None, False
            if stream and long and self.rng.random() < a.abort_share:
                trig = self.trigger(budget)
                page = self.facts["page_size"]
                if trig is not None and self.rng.random() < 0.5:
                    # the first compaction starts between trig - page and trig output
                    # tokens (the suffix also holds the prompt's last partial page) and
                    # commits up to lag tokens later: drop anywhere around that
                    near = True
                    lo, hi = max(1, trig - page - 2), min(n - 1, trig + self.lag + 2)
                    abort_after = self.rng.randint(lo, max(lo, hi))
                else:
                    abort_after = self.rng.randint(1, n - 1)
            out.append(Job(i, prompt, kind, n, budget, stream, abort_after, near))
        return out


# ------------------------------------------------------------------ one request
def body_of(job: Job) -> dict:
    sp = {"max_new_tokens": job.max_new_tokens, "temperature": 0, "ignore_eos": True}
    if job.budget is not None:
        sp["zipage_kv_budget"] = job.budget
    body = {"sampling_params": sp, "stream": job.stream}
    body["input_ids" if isinstance(job.prompt, list) else "text"] = job.prompt
    return body


def check_final(job: Job, out: dict, facts: dict, text: str, n_ids: int) -> str:
    """Empty string if the completed response is whole; else what is wrong."""
    meta = out.get("meta_info")
    if not isinstance(meta, dict):
        return "no meta_info"
    want = META_KEYS + (ZIPAGE_META_KEYS if facts["zipage"] else ())
    missing = [k for k in want if k not in meta]
    if missing:
        return f"meta_info lacks {missing}"
    if meta["completion_tokens"] != job.max_new_tokens:
        return f"completion_tokens {meta['completion_tokens']} != {job.max_new_tokens}"
    fr = meta["finish_reason"]
    if not isinstance(fr, dict) or fr.get("type") != "length":
        return f"finish_reason {fr!r}, expected length"
    if facts["skip_tokenizer_init"]:
        if n_ids != job.max_new_tokens:
            return f"{n_ids} output_ids != {job.max_new_tokens}"
    elif not text:
        return "empty text"
    if facts["zipage"]:
        if job.budget == 0 and meta["zipage_compactions"] != 0:
            return f"budget 0 but {meta['zipage_compactions']} compactions"
        if facts["mode"] == "elastic":  # the budget is a floor: compacted only on demand
            if meta.get("zipage_pressure_compactions") != meta["zipage_compactions"]:
                return (f"elastic: {meta['zipage_compactions']} compactions, "
                        f"{meta.get('zipage_pressure_compactions')} of them on demand")
            return ""
        k = facts["kv_budget"] if job.budget is None else job.budget
        k *= 2 ** (meta.get("zipage_loop_guard") or 0)  # each loop-guard trigger doubled it
        if job.budget != 0 and meta["zipage_kv_len"] > meta["prompt_tokens"] + k + facts["buffer"]:
            return (f"zipage_kv_len {meta['zipage_kv_len']} > prompt {meta['prompt_tokens']} "
                    f"+ budget {k} + buffer {facts['buffer']}")
    return ""


def run_job(url: str, job: Job, facts: dict, timeout: float) -> Outcome:
    try:
        if not job.stream:
            r = requests.post(url + "/generate", json=body_of(job), timeout=timeout)
            if r.status_code != 200:
                return Outcome(job.index, "error", f"HTTP {r.status_code}: {r.text[:200]}")
            out = r.json()
            bad = check_final(job, out, facts, out.get("text") or "", len(out.get("output_ids") or []))
            return _final(job, out, bad)
        return _stream(url, job, facts, timeout)
    except (requests.RequestException, ValueError) as e:
        return Outcome(job.index, "error", f"{type(e).__name__}: {e}"[:300])


def _final(job: Job, out: dict, bad: str) -> Outcome:
    if bad:
        return Outcome(job.index, "error", bad)
    meta = out["meta_info"]
    return Outcome(job.index, "completed", compactions=meta.get("zipage_compactions"),
                   tokens=meta["completion_tokens"], retractions=meta.get("num_retractions") or 0)


def _stream(url: str, job: Job, facts: dict, timeout: float) -> Outcome:
    text, n_ids, last = "", 0, None
    with requests.Session() as s:  # its own connection: closing it aborts the request
        with s.post(url + "/generate", json=body_of(job), stream=True, timeout=timeout) as r:
            if r.status_code != 200:
                return Outcome(job.index, "error", f"HTTP {r.status_code}: {r.text[:200]}")
            for line in r.iter_lines():
                if not line.startswith(b"data:"):
                    continue
                payload = line[5:].strip()
                if payload == b"[DONE]":
                    break
                chunk = json.loads(payload)
                if "error" in chunk:
                    return Outcome(job.index, "error", f"stream error: {str(chunk)[:200]}")
                last = chunk
                if facts["incremental"]:
                    text += chunk.get("text") or ""
                    n_ids += len(chunk.get("output_ids") or [])
                else:
                    text = chunk.get("text") or text
                    n_ids = len(chunk.get("output_ids") or [])
                done = (chunk.get("meta_info") or {}).get("completion_tokens", 0)
                if job.abort_after is not None and done >= job.abort_after:
                    if (chunk["meta_info"].get("finish_reason") is None):
                        r.close()  # the client goes away mid-generation
                        return Outcome(job.index, "aborted", tokens=done,
                                       compactions=chunk["meta_info"].get("zipage_compactions"))
    if last is None:
        return Outcome(job.index, "error", "stream ended without a chunk")
    if (last.get("meta_info") or {}).get("finish_reason") is None:
        return Outcome(job.index, "error", "stream ended before the request finished")
    return _final(job, last, check_final(job, last, facts, text, n_ids))


# ------------------------------------------------------------------ idle and leaks
def leak_report(url: str, facts: dict, settle_s: float, idle_timeout: float) -> dict:
    first = wait_idle(url, idle_timeout, zipage=facts["zipage"])
    time.sleep(settle_s)  # the scheduler runs its idle memory check once it has nothing to do
    again = wait_idle(url, idle_timeout, zipage=facts["zipage"])
    load, z = again["load"], again["zipage"]
    rep = {"idle": first["idle"] and again["idle"], "kv_tokens_used_at_idle": load["num_used_tokens"],
           "max_total_num_tokens": load["max_total_num_tokens"]}
    leaked = load["num_used_tokens"]
    if z is not None:
        total = z.get("window_slots")
        rep.update(shadow_tokens_held=z["shadow_tokens_held"],
                   running_compressed_requests=z["running_compressed_requests"],
                   free_window_slots=z["free_window_slots"], window_slots=total)
        leaked += z["shadow_tokens_held"]
        if total is not None:
            rep["window_slots_held_at_idle"] = total - z["free_window_slots"]
            leaked += total - z["free_window_slots"]
    rep["leaked_slots"] = leaked
    return rep


# ------------------------------------------------------------------ main
def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    a = p.add_argument
    where = p.add_mutually_exclusive_group(required=True)
    where.add_argument("--url", help="server base URL, e.g. http://127.0.0.1:30000")
    where.add_argument("--start-server", nargs="?", const="", metavar="SERVER FLAGS",
                       help="start a server on the 2-layer dummy Qwen3 with these flags (one "
                            "string), soak it, stop it (needs --out and --input-ids)")
    a("--num-requests", type=int, default=300)
    a("--concurrency", type=int, default=8)
    a("--seed", type=int, default=0)
    a("--short-len", type=int, default=8, help="max_new_tokens of short requests")
    a("--long-len", type=int, default=None,
      help="max_new_tokens of long requests (default: budget + 3 x buffer of the server)")
    a("--long-share", type=float, default=0.35, help="share of long requests")
    a("--abort-share", type=float, default=0.7,
      help="share of long streaming requests the client drops")
    a("--small-budget", type=int, default=None,
      help="the small per-request zipage_kv_budget (default: half the server's, page aligned)")
    a("--prefix-words", type=int, default=40, help="length of the shared prefix (words or ids)")
    a("--long-prompt-words", type=int, default=150, help="length of long prompts (words or ids)")
    a("--input-ids", action="store_true",
      help="send token ids instead of text (servers with --skip-tokenizer-init)")
    a("--vocab-size", type=int, default=32000, help="with --input-ids: ids < this")
    a("--request-timeout", type=float, default=1800)
    a("--idle-timeout", type=float, default=300)
    a("--settle-s", type=float, default=3.0)
    a("--out", default=None, help="JSON file to write")
    args = p.parse_args(argv)
    if args.start_server is not None and not args.out:
        p.error("--start-server needs --out (the server's log goes beside it)")
    return args


def soak(args, argv=None) -> dict:
    url = args.url.rstrip("/")
    t0 = time.perf_counter()
    facts = server_facts(url)
    if facts["skip_tokenizer_init"] and not args.input_ids:
        raise SystemExit("the server runs with --skip-tokenizer-init: pass --input-ids")
    before = leak_report(url, facts, 0.0, args.idle_timeout)
    z_before = zipage_state(url) if facts["zipage"] else None
    wl = Workload(args, facts)
    jobs = wl.jobs()
    tally = Tally()
    with ThreadPoolExecutor(args.concurrency) as ex:
        for o in ex.map(lambda j: run_job(url, j, facts, args.request_timeout), jobs):
            tally.add(o)
    load_s = time.perf_counter() - t0
    leaks = leak_report(url, facts, args.settle_s, args.idle_timeout)
    z_after = zipage_state(url) if facts["zipage"] else None
    outs = tally.outcomes
    count = lambda s: sum(o.status == s for o in outs)
    errors = [o for o in outs if o.status == "error"]
    by = lambda pred: sum(1 for j in jobs if pred(j))
    res = {
        "command": command_line(argv, prog="benchmarks/soak.py"),
        "requests": len(jobs), "aborted": count("aborted"), "completed": count("completed"),
        "errors": len(errors), "leaked_slots": leaks["leaked_slots"],
        "healthy": healthy(url), "idle_before": before, "idle_after": leaks,
        "error_samples": [asdict(o) for o in errors[:10]],
        "mix": {"long": by(lambda j: j.max_new_tokens == wl.long_len),
                "stream": by(lambda j: j.stream),
                "planned_aborts": by(lambda j: j.abort_after is not None),
                "planned_aborts_near_compaction": by(lambda j: j.near_compaction),
                "budget_default": by(lambda j: j.budget is None),
                "budget_small": by(lambda j: j.budget not in (None, 0)),
                "budget_off": by(lambda j: j.budget == 0),
                "prompts": {k: by(lambda j, k=k: j.prompt_kind == k) for k in ("shared", "unique", "long")}},
        "settings": {"short_len": wl.short_len, "long_len": wl.long_len,
                     "small_budget": wl.small_budget, "seed": args.seed,
                     "concurrency": args.concurrency, "input_ids": args.input_ids},
        "server": facts,
        "output_tokens_completed": sum(o.tokens for o in outs if o.status == "completed"),
        "aborted_after_a_compaction": sum(1 for o in outs if o.status == "aborted" and o.compactions),
        "completed_with_compactions": sum(1 for o in outs if o.status == "completed" and o.compactions),
        "retractions_of_completed": sum(o.retractions for o in outs if o.status == "completed"),
        "retracted": [dict(index=o.index, retractions=o.retractions, budget=jobs[o.index].budget,
                           prompt=jobs[o.index].prompt_kind, compactions=o.compactions)
                      for o in outs if o.status == "completed" and o.retractions],
        "load_s": round(load_s, 1), "total_s": round(time.perf_counter() - t0, 1),
    }
    if z_before is not None and z_after is not None:
        res["zipage_delta"] = {k: z_after[k] - z_before[k] for k in
                               ("compactions", "async_compactions", "async_awaited",
                                "async_fallbacks", "tokens_evicted", "window_slot_misses",
                                "pressure_compactions", "squeezed_compactions",
                                "early_compactions", "prompt_copies", "prompt_tokens_owned",
                                "prompt_copy_misses")
                               if k in z_after and k in z_before}
        res["max_suffix_tokens"] = z_after["max_suffix_tokens"]
    return res


SERVER_BASE_FLAGS = ["--load-format", "dummy", "--skip-tokenizer-init", "--sampling-backend",
                     "pytorch", "--grammar-backend", "none"]
SUMMARY_KEYS = ("requests", "aborted", "completed", "errors", "leaked_slots", "healthy",
                "server_log_tracebacks", "load_s")


def soak_own_server(args, argv=None) -> dict:
    """--start-server: the tiny model's server under the strict memory checker, soaked, then
    stopped (SIGTERM: SGLang ends its own tree); the result also names the server command
    and counts the tracebacks in its log (the checker raises in the scheduler)."""
    model = tiny_model_dir()
    flags = [*SERVER_BASE_FLAGS, *shlex.split(args.start_server)]
    log_path = os.path.splitext(args.out)[0] + "-server.log"
    t0 = time.monotonic()
    try:
        server = Server(["--model-path", model, *flags], log_path, env=STRICT_MEM_ENV)
        print(f"server up after {time.monotonic() - t0:.0f}s", flush=True)
        try:
            args.url = server.url
            res = soak(args, argv)
        finally:
            server.stop()
        shown = server.command()[1:]
        shown[shown.index(model)] = f"<{TINY_NAME}>"
        res["server_command"] = " ".join([*(f"{k}={v}" for k, v in STRICT_MEM_ENV.items()),
                                          command_line(shown, prog=sys.executable)])
        res["server_log_tracebacks"] = server.log().count("Traceback")
    finally:
        shutil.rmtree(model, ignore_errors=True)
    return res


def main(argv=None) -> int:
    args = parse_args(argv)
    res = soak(args, argv) if args.start_server is None else soak_own_server(args, argv)
    text = json.dumps(res, indent=1)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text + "\n")
    print(text if args.start_server is None else json.dumps({k: res[k] for k in SUMMARY_KEYS}))
    ok = res["errors"] == 0 and res["leaked_slots"] == 0 and res["healthy"]
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
