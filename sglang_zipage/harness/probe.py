"""One probe of a running SGLang: an in-process ``Engine`` or a server's URL.

``/server_info`` (an Engine's ``get_server_info()`` is the same dict) lists one
``internal_states`` entry per data-parallel replica; a zipage scheduler puts its
configuration and counters under ``"zipage"`` there (absent on stock SGLang).
``/v1/loads`` gives running and waiting requests and KV slots in use per scheduler,
``/metrics`` the Prometheus counters. An Engine's own reads are coroutines of its tokenizer
manager, awaited on the engine's loop (``engine_*`` below).
"""

from __future__ import annotations

import asyncio
import time
from typing import Dict, List, Optional, Tuple

import requests

# the settings a result file keeps from /server_info
SERVER_INFO_KEYS = ("max_total_num_tokens", "max_running_requests", "max_prefill_tokens",
                    "chunked_prefill_size", "cuda_graph_config", "context_len", "page_size",
                    "kv_cache_dtype", "dtype", "device", "attention_backend",
                    "decode_attention_backend", "prefill_attention_backend",
                    "sampling_backend", "mem_fraction_static", "disable_cuda_graph",
                    "disable_radix_cache", "schedule_policy", "stream_interval", "version",
                    "tp_size", "dp_size")
ZIPAGE_INFO_KEYS = ("config", "active", "budget_limit_tokens", "memory_bytes", "free_window_slots")
LOAD_KEYS = ("num_running_reqs", "num_waiting_reqs", "num_used_tokens", "max_total_num_tokens")


def get_json(url: str, path: str, timeout: float = 60):
    r = requests.get(url + path, timeout=timeout)
    r.raise_for_status()
    return r.json()


def server_info(target) -> Dict:
    """``target``: a URL (GET /server_info) or an Engine (``get_server_info()``, called
    outside the engine's running loop)."""
    return get_json(target, "/server_info") if isinstance(target, str) else target.get_server_info()


def internal_states(target) -> List[Dict]:
    """``internal_states`` of a URL, an Engine or a /server_info dict: one dict per replica
    (``memory_usage``, ``startup_time``, ``zipage``, ...)."""
    info = target if isinstance(target, dict) else server_info(target)
    return info.get("internal_states") or [{}]


def zipage_states(target) -> List[Optional[Dict]]:
    """Every replica's zipage state (None where the scheduler has none: stock SGLang)."""
    return [s.get("zipage") for s in internal_states(target)]


def zipage_state(target, replica: int = 0) -> Optional[Dict]:
    """``internal_states[replica]["zipage"]`` of a URL, an Engine or a /server_info dict."""
    return zipage_states(target)[replica]


def info_summary(info: Dict) -> Dict:
    """What a result file keeps of /server_info: SERVER_INFO_KEYS, the zipage configuration,
    the effective running-request limit and the memory use of the first replica."""
    out = {k: info.get(k) for k in SERVER_INFO_KEYS if k in info}
    states = internal_states(info)
    if "zipage" in states[0]:
        z = states[0]["zipage"]
        out["zipage"] = {k: z.get(k) for k in ZIPAGE_INFO_KEYS}
    out["effective_max_running_requests"] = states[0].get("effective_max_running_requests_per_dp")
    mem = states[0].get("memory_usage")
    if mem is not None:
        out["memory_usage"] = mem
    return out


def loads(url: str) -> Dict[str, int]:
    """``/v1/loads?include=core`` summed over schedulers: LOAD_KEYS."""
    per = get_json(url, "/v1/loads?include=core")["loads"]
    return {k: sum(s.get(k) or 0 for s in per) for k in LOAD_KEYS}


def prometheus_counters(url: str, counters: Dict[str, Tuple[str, Dict[str, str]]]) -> Dict[str, float]:
    """``counters``: key -> (Prometheus sample name, labels it must carry); each key's value
    is the sum over the matching samples of ``/metrics`` (0 before a labelled counter's
    first use, when it does not appear yet)."""
    from prometheus_client.parser import text_string_to_metric_families

    text = requests.get(url + "/metrics", timeout=30).text
    out = {key: 0.0 for key in counters}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            for key, (name, labels) in counters.items():
                if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()):
                    out[key] += s.value
    return out


def healthy(url: str) -> bool:
    try:
        return requests.get(url + "/health", timeout=60).status_code == 200
    except requests.RequestException:
        return False


def wait_idle(url: str, timeout: float, zipage: bool = True) -> Dict:
    """Poll until nothing runs or waits (and, with ``zipage``, no compressed request or
    shadow slot of an asynchronous compaction is held) or ``timeout`` s pass:
    {"idle", "load" (``loads``), "zipage" (the state, None without ``zipage``)}."""
    deadline = time.monotonic() + timeout
    while True:
        load = loads(url)
        z = zipage_state(url) if zipage else None
        busy = load["num_running_reqs"] or load["num_waiting_reqs"] or (
            z is not None and (z["running_compressed_requests"] or z["shadow_tokens_held"]))
        if not busy or time.monotonic() > deadline:
            return {"idle": not busy, "load": load, "zipage": z}
        time.sleep(0.5)


# ----------------------------------------------------- an Engine, on its loop
async def engine_load(engine):
    """The first scheduler's load snapshot (``num_running_reqs``, ``num_waiting_reqs``,
    ``num_used_tokens``, ``token_usage``, ...)."""
    return (await engine.tokenizer_manager.get_loads())[0]


async def engine_zipage_state(engine) -> Optional[Dict]:
    return (await engine.tokenizer_manager.get_internal_state())[0].get("zipage")


async def engine_idle(engine, timeout_s: float = 60.0) -> bool:
    """Wait until nothing runs or waits; False after ``timeout_s``."""
    t_end = time.perf_counter() + timeout_s
    while time.perf_counter() < t_end:
        load = await engine_load(engine)
        if load.num_running_reqs == 0 and load.num_waiting_reqs == 0:
            return True
        await asyncio.sleep(0.5)
    return False


async def wait_until(cond, timeout_s: float, what: str) -> None:
    """Await until ``cond()`` holds; TimeoutError naming ``what`` after ``timeout_s``."""
    t_end = time.perf_counter() + timeout_s
    while not cond():
        if time.perf_counter() > t_end:
            raise TimeoutError(f"timed out after {timeout_s:.0f} s waiting for {what}")
        await asyncio.sleep(0.2)
