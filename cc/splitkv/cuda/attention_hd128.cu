// Kernel instances for head_dim 128 (float16 and bfloat16; paged decode/prefill tiles, ragged).
#include "cc/splitkv/cuda/attention_launch.cuh"

namespace splitkv::cuda {
SPLITKV_INSTANTIATE_HEAD_DIM(128)
}  // namespace splitkv::cuda
