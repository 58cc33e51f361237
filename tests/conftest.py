"""Test-session setup shared by every test directory.

Without a GPU, Triton kernels only run through its interpreter, and TRITON_INTERPRET must
be set before any module decorates a kernel (sglang itself defines many at import).
"""

import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
