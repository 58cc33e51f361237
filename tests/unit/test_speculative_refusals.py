"""Which speculative decoding setups run with zipage (speculative.refusals, issue 45), read
from SGLang's own ServerArgs fields; the launcher's run is in tests/e2e/test_launcher.py.

Run: .venv/bin/python -m pytest tests/unit/test_speculative_refusals.py
"""

from types import SimpleNamespace

import pytest

from sglang_zipage import speculative
from sglang_zipage.config import ZipageConfig

CALIBRATED = ZipageConfig(kv_budget=256, buffer=64, scorer="calibrated")


def server(algorithm, page_size=1, multi_layer=False, disaggregation_mode="null"):
    return SimpleNamespace(speculative_algorithm=algorithm, page_size=page_size,
                           enable_multi_layer_eagle=multi_layer,
                           disaggregation_mode=disaggregation_mode)


@pytest.mark.parametrize("algorithm", speculative.SUPPORTED)
def test_the_supported_algorithms_run_with_the_calibrated_scorer(algorithm):
    assert speculative.refusals(server(algorithm), CALIBRATED) == []
    assert speculative.refusals(server(None), ZipageConfig()) == []


@pytest.mark.parametrize("algorithm", ["DFLASH", "DSPARK", "FROZEN_KV_MTP"])
def test_a_draft_whose_kv_is_not_followed_is_refused_by_name(algorithm):
    (msg,) = speculative.refusals(server(algorithm), CALIBRATED)
    assert msg.startswith(f"--speculative-algorithm {algorithm}:") and "NGRAM" in msg


@pytest.mark.parametrize("algorithm", speculative.SUPPORTED)
def test_a_pd_decode_server_runs_the_eagle_family_and_names_the_others(algorithm):
    """SGLang's decode server builds the first draft's input for EAGLE-family drafts (NEXTN
    ran there, pd-check-spec-h100.json); STANDALONE and NGRAM there are refused as untried."""
    msgs = speculative.refusals(server(algorithm, disaggregation_mode="decode"), CALIBRATED)
    if algorithm in ("EAGLE", "EAGLE3", "NEXTN"):
        assert msgs == []
    else:
        (msg,) = msgs
        assert msg.startswith(f"--speculative-algorithm {algorithm} on a PD decode server")
    # outside PD every supported algorithm runs
    assert speculative.refusals(server(algorithm, disaggregation_mode="null"), CALIBRATED) == []


def test_each_unsupported_setting_is_named():
    async_fixed = ZipageConfig(kv_budget=256, buffer=64, scorer="window", mode="fixed",
                               async_compaction=True)
    msgs = speculative.refusals(server("EAGLE", page_size=16, multi_layer=True), async_fixed)
    for part in ("the calibrated scorer", "--page-size 16", "--zipage-async",
                 "--enable-multi-layer-eagle"):
        assert sum(part in m for m in msgs) == 1, (part, msgs)
    assert len(msgs) == 4


def test_a_running_cap_below_what_the_compressed_pool_holds_is_said_with_the_flag():
    # 331,381 tokens at 256 + 64 hold 1035 requests: SGLang's 48 under speculative decoding binds
    note = speculative.running_cap_note(48, 331381, CALIBRATED)
    assert "at most 48 requests" in note and "about 1035" in note
    assert "--max-running-requests" in note and "--cuda-graph-max-bs-decode" in note
    assert speculative.running_cap_note(1035, 331381, CALIBRATED) is None
    assert speculative.running_cap_note(None, 331381, CALIBRATED) is None
