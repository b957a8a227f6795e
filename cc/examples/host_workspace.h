// A splitkv workspace owned by plain C++ code: 256-byte aligned, zeroed once when made,
// then reused by every call (never re-zeroed: each call leaves the counter region zero).
// One workspace per thread of launches; two concurrent calls must not share one.
#ifndef SPLITKV_EXAMPLES_HOST_WORKSPACE_H_
#define SPLITKV_EXAMPLES_HOST_WORKSPACE_H_

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <new>
#include <utility>

#include "cc/splitkv/params.h"
#include "cc/splitkv/workspace_layout.h"

namespace splitkv_example {

class HostWorkspace {
 public:
  // `bytes` from splitkv::RequiredWorkspaceBytes for the largest call you will make; at
  // least kCounterRegionBytes.
  explicit HostWorkspace(int64_t bytes) : bytes_(bytes) {
    // aligned_alloc wants a size that is a multiple of the alignment.
    const auto rounded = static_cast<size_t>(splitkv::AlignUp(bytes, splitkv::kWorkspaceAlignment));
    data_ = std::aligned_alloc(splitkv::kWorkspaceAlignment, rounded);
    if (data_ == nullptr) throw std::bad_alloc();
    std::memset(data_, 0, rounded);
  }
  ~HostWorkspace() { std::free(data_); }
  HostWorkspace(HostWorkspace&& other) noexcept
      : data_(std::exchange(other.data_, nullptr)), bytes_(std::exchange(other.bytes_, 0)) {}
  HostWorkspace& operator=(HostWorkspace&& other) noexcept {
    std::swap(data_, other.data_);
    std::swap(bytes_, other.bytes_);
    return *this;
  }
  HostWorkspace(const HostWorkspace&) = delete;
  HostWorkspace& operator=(const HostWorkspace&) = delete;

  // What a params struct's `workspace` field takes.
  splitkv::WorkspaceBuffer buffer() const { return {data_, bytes_}; }
  const void* data() const { return data_; }
  int64_t bytes() const { return bytes_; }

 private:
  void* data_ = nullptr;
  int64_t bytes_ = 0;
};

}  // namespace splitkv_example

#endif  // SPLITKV_EXAMPLES_HOST_WORKSPACE_H_
