// Kernel instances for head_dim 64 (float16 and bfloat16; paged decode/prefill tiles, ragged).
#include "cc/splitkv/cuda/attention_launch.cuh"

namespace splitkv::cuda {
SPLITKV_INSTANTIATE_HEAD_DIM(64)
}  // namespace splitkv::cuda
