// Layout keys of torch tensors, read in C++ through the DLPack exchange table torch (2.10
// and later) publishes for C callers: python/splitkv/_calls.py keys its cache of validated
// layouts by them. Reading five tensors' dtypes, devices, shapes and strides this way takes
// well under a microsecond; the same key built from Python attributes took 4-5 us of every
// call on a GPU machine's host (docs/bench/cpu-2026-12-07-s59).
//
// No libtorch: the table is a PyCapsule on torch.Tensor, found at run time. Without it (an
// older torch, or a table of another major version) the reader is off and _calls builds its
// keys in Python, as before.
#ifndef SPLITKV_PYTHON_TENSOR_READER_H_
#define SPLITKV_PYTHON_TENSOR_READER_H_

#include <Python.h>

#include <cstdint>
#include <string>

#include "python/splitkv/dlpack_abi.h"

namespace splitkv {

class TensorReader {
 public:
  // Finds torch.Tensor's exchange table (torch must be imported; the GIL held). Returns
  // whether the reader is on; a failed lookup leaves it off and no Python error set.
  bool Init();

  bool on() const { return api_ != nullptr; }
  const dlpack::Version& version() const { return version_; }

  // Appends the layout of `object` to `key` and sets `address`: for None, a marker and 0;
  // for a plain torch.Tensor (the exact class) whose memory holds its values (no neg bit),
  // of a dtype and device a splitkv call can take, its dtype, device, shape and strides,
  // and its first element's address (tensor.data_ptr()). Returns false for anything else (a
  // subclass, a tensor without storage, a negated view, another dtype or device): the
  // caller then keys the call in Python, where the full path refuses what it must. No
  // Python error is left set either way.
  bool AppendKey(PyObject* object, std::string& key, std::uintptr_t& address) const;

  // Appends an option value to `key`: None, or an exact bool, int (within int64), float or
  // str, tagged by type (True == 1 == 1.0 in Python, not here; -0.0 and 0.0 differ, which
  // costs one more full-path call at most). Returns false for anything else (a subclass, such
  // as numpy.float64 or an IntEnum, or an object whose value could change): the caller keys
  // the call in Python. No Python error is left set either way.
  static bool AppendOption(PyObject* value, std::string& key);

  // torch's current CUDA stream on `device` (the reader must be on); false with a Python
  // error set if torch cannot say.
  bool CurrentCudaStream(int device, void** stream) const {
    return api_->current_work_stream(dlpack::kCuda, device, stream) == 0;
  }

 private:
  const dlpack::ExchangeApi* api_ = nullptr;
  PyTypeObject* tensor_type_ = nullptr;
  PyObject* is_neg_ = nullptr;  // torch.Tensor.is_neg: the neg bit is not in DLPack
  dlpack::Version version_{};
};

}  // namespace splitkv

#endif  // SPLITKV_PYTHON_TENSOR_READER_H_
