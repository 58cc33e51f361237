"""ZipageConfig: defaults, validation messages, CLI and environment transport."""

import pytest

from sglang_zipage.config import ENV_VAR, ZipageConfig, ZipageConfigError


def test_defaults_match_the_zipage_reference():
    c = ZipageConfig()
    assert (c.kv_budget, c.buffer, c.window) == (2048, 256, 16)
    assert (c.decay, c.redundancy_lambda, c.redundancy_tau, c.pooling) == (0.8, 0.2, 0.4, 5)
    assert c.enabled and not c.async_compaction
    assert c.mode == "elastic"  # issue 17: within 3% of fixed mode on the H200 loads
    c.validate(page_size=16)


def test_cli_round_trip_and_unknown_args_pass_through():
    c, rest = ZipageConfig.parse_known(["--zipage-kv-budget", "512", "--zipage-disable",
                                        "--port", "1", "--zipage-redundancy", "lightning"])
    assert (c.kv_budget, c.enabled, c.redundancy) == (512, False, "lightning")
    assert rest == ["--port", "1"]


def test_env_round_trip(monkeypatch):
    monkeypatch.delenv(ENV_VAR, raising=False)
    assert ZipageConfig.from_env() is None
    c = ZipageConfig(kv_budget=128, buffer=32)
    c.to_env()
    assert ZipageConfig.from_env() == c


def test_unknown_key_in_env_is_refused():
    with pytest.raises(ZipageConfigError, match="budgett"):
        ZipageConfig.from_json('{"budgett": 3}')


@pytest.mark.parametrize("kw, flag", [
    (dict(kv_budget=0), "--zipage-kv-budget"),
    (dict(window=0), "--zipage-window"),
    (dict(kv_budget=16, window=16, sink=4), "--zipage-kv-budget"),
    (dict(buffer=8), "--zipage-buffer"),
    (dict(decay=1.0), "--zipage-decay"),
    (dict(pooling=2), "--zipage-pooling"),
    (dict(redundancy_tau=0), "--zipage-redundancy-tau"),
    (dict(redundancy="maybe"), "--zipage-redundancy"),
    (dict(selection="best"), "--zipage-selection"),
    (dict(mode="lazy"), "--zipage-mode"),
    (dict(mode="elastic", async_compaction=True), "--zipage-mode"),
    (dict(async_compaction=True), "--zipage-mode fixed"),  # the default mode says what to add
])
def test_invalid_values_name_their_flag(kw, flag):
    with pytest.raises(ZipageConfigError, match=flag):
        ZipageConfig(**kw).validate()


def test_page_alignment_is_checked_when_the_page_size_is_known():
    ZipageConfig(kv_budget=100, buffer=20).validate(page_size=1)
    with pytest.raises(ZipageConfigError, match="multiple of --page-size 16"):
        ZipageConfig(kv_budget=100).validate(page_size=16)
