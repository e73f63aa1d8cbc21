# source me on the device machine: the carried wheels and this checkout on the path
export PYTHONPATH=/tmp/site:$PWD
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false HF_HUB_OFFLINE=1
export SPECHEADS_CACHE=/tmp/specheads-cache
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export TARGET=${TARGET:-/tmp/gguf/SmolLM2-135M-Instruct.Q4_1.gguf}  # a TARGET set before wins (Qwen: stage_qwen.sh)
export PATH=/tmp/site/bin:$PATH
# the Triton kernels' compiled cache: kept in /tmp with the rest, so that a call can save it
# (`tar czf $OUT/triton-cache.tgz -C /tmp triton-cache`) and a later lease's join can restore it
export TRITON_CACHE_DIR=${TRITON_CACHE_DIR:-/tmp/triton-cache}
