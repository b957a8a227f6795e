// The CPU backend's one place for an fp8 (float8 e4m3fn) KV cache: a KV source that hands
// the kernels float32 rows, each element dequantised as stored x scale of its kv head.
// The kernels (attention_tile.h, attention_blocks.h) then run exactly as for a float32
// cache; nothing else on the CPU knows fp8 exists.
#ifndef SPLITKV_CPU_FP8_KV_H_
#define SPLITKV_CPU_FP8_KV_H_

#include <algorithm>
#include <array>
#include <cstdint>
#include <limits>
#include <vector>

#include "cc/splitkv/cpu/isa.h"

namespace splitkv::cpu {
inline namespace SPLITKV_CPU_ISA {

struct Fp8E4M3 {
  uint8_t bits;
};

// e4m3fn: 1 sign, 4 exponent (bias 7) and 3 mantissa bits; exponent 15 with mantissa 7 is
// NaN, there are no infinities. Every value is exact in float32: a 256-entry table.
inline const std::array<float, 256>& Fp8E4M3Table() {
  static const std::array<float, 256> table = [] {
    std::array<float, 256> t{};
    for (int b = 0; b < 256; ++b) {
      const int exponent = (b >> 3) & 15, mantissa = b & 7;
      float magnitude;
      if (exponent == 15 && mantissa == 7) {
        magnitude = std::numeric_limits<float>::quiet_NaN();
      } else if (exponent == 0) {
        magnitude = static_cast<float>(mantissa) * (1.0f / 512.0f);  // mantissa / 8 * 2^-6
      } else {
        magnitude = (1.0f + static_cast<float>(mantissa) / 8.0f) * static_cast<float>(1 << exponent) / 128.0f;
      }
      t[b] = (b & 0x80) ? -magnitude : magnitude;
    }
    return t;
  }();
  return table;
}

// Float32 K and V rows of one (request, kv head) from an fp8 source `Inner` (whose Key(j) /
// Value(j) give that head's d stored bytes of key j). Rows are dequantised a block of
// kRowsPerChunk keys at a time, on first use, into a small per-thread ring of kSlots chunks
// (chunk c in slot c % kSlots). The kernels walk keys in ascending blocks of 64 and hold the
// pointers of one block (two chunks when it is not chunk-aligned) while they ask for the next
// block's rows (prefetch: one chunk more), so a returned pointer stays valid until kSlots - 3
// later chunks have been asked for; a chunk asked for again after its slot was reused is
// dequantised again. The ring's size does not depend on the request's length: a buffer sized
// for every key of the request (kv_len x head_dim x 8 bytes per thread, kept for the thread's
// life: 1 GiB a thread at 1M keys, head_dim 128) is what this replaced.
// One Fp8Rows per task (tile x split) on one thread.
template <typename Inner>
class Fp8Rows {
 public:
  static constexpr int64_t kRowsPerChunk = 64;
  static constexpr int64_t kSlots = 8;

  Fp8Rows(const Inner& inner, int64_t num_keys, int64_t head_dim, float k_scale, float v_scale)
      : inner_(inner), d_(head_dim), num_keys_(num_keys), k_scale_(k_scale), v_scale_(v_scale), state_(State()) {
    state_.chunk_of_slot.assign(kSlots, -1);
    const auto floats = static_cast<size_t>(kSlots * kRowsPerChunk * head_dim);
    if (state_.keys.size() < floats) {
      state_.keys.resize(floats);
      state_.values.resize(floats);
    }
  }

  const float* Key(int64_t j) const { return Row(j, state_.keys); }
  const float* Value(int64_t j) const { return Row(j, state_.values); }

 private:
  struct Buffers {
    Vector<int64_t> chunk_of_slot;  // the chunk each slot holds, -1 for none
    Vector<float> keys, values;     // [kSlots][kRowsPerChunk][d]
  };
  static Buffers& State() {
    thread_local Buffers buffers;
    return buffers;
  }

  const float* Row(int64_t j, const Vector<float>& buffer) const {
    const int64_t chunk = j / kRowsPerChunk;
    const int64_t slot = chunk % kSlots;
    if (state_.chunk_of_slot[slot] != chunk) Fill(chunk, slot);
    return buffer.data() + (slot * kRowsPerChunk + j % kRowsPerChunk) * d_;
  }

  // The chunk's rows that exist (up to num_keys; past it nothing is read).
  void Fill(int64_t chunk, int64_t slot) const {
    const auto& table = Fp8E4M3Table();
    const int64_t first = chunk * kRowsPerChunk;
    const int64_t last = std::min(first + kRowsPerChunk, num_keys_);
    for (int64_t j = first; j < last; ++j) {
      const Fp8E4M3* k = inner_.Key(j);
      const Fp8E4M3* v = inner_.Value(j);
      float* kf = state_.keys.data() + (slot * kRowsPerChunk + (j - first)) * d_;
      float* vf = state_.values.data() + (slot * kRowsPerChunk + (j - first)) * d_;
      for (int64_t e = 0; e < d_; ++e) {
        kf[e] = table[k[e].bits] * k_scale_;
        vf[e] = table[v[e].bits] * v_scale_;
      }
    }
    state_.chunk_of_slot[slot] = chunk;
  }

  Inner inner_;
  int64_t d_, num_keys_;
  float k_scale_, v_scale_;
  Buffers& state_;
};

}  // namespace SPLITKV_CPU_ISA
}  // namespace splitkv::cpu

#endif  // SPLITKV_CPU_FP8_KV_H_
