"""Kernel tests run the Triton ops through the interpreter when there is no GPU.

TRITON_INTERPRET must be set before Triton decorates a kernel. Our kernels are
decorated on their first launch (kernels/utils.py LazyJit), and this file runs
before any test module of this folder, so setting it here is early enough.
"""

import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")


def pytest_configure(config):
    # The interpreter calls a NumPy API deprecated in 1.25 on every launch.
    config.addinivalue_line("filterwarnings", "ignore::DeprecationWarning:triton.runtime.interpreter")
