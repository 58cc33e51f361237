"""meta_info plumbing: live per-token slices in the scheduler, one integer per key for clients."""

from types import SimpleNamespace

from sglang_zipage.request_state import ReqState
from sglang_zipage.meta_info import attach, fold


def test_slices_repeat_the_current_value_and_fold_keeps_the_last():
    req = SimpleNamespace(customized_info={"other": [1, 2]}, kv_committed_len=40, zipage=None)
    attach(req)
    info = req.customized_info
    assert info["other"] == [1, 2]  # custom logit processors' own keys survive
    assert info["zipage_compactions"][0:3] == [0, 0, 0]
    req.zipage = ReqState(c0=8, compactions=2)
    req.kv_committed_len = 24
    assert info["zipage_compactions"][3:5] == [2, 2] and info["zipage_kv_len"][3:4] == [24]
    out = {"meta_info": {"zipage_compactions": [0, 0, 2, None], "zipage_kv_len": [40, 24],
                         "completion_tokens": 4}}
    fold([out])
    assert out["meta_info"] == {"zipage_compactions": 2, "zipage_kv_len": 24, "completion_tokens": 4}
