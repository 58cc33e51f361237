"""Time series of a benchmark run and the statistics of a window of it.

A sample is a dict: its time (``t_s`` seconds after the load started; a server sampler also
keeps ``epoch``), the benchmark's own counters, the load of the engine or server (running
and waiting requests, KV slots used) and a chosen part of its zipage counters (``take_sample``,
the one sample taker; ``Sampler`` runs it on a thread against a URL). A window's rates are
differences between its first and last sample over their time difference (``Window``);
``first_wave_window`` and ``steady_window`` lay them out as the result files of
bench_throughput.py and steady_state.py name them. ``progress_line`` is the one progress
line every benchmark prints.
"""

from __future__ import annotations

import asyncio
import math
import threading
import time
from typing import Dict, Iterable, List, Optional

from sglang_zipage.harness import probe

# the zipage window of a steady-state result (steady_state.py)
STEADY_ZIPAGE_KEYS = ("compactions", "compactions_per_s", "pressure_compactions",
                      "compaction_gpu_ms", "compaction_share", "compaction_launch_share",
                      "tokens_evicted", "mean_compressed_running_reqs", "squeezed_compactions",
                      "windowless_compactions", "loop_guard_triggers")


def log(*a) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}]", *a, flush=True)


def rnd(x, nd=2):
    return None if x is None else round(x, nd)


