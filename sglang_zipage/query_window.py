"""The query window: the last W post-RoPE decode queries of each compressing request.

Scoring needs, per layer, the last W decode queries of a request. Storing them for every
``req_pool_idx`` would cost layers x rows x W x Hq x D (about 10 GB for Qwen3-8B at 256
rows), so requests borrow one of a few *window slots* (Zipage's query slots) once their
decode suffix is within W tokens of needing a compaction, and keep it until they leave.

- ``ring``: [L, slots + 1, W, Hq, D] model dtype; slot 0 is a dump row that every request
  without a slot (and every CUDA-graph padding row) writes to.
- ``slot_of_rpi``: [req_pool rows] int64 on the device, req_pool_idx -> slot (0 = none).
  The decode forward writes ``ring[l, slot_of_rpi[rpi], position % W] = q``: static-shape
  indexing on static buffers, so it is recorded into decode CUDA graphs and replays.

Slot-table updates are queued on the CPU and applied by ``flush()`` on the stream that
runs the next forward, so a forward never sees a half-updated table. Positions are
logical, so position % W walks all W entries; a request may only be scored once W decode
forwards have written its slot since it got it (``budget.window_ready``).
"""

from __future__ import annotations

from typing import Dict, List

import torch


class QueryWindow:
    def __init__(self, num_layers: int, num_slots: int, req_rows: int, window: int,
                 q_heads: int, head_dim: int, dtype: torch.dtype, device):
        self.window = window
        self.ring = torch.zeros((num_layers, num_slots + 1, window, q_heads, head_dim),
                                dtype=dtype, device=device)
        self.slot_of_rpi = torch.zeros((req_rows,), dtype=torch.int64, device=device)
        self._free: List[int] = list(range(num_slots, 0, -1))  # pop() hands out slot 1 first
        self._owner: Dict[int, int] = {}  # req_pool_idx -> slot
        self._pending: Dict[int, int] = {}  # req_pool_idx -> slot to write at flush
        self._rows = None  # ring rows of the current decode forward (set at layer 0)

    @property
    def nbytes(self) -> int:
        return self.ring.numel() * self.ring.element_size() + self.slot_of_rpi.numel() * 8

    @property
    def num_slots(self) -> int:
        return self.ring.shape[1] - 1  # row 0 is the dump row

    @property
    def free_slots(self) -> int:
        return len(self._free)

    def slot_of(self, rpi: int) -> int:
        return self._owner.get(rpi, 0)

    def assign(self, rpi: int) -> int:
        """Give req_pool_idx a slot; 0 when none is free (the request keeps decoding)."""
        if rpi in self._owner:
            return self._owner[rpi]
        if not self._free:
            return 0
        slot = self._free.pop()
        self._owner[rpi] = slot
        self._pending[rpi] = slot
        return slot

    def release(self, rpi: int) -> None:
        slot = self._owner.pop(rpi, None)
        if slot is not None:
            self._free.append(slot)
            self._pending[rpi] = 0

    def flush(self) -> None:
        """Apply queued slot-table changes on the current stream (before a forward)."""
        if not self._pending:
            return
        rpis = torch.tensor(list(self._pending.keys()), dtype=torch.int64)
        slots = torch.tensor(list(self._pending.values()), dtype=torch.int64)
        self._pending.clear()
        dev = self.slot_of_rpi.device
        self.slot_of_rpi[rpis.to(dev, non_blocking=True)] = slots.to(dev, non_blocking=True)

    def write(self, layer: int, q: torch.Tensor, req_pool_indices: torch.Tensor,
              positions: torch.Tensor) -> None:
        """Store one decode step's queries q: [bs, Hq, D] of ring layer ``layer`` (the
        layout maps model layers to ring layers and gives q this shape).

        The ring row of each query is computed once per forward (at ring layer 0, the
        first scored layer to run) and reused by the other layers; rows are copied as
        8-byte words when the layout allows it (4x fewer elements for bf16 than an
        element-wise index_put)."""
        if layer == 0 or self._rows is None:
            self._rows = (self.slot_of_rpi[req_pool_indices] * self.window
                          + positions % self.window)
        flat = self.ring[layer].view(-1, self.ring.shape[-2] * self.ring.shape[-1])
        src = q.reshape(q.shape[0], -1).to(flat.dtype)
        try:
            flat.view(torch.int64)[self._rows] = src.view(torch.int64)
        except RuntimeError:  # odd row sizes or strides: element-wise copy
            flat[self._rows] = src

    def gather(self, slots: torch.Tensor) -> torch.Tensor:
        """Queries of the given slots for every layer: [L, R, W, Hq, D]."""
        return self.ring[:, slots]
