// Argument checks with one message shape: "<op>: <arg> <problem>: expected <X>, got <Y>".
// Internal to the launchers; each check kind has one helper.
#ifndef SPLITKV_ARG_CHECKS_H_
#define SPLITKV_ARG_CHECKS_H_

#include <cstdint>
#include <string>

#include "cc/splitkv/errors.h"

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

}  // namespace splitkv

#endif  // SPLITKV_ARG_CHECKS_H_