def pct(xs: List[float], q: float) -> Optional[float]:
    """The q-th percentile, linear between the closest ranks."""
    if not xs:
        return None
    xs = sorted(xs)
    pos = (len(xs) - 1) * q / 100.0
    lo = int(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


# ---------------------------------------------------------------- samples
async def take_sample(stamp: Dict, target, zipage_keys: Iterable[str], counters=None) -> Dict:
    """One sample of ``target`` (an Engine, awaited on its loop, or a URL): ``stamp`` (time,
    the client's own counters), then ``counters`` (a URL's Prometheus counters, see
    probe.prometheus_counters), the load and ``zipage_keys`` of the zipage state (absent on
    stock). A part that fails is named under ``errors`` and the others are still taken: a
    window skips the samples that lack what it needs."""
    url = isinstance(target, str)

    async def metrics():
        return probe.prometheus_counters(target, counters) if counters else {}

    async def load():
        if url:
            d = probe.loads(target)
            return dict(running_reqs=d["num_running_reqs"], waiting_reqs=d["num_waiting_reqs"],
                        used_tokens=d["num_used_tokens"], pool_tokens=d["max_total_num_tokens"])
        d = await probe.engine_load(target)
        return dict(running_reqs=d.num_running_reqs, waiting_reqs=d.num_waiting_reqs,
                    token_usage=d.token_usage, used_tokens=d.num_used_tokens)

    async def zipage():
        state = probe.zipage_state(target) if url else await probe.engine_zipage_state(target)
        return {} if state is None else {"zipage": {k: state.get(k) for k in zipage_keys}}

    s = dict(stamp)
    for part in (metrics, load, zipage):
        try:
            s.update(await part())
        except Exception as e:  # keep sampling
            s.setdefault("errors", []).append(f"{part.__name__}: {e!r}"[:200])
    return s


class Sampler(threading.Thread):
    """Samples a server every ``interval_s`` into ``samples`` (each with its ``epoch``);
    ``sample_now()`` adds one at once."""

    def __init__(self, url: str, interval_s: float, zipage_keys: Iterable[str], counters=None):
        super().__init__(daemon=True)
        self.url, self.interval_s = url, interval_s
        self.zipage_keys, self.counters = tuple(zipage_keys), counters
        self.samples: List[Dict] = []
        # not _stop: threading.Thread has a method of that name
        self._lock, self._halt = threading.Lock(), threading.Event()

    def sample_now(self) -> Dict:
        with self._lock:
            s = asyncio.run(take_sample({"epoch": round(time.time(), 3)}, self.url,
                                        self.zipage_keys, self.counters))
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


def with_times(samples: List[Dict], t0: Optional[float]) -> List[Dict]:
    """Server samples with ``t_s`` = epoch - t0 (None while t0 is unknown)."""
    return [{"t_s": None if t0 is None else round(s["epoch"] - t0, 3), **s} for s in samples]


# ----------------------------------------------------------------- windows
class Window:
    """The samples that carry ``need`` with lo_s - slack <= t_s <= hi_s + slack; false when
    fewer than two."""

    def __init__(self, samples: List[Dict], lo_s: float, hi_s: float = math.inf,
                 slack: float = 1e-6, need: str = "t_s"):
        self.inside = [s for s in samples if s.get("t_s") is not None and need in s
                       and lo_s - slack <= s["t_s"] <= hi_s + slack]
        if self:
            self.a, self.b = self.inside[0], self.inside[-1]
            self.span = self.b["t_s"] - self.a["t_s"]

    def __bool__(self) -> bool:
        return len(self.inside) >= 2

    def delta(self, key: str):
        return self.b[key] - self.a[key]

    def rate(self, key: str, per_s: float = 1.0) -> float:
        return per_s * self.delta(key) / self.span

    def values(self, key: str) -> List:
        return [s[key] for s in self.inside if s.get(key) is not None]

    def mean(self, key: str, nd: int) -> Optional[float]:
        xs = self.values(key)
        return rnd(sum(xs) / len(xs), nd) if xs else None

    def zipage(self) -> Optional[Dict]:
        """The zipage counters over the window (None unless both ends have them)."""
        za, zb = self.a.get("zipage"), self.b.get("zipage")
        if not (za and zb):
            return None

        def d(key):
            return (zb.get(key) or 0) - (za.get(key) or 0)

        compressed = [s["zipage"].get("running_compressed_requests") or 0
                      for s in self.inside if s.get("zipage")]
        ms = self.span * 1e3
        return dict(compactions=d("compactions"), compactions_per_s=rnd(d("compactions") / self.span),
                    pressure_compactions=d("pressure_compactions"),
                    squeezed_compactions=d("squeezed_compactions"),
                    # compactions without their query window (the most recent tokens kept)
                    windowless_compactions=d("windowless_compactions"),
                    loop_guard_triggers=d("loop_guard_triggers"),
                    compaction_ms=rnd(d("compaction_ms"), 1),
                    compaction_gpu_ms=rnd(d("compaction_gpu_ms"), 1),
                    compaction_share=rnd(d("compaction_gpu_ms") / ms, 4),
                    compaction_launch_share=rnd(d("compaction_ms") / ms, 4),
                    tokens_evicted=d("tokens_evicted"),
                    mean_compressed_running_reqs=rnd(sum(compressed) / len(compressed), 1)
                    if compressed else None,
                    # the share of the window's decoded tokens that came from compressed KV
                    compressed_token_share=rnd(d("compressed_decode_tokens") / d("decode_tokens"), 4)
                    if d("decode_tokens") else None)


def first_wave_window(samples: List[Dict], lo_s: float) -> Dict:
    """bench_throughput.py's window: from the first sample at/after lo_s to the last one,
    which its driver takes at the end time (or once every request finished), just before
    aborting. Output tokens are the client's (``output_tokens``)."""
    w = Window(samples, lo_s)
    if not w:
        return {"window_error": f"fewer than 2 samples after {lo_s} s"}
    out = dict(window_start_s=w.a["t_s"], window_end_s=w.b["t_s"], window_s=round(w.span, 3),
               window_output_tokens=w.delta("output_tokens"),
               output_tok_s=rnd(w.rate("output_tokens"), 1),
               mean_running_reqs=w.mean("running_reqs", 1),
               peak_running_reqs=max(w.values("running_reqs"), default=None),
               min_running_reqs=min(w.values("running_reqs"), default=None),
               mean_token_usage=w.mean("token_usage", 4),
               peak_token_usage=max(w.values("token_usage"), default=None),
               window_retractions=w.delta("retractions"))
    if out["mean_running_reqs"]:
        out["ms_per_token_per_running_req"] = rnd(1e3 * out["mean_running_reqs"] / out["output_tok_s"]
                                                  if out["output_tok_s"] else None)
    z = w.zipage()
    if z:
        out.update(window_compactions=z["compactions"], compactions_per_s=z["compactions_per_s"],
                   window_compaction_ms=z["compaction_ms"],
                   window_compaction_gpu_ms=z["compaction_gpu_ms"],
                   compaction_share=z["compaction_share"],
                   compaction_launch_share=z["compaction_launch_share"],
                   window_tokens_evicted=z["tokens_evicted"],
                   mean_compressed_running_reqs=z["mean_compressed_running_reqs"],
                   compressed_token_share=z["compressed_token_share"])
    return out


def steady_window(samples: List[Dict], lo_s: float, hi_s: float) -> Dict:
    """steady_state.py's window: between the first and the last sample with server counters
    (``decode_tokens``) and lo_s <= t_s <= hi_s (0.5 s of slack)."""
    w = Window(samples, lo_s, hi_s, slack=0.5, need="decode_tokens")
    if not w:
        return {"error": f"fewer than 2 samples in [{lo_s}, {hi_s}] s"}
    pool = [s["used_tokens"] / s["pool_tokens"] for s in w.inside if s.get("pool_tokens")]
    out = dict(start_s=w.a["t_s"], end_s=w.b["t_s"], span_s=round(w.span, 3), samples=len(w.inside),
               output_tokens=w.delta("decode_tokens"),
               output_tok_s=rnd(w.rate("decode_tokens"), 1),
               prefill_tok_s=rnd(w.rate("prefill_tokens"), 1),
               mean_running_reqs=w.mean("running_reqs", 1),
               min_running_reqs=min(w.values("running_reqs"), default=None),
               max_running_reqs=max(w.values("running_reqs"), default=None),
               mean_waiting_reqs=w.mean("waiting_reqs", 1),
               mean_pool_use=rnd(sum(pool) / len(pool), 4) if pool else None,
               retractions=w.delta("retractions"),
               retractions_per_min=rnd(w.rate("retractions", 60)),
               retracted_output_tokens=w.delta("retracted_output_tokens"),
               finished=w.delta("finished_requests"),
               finished_per_min=rnd(w.rate("finished_requests", 60)))
    accept = [a for a in w.values("spec_accept_length") if a]
    if accept:  # speculative decoding: SGLang's accept length, logged every few decode steps
        out["spec_accept_length"] = rnd(sum(accept) / len(accept), 3)
    if out["output_tok_s"] and out["mean_running_reqs"]:
        out["server_tpot_ms"] = rnd(1e3 * out["mean_running_reqs"] / out["output_tok_s"])
    z = w.zipage()
    if z:
        out["zipage"] = {k: z[k] for k in STEADY_ZIPAGE_KEYS}
        out["compaction_share"] = z["compaction_share"]
    return out


# A PD decode server's failed requests, as Sampler counters (probe.prometheus_counters)
PD_FAILURE_COUNTERS = {
    "pd_bootstrap_failed": ("sglang:num_bootstrap_failed_reqs_total", {}),  # the handshake
    "pd_transfer_failed": ("sglang:num_transfer_failed_reqs_total", {}),  # the KV transfer
}
PD_FAILURE_KEYS = tuple(PD_FAILURE_COUNTERS)


def pd_failures(samples: List[Dict], hi_s: float) -> Optional[float]:
    """The requests a PD decode server failed (handshake or KV transfer: SGLang's
    num_bootstrap_failed_reqs and num_transfer_failed_reqs counters, PD_FAILURE_KEYS) from the
    load's start (the last sample before t_s = 0) to ``hi_s``, before the aborts that end a
    run; None without those counters."""
    have = [s for s in samples if s.get("t_s") is not None
            and all(k in s for k in PD_FAILURE_KEYS)]
    before = [s for s in have if s["t_s"] <= 0] or have[:1]
    upto = [s for s in have if s["t_s"] <= hi_s + 0.5]
    if not (before and upto):
        return None
    return sum(upto[-1][k] - before[-1][k] for k in PD_FAILURE_KEYS)


# ---------------------------------------------------------------- progress
def progress_line(tag: str, prev: Optional[Dict], s: Dict, of: Optional[int] = None) -> str:
    """``[tag] t= tokens= tok/s= running= waiting= usage= retractions= finished=``, the zipage
    compactions and any sampling errors; tok/s since ``prev``. Tokens are the client's
    (``output_tokens``) or else the server's decode counter; usage is SGLang's token usage
    or else KV slots used / pool; ``of``: the requests of the load."""
    key = "output_tokens" if "output_tokens" in s else "decode_tokens"
    t = s["t_s"] if s.get("t_s") is not None else s.get("epoch", 0.0)
    rate = 0.0
    if prev is not None and prev.get(key) is not None and s.get(key) is not None:
        t_prev = prev["t_s"] if prev.get("t_s") is not None else prev.get("epoch", 0.0)
        if t > t_prev:
            rate = (s[key] - prev[key]) / (t - t_prev)
    usage = s.get("token_usage")
    if "token_usage" not in s and s.get("pool_tokens"):
        usage = rnd(s["used_tokens"] / s["pool_tokens"], 3)
    finished = s.get("finished", s.get("finished_requests"))
    z = s.get("zipage") or {}
    return (f"[{tag}] t={t:6.1f}s tokens={s.get(key)} tok/s={rate:8.1f} "
            f"running={s.get('running_reqs')} waiting={s.get('waiting_reqs')} usage={usage} "
            f"retractions={s.get('retractions')} finished={finished}"
            + (f"/{of}" if of is not None else "")
            + (f" compactions={z.get('compactions')} comp_gpu_ms={z.get('compaction_gpu_ms') or 0:.0f}"
               if z else "")
            + (f" errors={s['errors']}" if s.get("errors") else ""))
