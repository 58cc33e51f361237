"""request_state.py: what a retraction does to a request's zipage state, on a single server
(it re-prefills: the state starts over) and on a PD decode server (its columns go to host and
come back as they are: the state stays, its lengths are its columns). Plain objects stand in
for SGLang's Req and ScheduleBatch (the module duck-types them); the end-to-end check is
tests/e2e/test_pd_decode.py."""

from types import SimpleNamespace

import torch

from sglang_zipage import request_state
from sglang_zipage.request_state import ReqState


def _compressed():
    st = ReqState(c0=32)
    st.took_window(5)
    st.compacted(kept=64, evicted=40)
    return st


def test_a_retracted_request_starts_over_unless_its_columns_went_to_host():
    req = SimpleNamespace(zipage=_compressed())
    request_state.restart(req)
    assert req.zipage.c0 is None and req.zipage.pos_offset == 0
    assert req.zipage.compactions == 1  # counts stay

    req = SimpleNamespace(zipage=_compressed())
    req.zipage.offloaded_kv()
    request_state.restart(req)
    st = req.zipage
    assert (st.c0, st.pos_offset, st.compactions) == (32, 40, 1)
    assert not st.has_window  # its slot went with its row


def test_a_resumed_batch_carries_the_columns_of_the_requests_that_came_back():
    back, other = _compressed(), _compressed()
    back.offloaded_kv()
    batch = SimpleNamespace(reqs=[SimpleNamespace(zipage=other), SimpleNamespace(zipage=back),
                                  SimpleNamespace(zipage=None)],
                            seq_lens_cpu=torch.tensor([100, 150, 20]))
    assert request_state.reloaded_lengths(batch) == [(1, 110)]
    assert not back.offloaded and back.n_stored == 0  # new slots: no score from before
    assert request_state.reloaded_lengths(batch) == []
