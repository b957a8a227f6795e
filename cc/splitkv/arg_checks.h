// Argument checks with one message shape: "<op>: <arg> <problem>: expected <X>, got <Y>".
// Internal to the launchers; each check kind has one helper.
#ifndef SPLITKV_ARG_CHECKS_H_
#define SPLITKV_ARG_CHECKS_H_

#include <algorithm>
#include <cstdint>
#include <initializer_list>
#include <string>
#include <string_view>
#include <utility>

#include "cc/splitkv/errors.h"
#include "cc/splitkv/params.h"

namespace splitkv {

class ArgChecks {
 public:
  explicit ArgChecks(const char* op) : op_(op) {}

  [[noreturn]] void Fail(const std::string& arg, const std::string& problem,
                         const std::string& expected, const std::string& got) const {
    throw InvalidArgument(std::string(op_) + ": " + arg + " " + problem + ": expected " +
                          expected + ", got " + got);
  }
  void NotNull(const char* arg, const void* ptr) const {
    if (ptr == nullptr) Fail(arg, "is null", "a valid pointer", "null");
  }
  // A pointer to elements of `bytes` each must be aligned to that size: a C++ caller's
  // misaligned float16 pointer read every element shifted by a byte, silently (x86).
  void Aligned(const char* arg, const void* ptr, int64_t bytes) const {
    const auto address = reinterpret_cast<uintptr_t>(ptr);
    if (bytes > 1 && address % static_cast<uintptr_t>(bytes) != 0) {
      Fail(arg, "misaligned", "an address aligned to its element size, " + std::to_string(bytes) + " bytes",
           "address % " + std::to_string(bytes) + " = " + std::to_string(address % static_cast<uintptr_t>(bytes)));
    }
  }
  struct PointerOf {
    const char* name;
    const void* ptr;
    int64_t element_bytes;
  };
  void Aligned(std::initializer_list<PointerOf> pointers) const {
    for (const PointerOf& x : pointers) Aligned(x.name, x.ptr, x.element_bytes);
  }
  void AtLeast(const char* arg, int64_t value, int64_t min) const {
    if (value < min) Fail(arg, "out of range", ">= " + std::to_string(min), std::to_string(value));
  }
  // The checks take C strings and build a std::string only to fail: they run on every
  // launch (a name past the small-string buffer would cost an allocation per check).
  void InRange(const char* arg, int64_t value, int64_t lo, int64_t hi) const {
    if (value < lo || value >= hi) {
      Fail(arg, "out of range", "a value in [" + std::to_string(lo) + ", " + std::to_string(hi) + ")",
           std::to_string(value));
    }
  }
  void Equal(const char* arg, int64_t value, int64_t expected, const char* what) const {
    if (value != expected) {
      Fail(arg, "mismatch", std::string(what) + " = " + std::to_string(expected), std::to_string(value));
    }
  }
  void MultipleOf(const char* arg, int64_t value, const char* of_name, int64_t of) const {
    if (of <= 0 || value % of != 0) {
      Fail(arg, "is not a multiple of " + std::string(of_name),
           "a multiple of " + std::to_string(of), std::to_string(value));
    }
  }
  const char* op() const { return op_; }

