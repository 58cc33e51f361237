# Source at the start of a device call (repository root):
#   ZIPAGE_COMMIT=<sha> source benchmarks/device_env.sh && python3 benchmarks/...
# (results record $ZIPAGE_COMMIT: the copied .git there can be stale, and the 1a5c635 coverage
# runs recorded the HEAD of an earlier session's copy)
# 1. the wheel bundle of ../shared/device (sglang, sgl-kernel, flashinfer) in /tmp/site
#    (carry .devbundle);
# 2. this checkout as `pip install -e .` maps it: pyproject.toml's package-dir makes the
#    top-level kernels/ the package sglang_zipage.kernels. Without an install, a link
#    (ignored by git) does the same, and the package reaches PYTHONPATH through a folder
#    of its own instead of the repository root, where kernels/ would shadow PyPI's
#    `kernels` as a top-level name.
# (The tracked tree and the whole bundle are more than one call carries, 64 MiB: the two
# largest wheels travel in .devbundle-big/ in a call of their own just before,
#   run(command="mkdir -p /tmp/wheels && cp .devbundle-big/*.whl /tmp/wheels/", carry=[".devbundle-big"])
# with `mkdir -p .devbundle-big && mv .devbundle/{sglang_kernel,flashinfer}*.whl .devbundle-big/`
# here once; they join the rest of the bundle here.)
[ -d /tmp/wheels ] && cp -n /tmp/wheels/*.whl .devbundle/
source .devbundle/install.sh || return 1
# the bundle installs without bytecode: compile it once per machine on all cores (seconds),
# not module by module in the first server's processes (about a minute)
[ -f /tmp/site/.compiled ] || { python3 -m compileall -q -j 0 /tmp/site > /dev/null 2>&1; touch /tmp/site/.compiled; }
# (a copied tree may hold an empty sglang_zipage/kernels/ folder: it would import as a
# namespace package, so it gives way to the link)
[ -L sglang_zipage/kernels ] || { rm -rf sglang_zipage/kernels && ln -s ../kernels sglang_zipage/kernels; }
mkdir -p /tmp/zipage-path && ln -sfn "$PWD/sglang_zipage" /tmp/zipage-path/sglang_zipage
export PYTHONPATH="${PYTHONPATH/$PWD//tmp/zipage-path}"
