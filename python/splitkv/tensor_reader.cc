#include "python/splitkv/tensor_reader.h"

#include <cstdint>
#include <string>

namespace splitkv {
namespace {

// The dtypes of a call's tensors: q / out (float16, bfloat16, float32), K/V (those or
// float8_e4m3fn), index tensors (int32), sinks and per-head scales (float32).
bool CallDtype(const dlpack::DataType& t) {
  if (t.lanes != 1) return false;
  switch (t.code) {
    case dlpack::kInt:
      return t.bits == 32;
    case dlpack::kFloat:
      return t.bits == 16 || t.bits == 32;
    case dlpack::kBfloat:
      return t.bits == 16;
    case dlpack::kFloat8E4m3fn:
      return t.bits == 8;
    default:
      return false;
  }
}

template <typename T>
void Append(std::string& key, const T& value) {
  key.append(reinterpret_cast<const char*>(&value), sizeof(T));
}

}  // namespace

bool TensorReader::Init() {
  if (on()) return true;
  PyObject* torch = PyImport_ImportModule("torch");
  PyObject* tensor_type = torch != nullptr ? PyObject_GetAttrString(torch, "Tensor") : nullptr;
  Py_XDECREF(torch);
  PyObject* table =
      tensor_type != nullptr ? PyObject_GetAttrString(tensor_type, "__dlpack_c_exchange_api__") : nullptr;
  PyObject* is_neg = tensor_type != nullptr ? PyObject_GetAttrString(tensor_type, "is_neg") : nullptr;
  const auto* api = table != nullptr
                        ? static_cast<const dlpack::ExchangeApi*>(PyCapsule_GetPointer(table, "dlpack_exchange_api"))
                        : nullptr;
  Py_XDECREF(table);
  // The table's layout is DLPack 1.x's from minor version 2 on (the first with it).
  if (api == nullptr || is_neg == nullptr || api->version.major != 1 || api->version.minor < 2 ||
      api->tensor_from_object == nullptr || api->current_work_stream == nullptr) {
    PyErr_Clear();
    Py_XDECREF(tensor_type);
    Py_XDECREF(is_neg);
    return false;
  }
  // Both stay referenced for the life of the process (the table lives as long as torch).
  tensor_type_ = reinterpret_cast<PyTypeObject*>(tensor_type);
  is_neg_ = is_neg;
  version_ = api->version;
  api_ = api;
  return true;
}

bool TensorReader::AppendOption(PyObject* value, std::string& key) {
  if (value == Py_None) {
    key.push_back('n');
  } else if (value == Py_True || value == Py_False) {
    key.push_back(value == Py_True ? 'T' : 'F');
  } else if (PyLong_CheckExact(value)) {
    int overflow = 0;
    const long long v = PyLong_AsLongLongAndOverflow(value, &overflow);
    if (overflow != 0 || (v == -1 && PyErr_Occurred())) {
      PyErr_Clear();
      return false;
    }
    key.push_back('i');
    Append(key, static_cast<int64_t>(v));
  } else if (PyFloat_CheckExact(value)) {
    key.push_back('f');
    Append(key, PyFloat_AS_DOUBLE(value));
  } else if (PyUnicode_CheckExact(value)) {
    Py_ssize_t size = 0;
    const char* text = PyUnicode_AsUTF8AndSize(value, &size);
    if (text == nullptr) {
      PyErr_Clear();
      return false;
    }
    key.push_back('s');
    Append(key, static_cast<int64_t>(size));
    key.append(text, static_cast<size_t>(size));
  } else {
    return false;
  }
  return true;
}

bool TensorReader::AppendKey(PyObject* object, std::string& key, std::uintptr_t& address) const {
  if (object == Py_None) {
    key.push_back('\0');
    address = 0;
    return true;
  }
  if (Py_TYPE(object) != tensor_type_) return false;
  dlpack::Tensor t;
  if (api_->tensor_from_object(object, &t) != 0) {
    PyErr_Clear();
    return false;
  }
  if ((t.device.device_type != dlpack::kCpu && t.device.device_type != dlpack::kCuda) || !CallDtype(t.dtype) ||
      t.ndim < 0 || (t.ndim > 0 && (t.shape == nullptr || t.strides == nullptr))) {
    return false;
  }
  PyObject* negated = PyObject_CallOneArg(is_neg_, object);
  if (negated != Py_False) {  // True, or an error: the Python key decides
    Py_XDECREF(negated);
    PyErr_Clear();
    return false;
  }
  Py_DECREF(negated);
  key.push_back('\1');
  Append(key, t.ndim);
  Append(key, t.dtype);
  Append(key, t.device);
  key.append(reinterpret_cast<const char*>(t.shape), sizeof(int64_t) * t.ndim);
  key.append(reinterpret_cast<const char*>(t.strides), sizeof(int64_t) * t.ndim);
  address = reinterpret_cast<std::uintptr_t>(t.data) + t.byte_offset;
  return true;
}

}  // namespace splitkv