 private:
  const char* op_;
};

// The backend code of a C++ caller's params (a Python caller's is always one of the two).
// An unknown value would take the CPU branch of code that tests for kCuda only
// (ResetCounterRegion: a host memset of what may be device memory).
inline void CheckBackendKnown(const ArgChecks& check, Backend backend) {
  if (backend != Backend::kCpu && backend != Backend::kCuda) {
    check.Fail("backend", "unknown", "0 (cpu) or 1 (cuda)", std::to_string(static_cast<int32_t>(backend)));
  }
}

inline void CheckDTypeKnown(const ArgChecks& check, DType dtype) {
  const auto code = static_cast<int32_t>(dtype);
  if (code < 0 || code > 2) {
    check.Fail("dtype", "unknown", "0 (float32), 1 (float16) or 2 (bfloat16)", std::to_string(code));
  }
}

// Stride checks shared by the launchers and merge_states.

// A tensor's elements (inner contiguous ones, then `axes` of {count, stride in elements})
// must lie within 2^63 bytes of its first: past that, index * stride wraps int64 and the
// address space (a float32 out with stride_token 2^62 put every token's row on row 0, which
// the overlap check below, counting in int64, let through). Returns the bytes from the first
// element to the end of the last; an empty tensor spans nothing (0).
struct StrideAxis {
  int64_t count, stride;
};

inline int64_t CheckSpan(const ArgChecks& check, const char* tensor, std::initializer_list<StrideAxis> axes,
                         int64_t inner, int64_t element_bytes) {
  int64_t span = inner;
  bool overflow = inner < 0;
  for (const StrideAxis& axis : axes) {
    if (axis.count <= 0) return 0;
    int64_t step = 0;
    overflow = overflow || __builtin_mul_overflow(axis.count - 1, axis.stride, &step) ||
               __builtin_add_overflow(span, step, &span);
  }
  int64_t bytes = 0;
  if (overflow || __builtin_mul_overflow(span, element_bytes, &bytes)) {
    std::string strides;
    for (const StrideAxis& axis : axes) {
      strides += (strides.empty() ? "" : ", ") + std::to_string(axis.count) + " x stride " + std::to_string(axis.stride);
    }
    check.Fail(std::string(tensor) + " strides", "out of range",
               "elements within 2^63 bytes of the first (" + std::to_string(element_bytes) + " bytes each)",
               strides + " (elements)");
  }
  return bytes;
}

// A byte range [begin, begin + bytes) of one argument (bytes 0: absent or empty).
struct ByteRange {
  const char* name;
  const void* begin;
  int64_t bytes;
};

// An output range must share no byte with any range of `others` but itself (the ranges a
// kernel reads while it writes the output, and the workspace): out over seq_lens crashed a CPU
// launch (its tasks rewrote the lengths others were reading), out over the counter region left
// counters behind. The Python layer checks these first, with its own messages.
template <class Ranges>
void CheckDisjointFrom(const ArgChecks& check, const ByteRange& out, const Ranges& others) {
  if (out.bytes <= 0) return;
  const auto a = reinterpret_cast<uintptr_t>(out.begin);
  for (const ByteRange& other : others) {
    if (other.bytes <= 0 || std::string_view(other.name) == out.name) continue;  // itself
    const auto b = reinterpret_cast<uintptr_t>(other.begin);
    if (a < b + static_cast<uintptr_t>(other.bytes) && b < a + static_cast<uintptr_t>(out.bytes)) {
      check.Fail(out.name, std::string("overlaps ") + other.name, std::string("a buffer sharing no byte with ") + other.name,
                 std::string(out.name) + " bytes [" + std::to_string(a) + ", " + std::to_string(a + out.bytes) +
                     ") and " + other.name + " bytes [" + std::to_string(b) + ", " + std::to_string(b + other.bytes) +
                     ")");
    }
  }
}

// floor(a / b) for b > 0 (C++ division truncates toward zero).
inline int64_t FloorDiv(int64_t a, int64_t b) { return a / b - (a % b != 0 && a < 0 ? 1 : 0); }

// Whether rows of `length` elements at i * stride_i + j * stride_j (0 <= i < count_i,
// 0 <= j < count_j) share an element: some (di, dj) != (0, 0) with |di| < count_i,
// |dj| < count_j and |di * stride_i + dj * stride_j| < length. One step per dj in
// [0, count_j) (the other signs mirror these), so the caller passes the axis with fewer rows
// as j. Strides >= 0 and their span within int64 (CheckSpan): no product below overflows.
inline bool RowsShareAnElement(int64_t count_i, int64_t stride_i, int64_t count_j, int64_t stride_j, int64_t length) {
  for (int64_t dj = 0; dj < count_j; ++dj) {
    const int64_t base = dj * stride_j;
    if (stride_i == 0) {
      if ((dj > 0 && base < length) || count_i > 1) return true;
      continue;
    }
    // The smallest di with base + di * stride_i > -length, then the next one (di = 0 at
    // dj = 0 is the row itself): if neither is below length, no larger di is.
    const int64_t first = std::max(FloorDiv(-length - base, stride_i) + 1, 1 - count_i);
    for (int64_t di = first; di <= first + 1 && di < count_i; ++di) {
      if (dj == 0 && di == 0) continue;
      const int64_t offset = base + di * stride_i;
      if (-length < offset && offset < length) return true;
    }
  }
  return false;
}

// Output rows (head_dim elements at token * stride_token + head * stride_head) must not
// share an element: two rows written to the same place would race and lose one result. The
// usual layouts are seen at once (each axis, in stride order, clears the extent of the ones
// inside it); others (rows interleaved across tokens and heads) are searched exactly. Strides
// >= 0 and within CheckSpan's bound (checked first: the arithmetic is then int64).
inline void CheckDisjointRows(const ArgChecks& check, const char* tensor, int64_t num_tokens, int64_t stride_token,
                              int64_t num_heads, int64_t stride_head, int64_t head_dim) {
  struct Axis {
    int64_t count, stride;
  };
  Axis axes[2] = {{num_tokens, stride_token}, {num_heads, stride_head}};
  if (axes[0].stride > axes[1].stride) std::swap(axes[0], axes[1]);
  int64_t extent = head_dim;
  bool nested = true;
  for (const Axis& axis : axes) {
    if (axis.count <= 1) continue;
    if (axis.stride < extent) {
      nested = false;
      break;
    }
    extent = axis.stride * (axis.count - 1) + extent;
  }
  if (nested) return;
  // The loop runs over the axis with fewer rows.
  const bool heads_fewer = num_heads <= num_tokens;
  const bool overlap = heads_fewer ? RowsShareAnElement(num_tokens, stride_token, num_heads, stride_head, head_dim)
                                   : RowsShareAnElement(num_heads, stride_head, num_tokens, stride_token, head_dim);
  if (overlap) {
    // head_dim 1 is lse's: one float per (token, head), not a row.
    check.Fail(std::string(tensor) + " strides", "overlap",
               head_dim == 1 ? std::string("one element per (token, head), each its own")
                             : "rows of head_dim = " + std::to_string(head_dim) + " elements that share no element",
               std::string(tensor) + "_stride_token = " + std::to_string(stride_token) + ", " + tensor +
                   "_stride_head = " + std::to_string(stride_head));
  }
}

}  // namespace splitkv

#endif  // SPLITKV_ARG_CHECKS_H_
