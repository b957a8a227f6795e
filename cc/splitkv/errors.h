// Typed exceptions thrown by splitkv's C++ API (launchers.h says which call throws which).
//
//   std::invalid_argument
//     InvalidArgument        the caller passed something wrong; fix the call
//       WorkspaceError       ... about the workspace (size, alignment, counters)
//       UnsupportedError     ... valid, but not in this build or on this backend
//   std::runtime_error
//     CudaError              the CUDA runtime reported an error (a failed launch, or an
//                            earlier kernel's fault surfacing); the work was not enqueued
//
// Every message has the form "<op>: <argument> <problem>: expected <X>, got <Y>[; <fix>]"
// (op: paged_attention, ragged_attention, check_counter_region), e.g.
// "paged_attention: workspace too small: need 9437440 bytes for num_splits=4, got 8388608;
// pass a larger workspace or let the planner choose num_splits"; a CudaError message is
// mostly "<op>: <cudaGetErrorString>". Catch the most derived class you handle first. A refused
// call has written nothing (a dirty-counter WorkspaceError also zeroes the counter region:
// launchers.h). pybind11 turns the std::invalid_argument family into
// ValueError and CudaError into RuntimeError. Beyond these, only the standard library's
// own failures (std::bad_alloc, std::system_error from starting the CPU thread pool) can
// escape a call.
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
