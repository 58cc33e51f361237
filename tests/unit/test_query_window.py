"""QueryWindow: slot handout, table updates at flush, and the per-layer ring writes."""

import torch

from sglang_zipage.query_window import QueryWindow


def test_slots_are_lent_and_returned():
    qw = QueryWindow(1, 2, 8, 4, 1, 4, torch.float32, "cpu")
    assert qw.assign(3) == qw.assign(3) != 0  # idempotent
    assert qw.assign(5) != 0 and qw.free_slots == 0
    assert qw.assign(6) == 0  # none free: the request keeps decoding without one
    qw.flush()
    assert qw.slot_of_rpi[3] != 0 and qw.slot_of_rpi[6] == 0
    qw.release(3)
    assert qw.slot_of_rpi[3] != 0  # the table changes only at the next flush
    qw.flush()
    assert qw.slot_of_rpi[3] == 0 and qw.assign(6) != 0


def test_writes_land_in_the_slot_row_at_position_mod_window():
    qw = QueryWindow(3, 4, 10, 4, 2, 8, torch.bfloat16, "cpu")
    for r in (3, 5, 7):
        qw.assign(r)
    qw.flush()
    rpi, pos = torch.tensor([3, 5, 9, 7]), torch.tensor([10, 3, 6, 4])
    qkv = torch.randn(4, 48, dtype=torch.bfloat16)
    for layer in range(3):
        q = qkv[:, layer * 16:(layer + 1) * 16]  # a strided view, as a qkv split gives
        qw.write(layer, q, rpi, pos)
        for b in range(4):
            slot = qw.slot_of(int(rpi[b]))  # request 9 has none: it writes the dump row 0
            assert torch.equal(qw.ring[layer, slot, int(pos[b]) % 4].reshape(-1), q[b])
    assert torch.equal(qw.gather(torch.tensor([qw.slot_of(5)]))[:, 0], qw.ring[:, qw.slot_of(5)])
