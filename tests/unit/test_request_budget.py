"""Per-request zipage_kv_budget: validation (HTTP 400 text) and transport in custom_params."""

import pytest

from sglang_zipage.config import ZipageConfig
from sglang_zipage.request_budget import move_to_custom_params

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
