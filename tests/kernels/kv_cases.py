"""Random KV pools and requests for the kernel tests (shared by test_*.py here).

A pool has `n_slots` slots; slot 0 is never given out (SGLang's padding slot).
Requests get whole pages of `page_size` slots at permuted page ids, so a kernel
that ignores the slot list fails.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import List

import torch

SENTINEL = -7.25  # exactly representable in fp16/bf16/fp32


@dataclass
class Pool:
    k: List[torch.Tensor]  # L x [n_slots, Hkv, D]
    v: List[torch.Tensor]
    scores: List[torch.Tensor]  # L x [n_slots, Hkv] float32
    src_slots: torch.Tensor  # [R, S_max] int64, 0 past src_lens
    src_lens: torch.Tensor  # [R] int64
    free_pages: torch.Tensor  # page ids not owned by any request (guard region)
    page_size: int

    def clone_buffers(self):
        return [t.clone() for t in self.k], [t.clone() for t in self.v], [t.clone() for t in self.scores]


def device() -> torch.device:
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def make_pool(
    lens, n_layers=2, hkv=2, d=64, dtype=torch.float32, page_size=1, extra_pages=8, seed=0
) -> Pool:
    """Random K/V/scores; requests of `lens` tokens on permuted whole pages.

    Pages nobody owns are filled with SENTINEL and listed in free_pages.
    """
    gen = torch.Generator().manual_seed(seed)
    pages_per_req = [-(-n // page_size) for n in lens]
    n_pages = 1 + sum(pages_per_req) + extra_pages  # page 0 reserved (padding slot)
    n_slots = n_pages * page_size
    perm = torch.randperm(n_pages - 1, generator=gen) + 1
    s_max = max(lens)
    src = torch.zeros(len(lens), s_max, dtype=torch.int64)
    used = 0
    for r, (n, p) in enumerate(zip(lens, pages_per_req)):
        pages = perm[used : used + p]
        used += p
        slots = (pages[:, None] * page_size + torch.arange(page_size)).flatten()
        src[r, :n] = slots[:n]
    free = perm[used:]

    def rand(*shape, dt):
        return torch.randn(*shape, generator=gen).to(dt)

    k = [rand(n_slots, hkv, d, dt=dtype) for _ in range(n_layers)]
    v = [rand(n_slots, hkv, d, dt=dtype) for _ in range(n_layers)]
    s = [rand(n_slots, hkv, dt=torch.float32) for _ in range(n_layers)]
    free_slots = (free[:, None] * page_size + torch.arange(page_size)).flatten()
    for buf in k + v + s:
        buf[free_slots] = SENTINEL
    dev = device()
    return Pool(
        k=[t.to(dev) for t in k],
        v=[t.to(dev) for t in v],
        scores=[t.to(dev) for t in s],
        src_slots=src.to(dev),
        src_lens=torch.tensor(lens, dtype=torch.int64, device=dev),
        free_pages=free.to(dev),
        page_size=page_size,
    )


def random_keep(n_layers, lens, hkv, k, seed=0, dev=None) -> torch.Tensor:
    """[L, R, Hkv, k] int64: a random ascending subset of [0, lens[r]) per row."""
    gen = torch.Generator().manual_seed(seed)
    rows = []
    for _ in range(n_layers):
        for n in lens:
            for _ in range(hkv):
                rows.append(torch.sort(torch.randperm(n, generator=gen)[:k]).values)
    keep = torch.stack(rows).view(n_layers, len(lens), hkv, k)
    return keep.to(dev or device())


def bits(t: torch.Tensor) -> torch.Tensor:
    """Same-size integer view, so NaN and -0.0 compare bit for bit."""
    by_size = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}
    return t.view(by_size[t.element_size()])
