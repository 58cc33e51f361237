"""Which queries score a compaction: each request's stored window, or the calibrated ones.

--zipage-scorer window (query_window.py): the last W decode queries of the requests near a
compaction, in a ring of a few slots that the decode forward writes. --zipage-scorer
calibrated (query_stats.py): K typical queries per head from the model's statistics file
(calibrate.py), rotated to each request's next position when a plan runs; the ring then has
no layer and no slot, and the forward writes nothing. Either way the window-attention kernel
scores them. ``build`` gives the runtime the pair (window, calibrated queries or None).
"""

from __future__ import annotations

from typing import Optional

from sglang_zipage import kv_layout
from sglang_zipage.query_stats import DeviceQueries, QueryStats
from sglang_zipage.query_window import QueryWindow


def load_stats(config, model_path: str) -> Optional[QueryStats]:
    """The calibrated scorer's statistics (calibrate.stats_file), or None (window scorer)."""
    if config.scorer != "calibrated":
        return None
    from sglang_zipage.calibrate import stats_file

    return QueryStats.load(str(stats_file(config.query_stats, model_path)))


def build(config, model_runner, layout, stats: Optional[QueryStats], slots: int):
    """(QueryWindow, DeviceQueries or None) of this scheduler: a window of ``slots`` slots
    for the window scorer; for the calibrated one an empty ring and this rank's queries."""
    query, dtype = layout.query, model_runner.dtype
    device = layout.kv.keys[0].device
    if stats is None:
        rows = model_runner.req_to_token_pool.req_to_token.shape[0]
        return QueryWindow(len(layout.kv.keys), slots, rows, config.window, query.heads,
                           query.width, dtype, device), None
    if layout.rope_start is None or stats.mean.shape[-1] != query.width:
        raise kv_layout.ZipageUnsupported(
            f"the calibrated scorer scores pre-absorption queries of width "
            f"{stats.mean.shape[-1]}; this {layout.name} layout stores queries of width "
            f"{query.width}{' absorbed' if layout.rope_start is None else ''}; use "
            f"--zipage-scorer window")
    heads = query.heads  # this rank's: a tensor-parallel rank holds a slice of the heads
    rank = model_runner.ps.attn_tp_rank if stats.mean.shape[1] > heads else 0
    cos_sin, neox = kv_layout.rope_of(model_runner.model, layout.scored_layers)
    calibrated = DeviceQueries(stats, layout.scored_layers, slice(rank * heads, (rank + 1) * heads),
                               cos_sin, neox, dtype, layout.rope_start)
    return QueryWindow(0, 0, 0, config.window, query.heads, query.width, dtype, device), calibrated
