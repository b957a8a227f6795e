// A test workspace: 256-byte aligned, zeroed once when made (never again: the tests check
// that every launch leaves the counter region as it found it), plus helpers to inspect the
// counter region and to fill the softmax/scratch regions with NaN.
#ifndef SPLITKV_TESTS_CC_TEST_WORKSPACE_H_
#define SPLITKV_TESTS_CC_TEST_WORKSPACE_H_

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <new>

#include "cc/splitkv/workspace_layout.h"

namespace splitkv_test {

class TestWorkspace {
 public:
  explicit TestWorkspace(int64_t bytes) : bytes_(bytes) {
    data_ = static_cast<unsigned char*>(
        std::aligned_alloc(splitkv::kWorkspaceAlignment, splitkv::AlignUp(bytes, splitkv::kWorkspaceAlignment)));
    if (data_ == nullptr) throw std::bad_alloc();
    std::memset(data_, 0, bytes);
  }
  ~TestWorkspace() { std::free(data_); }
  TestWorkspace(const TestWorkspace&) = delete;
  TestWorkspace& operator=(const TestWorkspace&) = delete;

  unsigned char* data() const { return data_; }
  int64_t bytes() const { return bytes_; }
  uint32_t* counters() const { return reinterpret_cast<uint32_t*>(data_); }

  // Number of nonzero uint32 words in [0, kCounterRegionBytes) (counters and status record);
  // fast path is one memcmp.
  int64_t NonzeroCounters() const {
    static const auto* zeros = static_cast<const unsigned char*>(std::calloc(1, splitkv::kCounterRegionBytes));
    if (std::memcmp(data_, zeros, splitkv::kCounterRegionBytes) == 0) return 0;
    int64_t nonzero = 0;
    for (int64_t i = 0; i < splitkv::kCounterRegionBytes / 4; ++i) nonzero += counters()[i] != 0;
    return nonzero;
  }

  // Everything after the counter region becomes quiet-NaN floats (by doubling memcpy: one
  // range access per copy keeps this cheap under the sanitizers).
  void PoisonAfterCounters() const {
    unsigned char* begin = data_ + splitkv::kCounterRegionBytes;
    const int64_t n = (bytes_ - splitkv::kCounterRegionBytes) / 4 * 4;
    if (n <= 0) return;
    const float nan = std::numeric_limits<float>::quiet_NaN();
    std::memcpy(begin, &nan, 4);
    for (int64_t filled = 4; filled < n;) {
      const int64_t chunk = filled < n - filled ? filled : n - filled;
      std::memcpy(begin + filled, begin, chunk);
      filled += chunk;
    }
  }

 private:
  unsigned char* data_ = nullptr;
  int64_t bytes_ = 0;
};

}  // namespace splitkv_test

#endif  // SPLITKV_TESTS_CC_TEST_WORKSPACE_H_
