"""Per-request KV budget: ``zipage_kv_budget`` in ``sampling_params`` or OpenAI ``extra_body``.

0 turns compression off for that request; a positive value replaces --zipage-kv-budget for
it. SGLang's SamplingParams is a msgspec struct that travels to the scheduler as msgpack,
so the value rides in its ``custom_params`` dict (JSON-safe by contract). Validation runs
in the frontend: a bad value is a ValueError there, which SGLang answers with HTTP 400.
"""

from __future__ import annotations

from typing import Optional

from sglang_zipage.config import ZipageConfig

FIELD = "zipage_kv_budget"


def validate(value, config: ZipageConfig, page_size: int) -> int:
    """The request's budget, or ValueError (HTTP 400) by the server budget's own rule."""
    problem = config.budget_problem(value, page_size, off_allowed=True)
    if problem:
        raise ValueError(f"{FIELD} must be 0 (no compression for this request) or a budget "
                         f"of this server (page size {page_size}): {problem}")
    return value


def move_to_custom_params(sampling_params: dict, config: ZipageConfig, page_size: int) -> dict:
    """Return sampling params with ``zipage_kv_budget`` validated and moved to custom_params."""
    if not sampling_params or FIELD not in sampling_params:
        return sampling_params
    params = dict(sampling_params)
    value = validate(params.pop(FIELD), config, page_size)
    params["custom_params"] = {**(params.get("custom_params") or {}), FIELD: value}
    return params


def of(req) -> Optional[int]:
    """The request's own budget (scheduler side), or None for the server default."""
    custom = getattr(req.sampling_params, "custom_params", None)
    return custom.get(FIELD) if custom else None
