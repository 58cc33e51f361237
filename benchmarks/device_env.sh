# Source at the start of a device call (repository root):
#   source benchmarks/device_env.sh && python3 benchmarks/...
# 1. the wheel bundle of ../shared/device (sglang, sgl-kernel, flashinfer) in /tmp/site,
#    with this checkout on PYTHONPATH (carry .devbundle);
# 2. the checkout as `pip install -e .` would map it: pyproject.toml's package-dir makes
#    the top-level kernels/ the package sglang_zipage.kernels; without an install, a link
#    (ignored by git) does the same.
source .devbundle/install.sh || return 1
[ -e sglang_zipage/kernels ] || ln -s ../kernels sglang_zipage/kernels
