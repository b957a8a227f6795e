// Typed exceptions thrown by splitkv's C++ API.
//
// Every message has the form "<op>: <argument> <problem>: expected <X>, got <Y>[; <fix>]".
// InvalidArgument derives from std::invalid_argument, so pybind11 turns it into ValueError;
// CudaError derives from std::runtime_error (RuntimeError in Python).
#ifndef SPLITKV_ERRORS_H_
#define SPLITKV_ERRORS_H_

#include <stdexcept>
#include <string>

namespace splitkv {

// An argument (shape, stride, value, pointer, option) is not what the operation accepts.
class InvalidArgument : public std::invalid_argument {
 public:
  using std::invalid_argument::invalid_argument;
};

// The workspace cannot hold what the call needs (too small, misaligned, too many tiles).
class WorkspaceError : public InvalidArgument {
 public:
  using InvalidArgument::InvalidArgument;
};

// The requested backend is not in this build, or a feature is not supported by it.
class UnsupportedError : public InvalidArgument {
 public:
  using InvalidArgument::InvalidArgument;
};

// A CUDA runtime call failed; the message names the launcher and cudaGetErrorString.
class CudaError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

}  // namespace splitkv

#endif  // SPLITKV_ERRORS_H_
