"""Per-response compression facts in ``meta_info``: ``zipage_compactions``, ``zipage_kv_len``,
in elastic mode ``zipage_pressure_compactions`` (those the pool's pressure caused), and
``zipage_loop_guard`` (times the loop guard raised the request's budget).

SGLang 0.5.17 carries per-request extras from the scheduler to the HTTP layer only as
``Req.customized_info``: per-output-token lists that the output streamer slices and the
tokenizer manager accumulates into ``meta_info``. We give it ``LiveValue`` objects whose
slices repeat the request's current value, and fold the accumulated list back to its last
(final) value in the frontend process, so clients see one integer per key.
"""

from __future__ import annotations

KEYS = ("zipage_compactions", "zipage_kv_len", "zipage_pressure_compactions", "zipage_loop_guard")


class LiveValue:
    """Sliced like a per-token list; every element is ``read(req)`` at slicing time."""

    def __init__(self, req, read):
        self._req, self._read = req, read

    def __getitem__(self, s: slice):
        n = max(0, (s.stop or 0) - (s.start or 0))
        return [self._read(self._req)] * n


def _compactions(req) -> int:
    st = getattr(req, "zipage", None)
    return st.compactions if st is not None else 0


def _pressure_compactions(req) -> int:
    st = getattr(req, "zipage", None)
    return st.pressure_compactions if st is not None else 0


def _loop_guard(req) -> int:
    st = getattr(req, "zipage", None)
    return st.loop_guard if st is not None else 0


def _kv_len(req) -> int:
    return int(req.kv_committed_len)  # physical KV tokens held, prompt included


def attach(req) -> None:
    info = req.customized_info if req.customized_info is not None else {}
    info["zipage_compactions"] = LiveValue(req, _compactions)
    info["zipage_kv_len"] = LiveValue(req, _kv_len)
    info["zipage_pressure_compactions"] = LiveValue(req, _pressure_compactions)
    info["zipage_loop_guard"] = LiveValue(req, _loop_guard)
    req.customized_info = info


def fold(out) -> None:
    """Replace the accumulated per-token lists by their last value, in place."""
    for item in out if isinstance(out, list) else [out]:
        meta = item.get("meta_info") if isinstance(item, dict) else None
        if not meta:
            continue
        for key in KEYS:
            values = meta.get(key)
            if isinstance(values, list):
                values = [v for v in values if v is not None]
                meta[key] = values[-1] if values else None
