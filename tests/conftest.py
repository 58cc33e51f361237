"""Test-session setup shared by every test directory.

Without a GPU, Triton kernels only run through its interpreter, and TRITON_INTERPRET must
be set before any module decorates a kernel (sglang itself defines many at import).
"""

import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")


# Modules that start the most servers at once run first, while the other worker holds few:
# the PD pair (a prefill and a decode server beside its worker's session server) ran the
# 24 GiB machine out of memory when it met the other worker's servers late in the run
# (2026-12-07: every server stalled for minutes, the router answered 503).
FIRST = ("tests/e2e/test_pd_pair.py",)


def pytest_collection_modifyitems(config, items):
    """The order xdist's loadscope runs modules in (addopts turns its own reordering off):
    FIRST, then by number of tests, most first, as xdist would order them."""
    module = lambda item: item.nodeid.split("::")[0]  # noqa: E731
    counts = {}
    for item in items:
        counts[module(item)] = counts.get(module(item), 0) + 1
    items.sort(key=lambda item: (module(item) not in FIRST, -counts[module(item)]))
