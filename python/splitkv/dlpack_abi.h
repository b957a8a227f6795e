// The part of the DLPack C ABI (major version 1) that tensor_reader.h reads: a tensor's
// description and the exchange table a framework publishes for C callers. Declared here, in
// splitkv's own names, instead of including a framework's copy of dlpack.h: the extension
// builds without torch's headers and reads whatever torch it is imported next to.
//
// Field order and widths are the ABI (DLPack promises them within a major version; minor
// versions only append to the exchange table). Only what the reader touches is named:
// entries it never calls are opaque pointers that keep the table's layout.
#ifndef SPLITKV_PYTHON_DLPACK_ABI_H_
#define SPLITKV_PYTHON_DLPACK_ABI_H_

#include <cstdint>

namespace splitkv::dlpack {

// DLDeviceType values the reader accepts; every other device falls back to Python.
inline constexpr int32_t kCpu = 1;
inline constexpr int32_t kCuda = 2;

// DLDataTypeCode values of the dtypes a splitkv call can take.
inline constexpr uint8_t kInt = 0;
inline constexpr uint8_t kFloat = 2;
inline constexpr uint8_t kBfloat = 4;
inline constexpr uint8_t kFloat8E4m3fn = 10;

struct Device {
  int32_t device_type;
  int32_t device_id;
};

struct DataType {
  uint8_t code;
  uint8_t bits;
  uint16_t lanes;
};

// DLTensor: shape and strides are in elements; the first element is at data + byte_offset.
// A tensor read without ownership (ExchangeApi::tensor_from_object) points into the Python
// object's own shape and strides: valid while that object lives.
struct Tensor {
  void* data;
  Device device;
  int32_t ndim;
  DataType dtype;
  int64_t* shape;
  int64_t* strides;
  uint64_t byte_offset;
};

struct Version {
  uint32_t major;
  uint32_t minor;
};

// DLPackExchangeAPI (DLPack 1.2 and later), found as a PyCapsule named
// "dlpack_exchange_api" in the tensor class's __dlpack_c_exchange_api__ attribute.
struct ExchangeApi {
  Version version;
  const void* previous_api;
  const void* managed_tensor_allocator;
  const void* managed_tensor_from_object;
  const void* managed_tensor_to_object;
  // Fills *out for the Python object `object` without synchronizing any stream; returns 0,
  // or -1 with a Python error set (no storage, an unsupported dtype or device, ...).
  int (*tensor_from_object)(void* object, Tensor* out);
  // Sets *stream to the framework's current stream on a device (torch.cuda.current_stream's
  // raw handle); returns 0, or -1 with a Python error set.
  int (*current_work_stream)(int32_t device_type, int32_t device_id, void** stream);
};

}  // namespace splitkv::dlpack

#endif  // SPLITKV_PYTHON_DLPACK_ABI_H_
