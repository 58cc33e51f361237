"""Per-request zipage options, in ``sampling_params`` or OpenAI ``extra_body``:

  zipage_kv_budget      0 turns compression off for the request; a budget replaces
                        --zipage-kv-budget for it
  zipage_min_kv_budget  the floor it may be squeezed to under pressure (elastic mode),
                        replacing --zipage-min-kv-budget for it; at most its budget
  zipage_think_end      the text (or token ids) closing its thinking segment: the tokens from
                        it on are never evicted; "" (or []) turns that off for the request
  zipage_answer_budget  once its answer starts, its thinking segment is compacted once more,
                        down to this many tokens; 0: not
The server's --zipage-think-end (or its --reasoning-parser's marker) applies to requests that
give none. SGLang's SamplingParams is a msgspec struct that travels to the scheduler as
msgpack, so the values ride in its ``custom_params`` dict (JSON-safe by contract), think-end
as token ids. Validation runs in the frontend: a bad value is a ValueError there, which
SGLang answers with HTTP 400.
"""

from __future__ import annotations

from typing import Callable, List, Optional

from sglang_zipage.config import ZipageConfig

FIELD = "zipage_kv_budget"
THINK_END = "zipage_think_end"
ANSWER_BUDGET = "zipage_answer_budget"
MIN_BUDGET = "zipage_min_kv_budget"
FIELDS = (FIELD, THINK_END, ANSWER_BUDGET, MIN_BUDGET)


def validate(value, config: ZipageConfig, page_size: int, field: str = FIELD) -> int:
    """A request's budget (or answer budget), or ValueError (HTTP 400) by the server
    budget's own rule."""
    problem = config.budget_problem(value, page_size, off_allowed=True)
    if problem:
        what = "no compression for this request" if field == FIELD else "none"
        raise ValueError(f"{field} must be 0 ({what}) or a budget of this server (page size "
                         f"{page_size}): {problem}")
    return value


def validate_min(value, budget: Optional[int], config: ZipageConfig, page_size: int) -> int:
    """A request's floor, or ValueError (HTTP 400): a legal budget, at most its budget."""
    problem = config.budget_problem(value, page_size)
    if not problem:
        problem = config.min_problem(value, config.kv_budget if budget is None else budget)
    if problem:
        raise ValueError(f"{MIN_BUDGET} must be a budget of this server (page size "
                         f"{page_size}) no larger than the request's: {problem}")
    return value


def think_end_ids(value, tokenize: Optional[Callable[[str], List[int]]]) -> List[int]:
    """The think-end marker as token ids: a text (tokenized without special additions), a
    list of token ids, or "" / [] for none."""
    if isinstance(value, str):
        if not value:
            return []
        if tokenize is None:
            raise ValueError(f"{THINK_END} as text needs the server's tokenizer (it was started "
                             f"with --skip-tokenizer-init): give token ids")
        return list(tokenize(value))
    if isinstance(value, list) and all(isinstance(t, int) and not isinstance(t, bool) and t >= 0
                                       for t in value):
        return value
    raise ValueError(f"{THINK_END} must be a text or a list of token ids; got {value!r}")


def move_to_custom_params(sampling_params: dict, config: ZipageConfig, page_size: int,
                          tokenize: Optional[Callable[[str], List[int]]] = None,
                          default_think_end: Optional[List[int]] = None) -> dict:
    """Return sampling params with the zipage options validated and moved to custom_params;
    the server's think-end marker goes with every request that names none."""
    options = {}
    if sampling_params and any(f in sampling_params for f in FIELDS):
        sampling_params = dict(sampling_params)
        if FIELD in sampling_params:
            options[FIELD] = validate(sampling_params.pop(FIELD), config, page_size)
        if MIN_BUDGET in sampling_params:
            options[MIN_BUDGET] = validate_min(sampling_params.pop(MIN_BUDGET),
                                               options.get(FIELD) or None, config, page_size)
        if ANSWER_BUDGET in sampling_params:
            options[ANSWER_BUDGET] = validate(sampling_params.pop(ANSWER_BUDGET), config,
                                              page_size, ANSWER_BUDGET)
        if THINK_END in sampling_params:
            options[THINK_END] = think_end_ids(sampling_params.pop(THINK_END), tokenize)
    if THINK_END not in options and default_think_end:
        options[THINK_END] = list(default_think_end)
    if not options:
        return sampling_params
    params = dict(sampling_params or {})
    params["custom_params"] = {**(params.get("custom_params") or {}), **options}
    return params


def _custom(req) -> dict:
    return getattr(req.sampling_params, "custom_params", None) or {}


def of(req) -> Optional[int]:
    """The request's own budget (scheduler side), or None for the server default."""
    return _custom(req).get(FIELD)


def min_of(req) -> Optional[int]:
    """The request's own floor (zipage_min_kv_budget), or None for the server's."""
    return _custom(req).get(MIN_BUDGET)


def think_end_of(req) -> Optional[List[int]]:
    """The request's think-end marker ids, or None (no thinking segment to protect)."""
    return _custom(req).get(THINK_END) or None


def answer_budget_of(req, server: int) -> int:
    """The request's answer budget (0: none), else the server's."""
    own = _custom(req).get(ANSWER_BUDGET)
    return server if own is None else own
