"""ZipageConfig: every Zipage setting in one typed, validated object.

The launcher builds it from ``--zipage-*`` flags, validates it before anything
starts, and ships it to SGLang's spawned scheduler processes as JSON in the
environment variable ``SGLANG_ZIPAGE_CONFIG`` (spawn children inherit the
environment, not the parent's Python state).

Paper symbols: budget = N*b tokens kept per request after a compaction,
buffer = the working page(s) filled between compactions, W = query window.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
from dataclasses import dataclass, field
from typing import List, Optional, Sequence, Tuple

ENV_VAR = "SGLANG_ZIPAGE_CONFIG"
ASYNC_LAG_TOKENS = 8  # --zipage-async: a compaction starts this many tokens before the limit
REDUNDANCY_MODES = ("none", "full", "lightning")
SELECTION_MODES = ("score", "random", "recent")
MODES = ("fixed", "elastic")
SCORERS = ("auto", "calibrated", "window")


class ZipageConfigError(ValueError):
    """An invalid setting; the message names the flag and what to change."""


def _flag(help_: str, flag: Optional[str] = None, **kw) -> dict:
    return {"help": help_, "flag": flag, **kw}


@dataclass(frozen=True)
class ZipageConfig:
    enabled: bool = field(default=True, metadata=_flag(
        "Turn Compressed PagedAttention off: the server then behaves exactly like stock SGLang.",
        flag="--zipage-disable", invert=True, on_text="compression on"))
    kv_budget: int = field(default=2048, metadata=_flag(
        "Decode-phase KV tokens each request keeps per KV head after a compaction (paper: N*b). "
        "Must be a multiple of --page-size and at least --zipage-window + --zipage-sink."))
    min_kv_budget: int = field(default=0, metadata=_flag(
        "Elastic mode's budget range: while the pool is under pressure and requests wait (or a "
        "decode step is short of pages), the largest running requests are squeezed from "
        "--zipage-kv-budget down to this many kept tokens, so the waiting ones are admitted "
        "rather than queue; their budget returns once the pressure ends. 0: the budget itself "
        "(no squeeze). Per request: zipage_min_kv_budget."))
    buffer: int = field(default=256, metadata=_flag(
        "Decode tokens written between two compactions (paper: the working block b). "
        "In fixed mode a request's decode KV never exceeds kv_budget + buffer. Multiple of "
        "--page-size."))
    mode: str = field(default="elastic", metadata=_flag(
        "elastic (default): the budget is a floor; requests keep their full KV while the pool has room, "
        "and over-budget requests are compacted down to their budget, largest first, when a "
        "decode step or a waiting request needs the room (instead of retracting or queueing); "
        "from then on requests compress as in fixed mode until nothing waits and the free pool "
        "could hold what the running requests may still write. "
        "fixed: a request compresses whenever its decode KV reaches kv_budget + buffer, "
        "however much room the pool has.",
        choices=MODES))
    window: int = field(default=16, metadata=_flag(
        "Query window W: the last W decode queries score the cached tokens (the window "
        "scorer); the last W tokens are always kept."))
    scorer: str = field(default="auto", metadata=_flag(
        "What scores the cached tokens at a compaction: calibrated (per head, K typical "
        "queries measured once per model by python -m sglang_zipage.calibrate, rotated to the "
        "request's next position: no query memory, no windowless compaction) or window (each "
        "request's last W decode queries, kept in a query window of a few slots). auto: "
        "calibrated where the model has statistics (the bundled model ships its own), else "
        "window, said at startup.",
        choices=SCORERS))
    query_stats: str = field(default="", metadata=_flag(
        "The calibrated scorer's statistics (python -m sglang_zipage.calibrate --out FILE). "
        "Empty: the bundled model's own, or MODEL_PATH/zipage_query_stats.safetensors."))
    async_compaction: bool = field(default=False, metadata=_flag(
        "Run scoring and compaction on a side CUDA stream, overlapped with decode: a request "
        "starts compacting a few tokens before its limit into spare pages and keeps decoding "
        "meanwhile (the pool sets aside room for a few budgets for this). Needs --zipage-mode fixed.",
        flag="--zipage-async"))
    decay: float = field(default=0.8, metadata=_flag(
        "Global-score decay: score = max(current, decay * stored). 0 disables the global score."))
    redundancy: str = field(default="none", metadata=_flag(
        "Key-redundancy term (R-KV): none, full (all token pairs) or lightning (pairs within a block).",
        choices=REDUNDANCY_MODES))
    redundancy_lambda: float = field(default=0.2, metadata=_flag(
        "lambda in final = lambda * attention - (1 - lambda) * redundancy."))
    redundancy_tau: float = field(default=0.4, metadata=_flag(
        "Softmax temperature tau of the redundancy term."))
    pooling: int = field(default=5, metadata=_flag(
        "Max-pooling kernel over the sequence on a request's first compaction (odd; 1 disables)."))
    selection: str = field(default="score", metadata=_flag(
        "Which tokens a compaction keeps: score (Zipage's scoring), or the baselines random "
        "and recent (most recent tokens only), for quality comparisons.",
        choices=SELECTION_MODES))
    think_end: str = field(default="", metadata=_flag(
        "Text that closes a reasoning model's thinking segment (e.g. </think>): the tokens from "
        "it on (the answer) are never evicted; the thinking segment compresses as any output. "
        "Empty: the marker of SGLang's --reasoning-parser when one is set; 'none': off."))
    answer_budget: int = field(default=0, metadata=_flag(
        "Once a request's answer starts, compact its thinking segment once more, down to this "
        "many tokens, scored with the answer's first queries (0: keep it as it is; the thinking "
        "segment is compacted down to --zipage-kv-budget only if it grew past its limit)."))
    loop_guard: bool = field(default=True, metadata=_flag(
        "Loop guard: for a request that went through a compaction, watch its last 400 tokens "
        "every 32; when over half their 8-grams repeat, double its budget (up to 4 times), so a "
        "loop that eviction started keeps more of its own KV. Counted as zipage_loop_guard.",
        flag="--zipage-no-loop-guard", invert=True, on_text="guard on"))
    memory_fraction: float = field(default=0.03, metadata=_flag(
        "Most of the memory SGLang could give the KV pool (capped by --max-total-tokens or not) "
        "that zipage's GPU buffers (global scores and the query window) may take; an uncapped "
        "pool shrinks by what they take, a capped one keeps its tokens where the memory beside "
        "it holds them. Where it cannot hold the global scores and one query-window slot, "
        "startup is refused (exit code 1) with the share that would."))
    sink: int = field(default=0, metadata=_flag(
        "Leading tokens of the compressible suffix that are always kept (the prompt is not "
        "compressed unless --zipage-compress-prompt, so its own sink tokens are kept)."))
    compress_prompt: bool = field(default=False, metadata=_flag(
        "Compress the part of each prompt that no other running request shares together with "
        "the output: once the radix cache holds its prompt, a request copies those pages into "
        "pages of its own and releases its hold on them in the radix cache, which keeps them as "
        "evictable cache (later requests with the same prefix still hit it). Prefixes that "
        "running requests share stay shared and uncompressed.", flag="--zipage-compress-prompt"))

    # ---------------------------------------------------------------- checks
    def validate(self, page_size: Optional[int] = None) -> "ZipageConfig":
        """Raise ZipageConfigError naming the flag; returns self so calls chain."""
        def bad(name: str, msg: str) -> None:
            raise ZipageConfigError(f"{flag_name(name)}: {msg}")

        for name in ("kv_budget", "buffer"):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                bad(name, f"must be an integer >= 1, got {v!r}")
        for name, problem in scoring_problems(self):
            bad(name, problem)
        if self.answer_budget:
            problem = self.budget_problem(self.answer_budget, page_size or 1)
            if problem:
                bad("answer_budget", problem)
        if not 0.0 < self.memory_fraction <= 0.5:
            bad("memory_fraction", f"must be in (0, 0.5], got {self.memory_fraction}")
        if self.mode not in MODES:
            bad("mode", f"must be one of {', '.join(MODES)}, got {self.mode!r}")
        if self.scorer not in SCORERS:
            bad("scorer", f"must be one of {', '.join(SCORERS)}, got {self.scorer!r}")
        if self.mode == "elastic" and self.async_compaction:
            bad("mode", "elastic (the default) compacts on demand, synchronously: add "
                "--zipage-mode fixed to overlap compactions with decode (--zipage-async)")
        problem = self.budget_problem(self.kv_budget, page_size or 1)
        if problem:
            bad("kv_budget", problem)
        if self.min_kv_budget:
            problem = (self.budget_problem(self.min_kv_budget, page_size or 1)
                       or self.min_problem(self.min_kv_budget, self.kv_budget))
            if problem:
                bad("min_kv_budget", problem)
        if self.buffer < self.window:
            bad("buffer", f"must be >= --zipage-window ({self.window}) so the query window "
                f"is filled between compactions, got {self.buffer}")
        if self.async_compaction and page_size is not None:
            lag = async_lag(page_size)
            if self.buffer <= lag:
                bad("buffer", f"must be > {lag} with --zipage-async and --page-size {page_size} "
                    f"(a compaction starts {lag} tokens before the limit), got {self.buffer}")
        if page_size is not None and self.buffer % page_size:
            bad("buffer", _not_page_aligned(self.buffer, page_size))
        return self

    def budget_problem(self, kv_budget, page_size: int = 1, off_allowed: bool = False):
        """Why ``kv_budget`` cannot be a budget of this server on this page size, or None.
        The one rule for --zipage-kv-budget and a request's zipage_kv_budget (0 turns
        compression off for a request: ``off_allowed``)."""
        if not isinstance(kv_budget, int) or isinstance(kv_budget, bool) or kv_budget < 0:
            return f"must be an integer >= 1, got {kv_budget!r}"
        if kv_budget == 0 and off_allowed:
            return None
        least = self.window + self.sink
        if kv_budget < least:
            return (f"must be >= --zipage-window + --zipage-sink ({self.window} + {self.sink}), "
                    f"got {kv_budget}")
        if kv_budget % page_size:
            return _not_page_aligned(kv_budget, page_size)
        return None

    def min_problem(self, min_kv_budget: int, kv_budget: int):
        """Why a floor cannot go with this budget (A3), or None."""
        if min_kv_budget > kv_budget:
            return f"must be at most the budget ({kv_budget}), got {min_kv_budget}"
        if min_kv_budget < kv_budget and self.mode != "elastic":
            return "a budget range squeezes under pressure: it needs --zipage-mode elastic"
        return None

    # ---------------------------------------------------------- transport
    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> "ZipageConfig":
        data = json.loads(text)
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ZipageConfigError(f"unknown zipage setting(s) {unknown}; known: {sorted(known)}")
        return cls(**data)

    def to_env(self, env=None) -> None:
        (os.environ if env is None else env)[ENV_VAR] = self.to_json()

    @classmethod
    def from_env(cls) -> Optional["ZipageConfig"]:
        """The config exported by the launcher, or None when this process runs stock SGLang."""
        text = os.environ.get(ENV_VAR)
        return cls.from_json(text) if text else None

    # ------------------------------------------------------------- argparse
    @classmethod
    def add_cli_args(cls, parser: argparse.ArgumentParser) -> None:
        group = parser.add_argument_group("Zipage (Compressed PagedAttention)")
        for f in dataclasses.fields(cls):
            meta = f.metadata
            flag = flag_name(f.name)
            if f.type in ("bool", bool):
                help_ = meta["help"] + (f" (default: {meta.get('on_text', 'on')})"
                                        if meta.get("invert") else " (default: off)")
                group.add_argument(flag, dest=f"zipage_{f.name}", action="store_true", help=help_)
                continue
            typ = {"int": int, "float": float, "str": str}[f.type if isinstance(f.type, str)
                                                          else f.type.__name__]
            group.add_argument(flag, dest=f"zipage_{f.name}", type=typ, default=f.default,
                               choices=meta.get("choices"),
                               help=f"{meta['help']} (default: {f.default})")

    @classmethod
    def from_cli_args(cls, ns: argparse.Namespace) -> "ZipageConfig":
        kw = {}
        for f in dataclasses.fields(cls):
            v = getattr(ns, f"zipage_{f.name}")
            kw[f.name] = (not v) if f.metadata.get("invert") else v
        return cls(**kw)

    @classmethod
    def parse_known(cls, argv: Sequence[str]):
        """Split argv into (ZipageConfig, the remaining SGLang arguments)."""
        parser = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
        cls.add_cli_args(parser)
        ns, rest = parser.parse_known_args(list(argv))
        return cls.from_cli_args(ns), rest


def scoring_problems(s, least_window: int = 1) -> List[Tuple[str, str]]:
    """(field, what is wrong) for the selection settings of ``s`` (a ZipageConfig or a
    scoring.ScoringParams): the one place their rules live. A server's window holds queries
    (W >= 1); selection on its own may protect none (least_window 0)."""
    out = []
    for name, least in (("window", least_window), ("pooling", 1), ("sink", 0)):
        v = getattr(s, name)
        if not isinstance(v, int) or isinstance(v, bool) or v < least:
            out.append((name, f"must be an integer >= {least}, got {v!r}"))
    if isinstance(s.pooling, int) and s.pooling % 2 == 0:
        out.append(("pooling", f"must be odd (1 disables pooling), got {s.pooling}"))
    if not 0.0 <= s.decay < 1.0:
        out.append(("decay", f"must be in [0, 1), got {s.decay}"))
    for name, modes in (("selection", SELECTION_MODES), ("redundancy", REDUNDANCY_MODES)):
        if getattr(s, name) not in modes:
            out.append((name, f"must be one of {', '.join(modes)}, got {getattr(s, name)!r}"))
    if not 0.0 <= s.redundancy_lambda <= 1.0:
        out.append(("redundancy_lambda", f"must be in [0, 1], got {s.redundancy_lambda}"))
    if not s.redundancy_tau > 0.0:
        out.append(("redundancy_tau", f"must be > 0, got {s.redundancy_tau}"))
    return out


def _not_page_aligned(v: int, page_size: int) -> str:
    return (f"must be a multiple of --page-size {page_size}, got {v} "
            f"(try {max(page_size, v // page_size * page_size)})")


def async_lag(page_size: int) -> int:
    """Tokens before its limit that an asynchronous compaction starts (page aligned): the
    decode steps it may take before the request reaches its limit and waits for it."""
    return -(-ASYNC_LAG_TOKENS // page_size) * page_size


def flag_name(field_name: str) -> str:
    for f in dataclasses.fields(ZipageConfig):
        if f.name == field_name and f.metadata.get("flag"):
            return f.metadata["flag"]
    return "--zipage-" + field_name.replace("_", "-")
