"""Per-request zipage_kv_budget: validation (HTTP 400 text) and transport in custom_params."""

import pytest

from sglang_zipage.config import ZipageConfig
from sglang_zipage.request_options import move_to_custom_params

CFG = ZipageConfig(kv_budget=64, buffer=16, window=16)


def test_value_moves_into_custom_params_next_to_existing_ones():
    params = {"max_new_tokens": 8, "zipage_kv_budget": 32, "custom_params": {"a": 1}}
    out = move_to_custom_params(params, CFG, page_size=16)
    assert out == {"max_new_tokens": 8, "custom_params": {"a": 1, "zipage_kv_budget": 32}}
    assert "zipage_kv_budget" in params  # the caller's dict is left alone
    assert move_to_custom_params({"max_new_tokens": 8}, CFG, 1) == {"max_new_tokens": 8}
    assert move_to_custom_params({"zipage_kv_budget": 0}, CFG, 16)["custom_params"] == {"zipage_kv_budget": 0}


@pytest.mark.parametrize("value", [-1, 8, "64", 1.5, True, 40])
def test_invalid_values_name_the_field(value):
    with pytest.raises(ValueError, match="zipage_kv_budget"):
        move_to_custom_params({"zipage_kv_budget": value}, CFG, page_size=16)


def test_think_end_goes_as_token_ids_and_the_server_marker_fills_in():
    tok = lambda text: [ord(c) for c in text]  # noqa: E731
    out = move_to_custom_params({"zipage_think_end": "</t>", "zipage_answer_budget": 32}, CFG,
                                16, tok, default_think_end=[7])
    assert out["custom_params"] == {"zipage_think_end": [60, 47, 116, 62], "zipage_answer_budget": 32}
    assert move_to_custom_params({}, CFG, 1, tok, [7])["custom_params"] == {"zipage_think_end": [7]}
    off = move_to_custom_params({"zipage_think_end": ""}, CFG, 1, tok, [7])
    assert off["custom_params"] == {"zipage_think_end": []}  # the request opts out
    ids = move_to_custom_params({"zipage_think_end": [5, 6]}, CFG, 1, None, None)
    assert ids["custom_params"] == {"zipage_think_end": [5, 6]}


@pytest.mark.parametrize("field, value", [("zipage_think_end", "</think>"),  # no tokenizer
                                          ("zipage_think_end", [1, -2]),
                                          ("zipage_answer_budget", 8),
                                          ("zipage_answer_budget", 40)])
def test_invalid_reasoning_options_name_the_field(field, value):
    with pytest.raises(ValueError, match=field):
        move_to_custom_params({field: value}, CFG, page_size=16)
