#!/bin/bash
# The PD deployment's extra wheels for the device (issue 47), beside ../shared/device's bundle:
# mooncake's CUDA 13 transfer engine (98 MB on PyPI; 14 MB without its EP, process-group,
# store and benchmark binaries, which SGLang's KV transfer never loads) and sglang-router
# without its Rust router (SGLang's Python mini load balancer, --mini-lb, stays), plus the
# RDMA and NUMA libraries mooncake's engine.so links, taken from this machine for a device
# that lacks them.
#   build here (network):   bash benchmarks/pd_bundle.sh build      -> .devbundle-pd/ (15 MB)
#   use on the device:      source benchmarks/pd_bundle.sh install  (after device_env.sh;
#                           carry=[".devbundle", ".devbundle-pd"])

dir=.devbundle-pd
case "${1:-}" in
build)
  set -e
  tmp=$(mktemp -d)
  python3 -m pip download -q --no-deps --python-version 3.12 --only-binary=:all: \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 -d "$tmp" \
    mooncake-transfer-engine-cuda13==0.3.13.post1 sglang-router==0.3.2
  rm -rf "$dir" && mkdir -p "$dir/libs"
  trim=../shared/device/trim_wheel.py
  python3 $trim "$tmp"/mooncake_transfer_engine_cuda13-*.whl \
    "$dir/$(basename "$tmp"/mooncake_transfer_engine_cuda13-*.whl)" \
    --drop 'mooncake/libmooncake_pg*.so' --drop 'mooncake/pg_*.so' --drop 'mooncake/_ep*.so' \
    --drop 'mooncake/libmooncake_ep_device.so' --drop 'mooncake/transfer_engine_bench' \
    --drop 'mooncake/mooncake_master' --drop 'mooncake/mooncake_client' --drop 'mooncake/store.so' \
    --drop 'mooncake_transfer_engine_cuda13.libs/libetcd_wrapper-*.so'
  python3 $trim "$tmp"/sglang_router-*.whl "$dir/$(basename "$tmp"/sglang_router-*.whl)" \
    --drop 'sglang_router/sglang_router_rs.abi3.so'
  for l in libibverbs.so.1 libmlx5.so.1 libnuma.so.1 libnl-3.so.200 libnl-route-3.so.200; do
    cp -L "/lib/x86_64-linux-gnu/$l" "$dir/libs/"
  done
  rm -rf "$tmp"; du -sh "$dir" ;;
install)
  python3 -m pip install -q --no-deps --no-compile --target /tmp/site "$dir"/*.whl \
    > /dev/null 2>&1 || { echo "pd_bundle: pip install failed" >&2; return 1; }
  # the Rust router's module, dropped above: router_args.py asks it for the tool-call parser
  # names (its --tool-call-parser choices; None: any), router.py for the Rust Router, whose
  # ImportError launch_router.py catches (then only --mini-lb runs)
  echo 'def get_available_tool_call_parsers(): return None' \
    > /tmp/site/sglang_router/sglang_router_rs.py
  # the carried libraries only where the device has none of its own
  for l in libibverbs.so.1 libmlx5.so.1 libnuma.so.1; do
    ldconfig -p | grep -q "$l" || { export LD_LIBRARY_PATH="$PWD/$dir/libs:${LD_LIBRARY_PATH:-}"; break; }
  done
  # (outside the repository root, whose kernels/ would shadow PyPI's `kernels`)
  (cd /tmp && python3 -c "from mooncake.engine import TransferEngine") || return 1 ;;
*) echo "usage: bash benchmarks/pd_bundle.sh build | source benchmarks/pd_bundle.sh install" >&2 ;;
esac
