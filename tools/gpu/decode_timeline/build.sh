#!/usr/bin/env bash
# Builds the decode timeline probe here (nvcc; the GPU machine has no build step) into
# ${1:-.device/timeline}; carry that folder's parent (.device) to the GPU machine.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../../.." && pwd)"
out="${1:-${root}/.device/timeline}"
mkdir -p "${out}"
python3 "${root}/tools/gpu/decode_timeline/make_traced.py" "${out}"
nvcc -std=c++20 -O3 --expt-relaxed-constexpr -I"${root}" -I"${out}" -gencode=arch=compute_90a,code=sm_90a \
  -o "${out}/decode_timeline" "${root}/tools/gpu/decode_timeline/decode_timeline.cu" \
  "${root}/cc/splitkv/cuda/tensor_map.cu" -cudart static
echo "built ${out}/decode_timeline"
