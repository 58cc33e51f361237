"""The kernels' batch-dependent integer arguments (kernels.utils.lazy_jit's batch_args) name
real, non-constexpr parameters: Triton ignores a name it does not know, so a typo would bring
back one compiled variant per batch shape (a compile stall mid-serving) without any error."""

import inspect

import pytest

from sglang_zipage.kernels import compaction, pool_decay_protect, scores
from sglang_zipage.kernels.utils import LazyJit

KERNELS = [scores._window_lse_kernel, scores._window_probs_kernel,
           pool_decay_protect._global_scores_kernel, compaction._compact_kv_kernel]


@pytest.mark.parametrize("kernel", KERNELS, ids=lambda k: k.fn.__name__)
def test_batch_args_are_runtime_parameters_of_the_kernel(kernel):
    assert isinstance(kernel, LazyJit)
    params = inspect.signature(kernel.fn).parameters
    names = kernel.options["do_not_specialize"]
    assert "R" in names  # every kernel takes the request count
    for name in names:
        assert name in params, f"{kernel.fn.__name__}: no parameter {name!r}"
        assert "constexpr" not in str(params[name].annotation), name
