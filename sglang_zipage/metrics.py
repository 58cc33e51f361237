"""Prometheus metrics of the scheduler process (with SGLang's ``--enable-metrics``).

SGLang runs prometheus_client in multiprocess mode (PROMETHEUS_MULTIPROC_DIR is set before
the scheduler starts), so metrics created here are served by the HTTP server's /metrics
next to SGLang's own ``sglang:*`` series.
"""

from __future__ import annotations


class ZipageMetrics:
    def __init__(self):
        from prometheus_client import Counter, Gauge  # after SGLang set the multiproc dir

        self.compactions = Counter("zipage:compactions", "Compactions (one per request compressed).")
        self.pressure_compactions = Counter(
            "zipage:pressure_compactions",
            "Elastic mode: compactions made because the pool needed the room.")
        self.tokens_evicted = Counter("zipage:tokens_evicted", "KV tokens evicted by compactions.")
        self.pages_freed = Counter("zipage:pages_freed", "KV pages returned to SGLang's pool.")
        self.compaction_seconds = Counter(
            "zipage:compaction_seconds", "Host time launching scoring + compaction kernels.")
        self.decode_tokens = Counter(
            "zipage:decode_tokens", "Tokens decoded (one per running request per decode step).")
        self.compressed_decode_tokens = Counter(
            "zipage:compressed_decode_tokens",
            "Of those, tokens decoded from compressed KV (requests compacted before the step).")
        self.windowless_compactions = Counter(
            "zipage:windowless_compactions",
            "Compactions of requests that found no free query-window slot (recent tokens kept).")
        self.loop_guard_triggers = Counter(
            "zipage:loop_guard_triggers",
            "Budgets the loop guard raised (a compacted request repeating itself).")
        self.squeezed_compactions = Counter(
            "zipage:squeezed_compactions",
            "Elastic mode: running requests squeezed to their floor (--zipage-min-kv-budget) "
            "so waiting ones are admitted or a step gets its pages.")
        self.compressed_running = Gauge(
            "zipage:num_running_compressed_reqs", "Running requests that went through a compaction.",
            multiprocess_mode="mostrecent")

    def on_plan(self, compactions: int, evicted: int, pages: int) -> None:
        self.compactions.inc(compactions)
        self.tokens_evicted.inc(evicted)
        self.pages_freed.inc(pages)

    def on_step(self, decoded: int, compressed: int) -> None:
        self.decode_tokens.inc(decoded)
        self.compressed_decode_tokens.inc(compressed)
        self.compressed_running.set(compressed)
