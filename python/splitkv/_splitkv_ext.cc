// The pybind11 module splitkv._splitkv: exports the C++ core, nothing more. Torch stays on
// the Python side (python/splitkv/attention.py turns tensors into these param structs), so
// this extension never links libtorch and works with any torch version.
//
// Pointer fields are plain Python ints (tensor.data_ptr()); C++ exceptions derived from
// std::invalid_argument arrive as ValueError and std::runtime_error as RuntimeError, by
// pybind11's default translators.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <limits>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "cc/splitkv/errors.h"
#include "cc/splitkv/launchers.h"
#include "cc/splitkv/merge_states.h"
#include "cc/splitkv/params.h"
#include "cc/splitkv/split_plan.h"
#include "cc/splitkv/stream_order.h"
#include "cc/splitkv/workspace_layout.h"
#include "python/splitkv/tensor_reader.h"

namespace py = pybind11;

namespace splitkv {
namespace {

// Exposes a pointer member as a read-write int property (an address).
template <typename Class, typename Pointer>
void PointerField(py::class_<Class>& cls, const char* name, Pointer Class::*member) {
  cls.def_property(
      name,
      [member](const Class& self) { return reinterpret_cast<std::uintptr_t>(self.*member); },
      [member](Class& self, std::uintptr_t address) {
        self.*member = reinterpret_cast<Pointer>(address);
      });
}

void BindEnums(py::module_& m) {
  py::enum_<DType>(m, "DType")
      .value("float32", DType::kFloat32)
      .value("float16", DType::kFloat16)
      .value("bfloat16", DType::kBFloat16);
  py::enum_<Backend>(m, "Backend").value("cpu", Backend::kCpu).value("cuda", Backend::kCuda);
}

void BindLayout(py::module_& m) {
  m.attr("kCounterRegionBytes") = kCounterRegionBytes;
  m.attr("kWorkspaceAlignment") = kWorkspaceAlignment;
  m.attr("kCounterBytes") = kCounterBytes;
  m.attr("kSoftmaxStatBytes") = kSoftmaxStatBytes;
  m.attr("kScratchElementBytes") = kScratchElementBytes;
  m.attr("kMaxCounters") = kMaxCounters;
  m.attr("kStatusOffset") = kStatusOffset;
  m.attr("kStatusWords") = kStatusWords;

  py::class_<LayoutShape>(m, "LayoutShape")
      .def(py::init([](int64_t total_q, int64_t num_qo_heads, int64_t head_dim) {
             return LayoutShape{total_q, num_qo_heads, head_dim};
           }),
           py::arg("total_q"), py::arg("num_qo_heads"), py::arg("head_dim"))
      .def_readwrite("total_q", &LayoutShape::total_q)
      .def_readwrite("num_qo_heads", &LayoutShape::num_qo_heads)
      .def_readwrite("head_dim", &LayoutShape::head_dim);

  py::class_<WorkspaceLayout>(m, "WorkspaceLayout")
      .def_readonly("counter_offset", &WorkspaceLayout::counter_offset)
      .def_readonly("counter_bytes", &WorkspaceLayout::counter_bytes)
      .def_readonly("softmax_offset", &WorkspaceLayout::softmax_offset)
      .def_readonly("softmax_bytes", &WorkspaceLayout::softmax_bytes)
      .def_readonly("scratch_offset", &WorkspaceLayout::scratch_offset)
      .def_readonly("scratch_bytes", &WorkspaceLayout::scratch_bytes)
      .def_readonly("required_bytes", &WorkspaceLayout::required_bytes);

  py::class_<SplitPlan>(m, "SplitPlan")
      .def_readonly("num_splits", &SplitPlan::num_splits)
      .def_readonly("num_tiles", &SplitPlan::num_tiles)
      .def_readonly("max_q_tiles", &SplitPlan::max_q_tiles)
      .def_readonly("invariant_split_keys", &SplitPlan::invariant_split_keys)
      .def_readonly("layout", &SplitPlan::layout);

  py::class_<StagedKvLayout>(m, "StagedKvLayout")
      .def_readonly("k_offset", &StagedKvLayout::k_offset)
      .def_readonly("v_offset", &StagedKvLayout::v_offset)
      .def_readonly("table_offset", &StagedKvLayout::table_offset)
      .def_readonly("required_bytes", &StagedKvLayout::required_bytes);

  m.def("ComputeWorkspaceLayout", &ComputeWorkspaceLayout, py::arg("shape"), py::arg("num_splits"));
  m.def("ComputeStagedKvLayout", &ComputeStagedKvLayout, py::arg("rows"), py::arg("row_bytes"),
        py::arg("table_entries"));
  m.def("RequiredWorkspaceBytes", &RequiredWorkspaceBytes, py::arg("shape"), py::arg("num_splits"));
}

void BindOptions(py::module_& m) {
  py::class_<AttentionOptions> options(m, "AttentionOptions");
  options.def(py::init<>())
      .def_readwrite("causal", &AttentionOptions::causal)
      .def_readwrite("window_left", &AttentionOptions::window_left)
      .def_readwrite("logits_soft_cap", &AttentionOptions::logits_soft_cap)
      .def_readwrite("sm_scale", &AttentionOptions::sm_scale)
      .def_readwrite("num_splits", &AttentionOptions::num_splits)
      .def_readwrite("batch_invariant", &AttentionOptions::batch_invariant);
        PointerField(options, "sinks", &AttentionOptions::sinks);

  py::class_<KvStorage> kv_storage(m, "KvStorage");
  kv_storage.def(py::init<>())
      .def_readwrite("fp8_e4m3", &KvStorage::fp8_e4m3)
      .def_readwrite("k_scale", &KvStorage::k_scale)
      .def_readwrite("v_scale", &KvStorage::v_scale);
  PointerField(kv_storage, "k_scales", &KvStorage::k_scales);
  PointerField(kv_storage, "v_scales", &KvStorage::v_scales);

  py::class_<WorkspaceBuffer> workspace(m, "WorkspaceBuffer");
  workspace.def(py::init<>()).def_readwrite("bytes", &WorkspaceBuffer::bytes);
  PointerField(workspace, "data", &WorkspaceBuffer::data);
  PointerField(workspace, "status_host", &WorkspaceBuffer::status_host);
}

void BindPagedParams(py::module_& m) {
  using P = PagedAttentionParams;
  py::class_<P> cls(m, "PagedAttentionParams");
  cls.def(py::init<>());
  PointerField(cls, "q", &P::q);
  PointerField(cls, "k_cache", &P::k_cache);
  PointerField(cls, "v_cache", &P::v_cache);
  PointerField(cls, "block_tables", &P::block_tables);
  PointerField(cls, "seq_lens", &P::seq_lens);
  PointerField(cls, "cu_seqlens_q", &P::cu_seqlens_q);
  PointerField(cls, "kv_offsets", &P::kv_offsets);
  PointerField(cls, "full_seq_lens", &P::full_seq_lens);
  PointerField(cls, "out", &P::out);
  PointerField(cls, "lse", &P::lse);
  PointerField(cls, "stream", &P::stream);
  cls.def_readwrite("q_stride_token", &P::q_stride_token)
      .def_readwrite("q_stride_head", &P::q_stride_head)
      .def_readwrite("k_stride_page", &P::k_stride_page)
      .def_readwrite("k_stride_head", &P::k_stride_head)
      .def_readwrite("k_stride_slot", &P::k_stride_slot)
      .def_readwrite("v_stride_page", &P::v_stride_page)
      .def_readwrite("v_stride_head", &P::v_stride_head)
      .def_readwrite("v_stride_slot", &P::v_stride_slot)
      .def_readwrite("block_tables_stride", &P::block_tables_stride)
      .def_readwrite("out_stride_token", &P::out_stride_token)
      .def_readwrite("out_stride_head", &P::out_stride_head)
      .def_readwrite("batch_size", &P::batch_size)
      .def_readwrite("total_q", &P::total_q)
      .def_readwrite("num_pages", &P::num_pages)
      .def_readwrite("page_size", &P::page_size)
      .def_readwrite("max_pages_per_seq", &P::max_pages_per_seq)
      .def_readwrite("num_qo_heads", &P::num_qo_heads)
      .def_readwrite("num_kv_heads", &P::num_kv_heads)
      .def_readwrite("head_dim", &P::head_dim)
      .def_readwrite("max_q_len", &P::max_q_len)
      .def_readwrite("max_kv_len", &P::max_kv_len)
      .def_readwrite("dtype", &P::dtype)
      .def_readwrite("backend", &P::backend)
      .def_readwrite("kv_storage", &P::kv_storage)
      .def_readwrite("options", &P::options)
      .def_readwrite("workspace", &P::workspace);
}

void BindRaggedParams(py::module_& m) {
  using P = RaggedAttentionParams;
  py::class_<P> cls(m, "RaggedAttentionParams");
  cls.def(py::init<>());
  PointerField(cls, "q", &P::q);
  PointerField(cls, "k", &P::k);
  PointerField(cls, "v", &P::v);
  PointerField(cls, "cu_seqlens_q", &P::cu_seqlens_q);
  PointerField(cls, "cu_seqlens_kv", &P::cu_seqlens_kv);
  PointerField(cls, "out", &P::out);
  PointerField(cls, "lse", &P::lse);
  PointerField(cls, "stream", &P::stream);
  cls.def_readwrite("q_stride_token", &P::q_stride_token)
      .def_readwrite("q_stride_head", &P::q_stride_head)
      .def_readwrite("k_stride_token", &P::k_stride_token)
      .def_readwrite("k_stride_head", &P::k_stride_head)
      .def_readwrite("v_stride_token", &P::v_stride_token)
      .def_readwrite("v_stride_head", &P::v_stride_head)
      .def_readwrite("out_stride_token", &P::out_stride_token)
      .def_readwrite("out_stride_head", &P::out_stride_head)
      .def_readwrite("batch_size", &P::batch_size)
      .def_readwrite("total_q", &P::total_q)
      .def_readwrite("total_kv", &P::total_kv)
      .def_readwrite("num_qo_heads", &P::num_qo_heads)
      .def_readwrite("num_kv_heads", &P::num_kv_heads)
      .def_readwrite("head_dim", &P::head_dim)
      .def_readwrite("max_q_len", &P::max_q_len)
      .def_readwrite("max_kv_len", &P::max_kv_len)
      .def_readwrite("dtype", &P::dtype)
      .def_readwrite("backend", &P::backend)
      .def_readwrite("kv_storage", &P::kv_storage)
      .def_readwrite("options", &P::options)
      .def_readwrite("workspace", &P::workspace);
}

// ---- per-call launches from a validated template (python/splitkv/_calls.py) ----
//
// The Python side validates a call's shapes, strides, dtypes, devices and options once per
// layout and keeps the filled params struct in a PagedTemplate / RaggedTemplate; each later
// call of that layout only supplies its addresses here. The template is copied, never
// written, so threads may share it; the launcher still runs every C++ check on the copy
// (they cost well under a microsecond). A negative max_q_len asks for the value the Python
// full path computes from host index tensors (CPU only: those pointers are host memory).
//
// What depends on the addresses is checked here too, before anything runs: a call whose
// out or workspace shares a byte with any of its inputs (index and per-head scale tensors
// included), or whose workspace shares one with out, launches nothing and returns false;
// the caller then takes the full path, which refuses it with its message. The template
// holds each tensor's byte extent (first to last element) for that: an address and its
// extent are all the check needs.

// The process's reader of torch tensors (layout keys, the current stream); written once,
// by InitTensorReader, under the GIL.
TensorReader tensor_reader;

// The stream a template's launch runs on: the caller's raw handle (an int), or None for
// torch's current stream on `device`, asked of torch's DLPack table here (the reader must be
// on: _calls passes None only then); a Python round trip costs far more on slow hosts.
void* LaunchStream(const py::handle& stream, int device) {
  if (stream.is_none()) {
    void* current = nullptr;
    if (!tensor_reader.on() || !tensor_reader.CurrentCudaStream(device, &current)) {
      if (!PyErr_Occurred()) {
        PyErr_SetString(PyExc_RuntimeError, "splitkv internal: no current stream without the tensor reader");
      }
      throw py::error_already_set();
    }
    return current;
  }
  return reinterpret_cast<void*>(stream.cast<std::uintptr_t>());
}

// max(a[b + 1] - a[b]) over b < n (int64), or 0 for n == 0: _calls.longest on host data.
int64_t LongestSegment(const int32_t* a, int64_t n) {
  if (n <= 0) return 0;
  int64_t longest = std::numeric_limits<int64_t>::min();
  for (int64_t b = 0; b < n; ++b) longest = std::max(longest, int64_t{a[b + 1]} - a[b]);
  return longest;
}

template <typename T>
T* Address(std::uintptr_t address) {
  return reinterpret_cast<T*>(address);
}

// Whether [a, a + a_bytes) and [b, b + b_bytes) share a byte (an empty span shares none).
bool Overlap(std::uintptr_t a, int64_t a_bytes, std::uintptr_t b, int64_t b_bytes) {
  return a_bytes > 0 && b_bytes > 0 && a < b + static_cast<std::uintptr_t>(b_bytes) &&
         b < a + static_cast<std::uintptr_t>(a_bytes);
}

// No tensor's memory starts below this address: Linux maps nothing under vm.mmap_min_addr
// (65536 by default), and CUDA's allocations lie far above it.
constexpr std::uintptr_t kLowestMapped = 65536;

// A validated layout: the full path's params and the byte extents of the call's tensors,
// kNumInputs inputs in the order launch() takes their addresses (q, k, v, sinks first),
// then out. An extent is 0 for an absent or empty tensor.
// A paged layout of a 5-D cache also holds v's offset from k (launch_read then reads k's
// address only, as the cache is one tensor).
template <typename Params, size_t kNumInputs>
struct CallTemplate {
  Params plan;
  std::array<int64_t, kNumInputs + 1> extents{};
  std::optional<int64_t> v_offset;

  CallTemplate(const Params& params, const std::vector<int64_t>& tensor_extents, std::optional<int64_t> v_offset)
      : plan(params), v_offset(v_offset) {
    if (tensor_extents.size() != extents.size()) {
      throw std::invalid_argument("splitkv internal: CallTemplate expects " + std::to_string(extents.size()) +
                                  " extents, got " + std::to_string(tensor_extents.size()));
    }
    std::copy(tensor_extents.begin(), tensor_extents.end(), extents.begin());
  }

  // The inputs' addresses from a LayoutKey result (the key, then one address an argument, in
  // this template's input order; out's, last, is not read here: the caller passes the
  // address of the out it writes, new or given). v is k's plus v_offset for a 5-D cache.
  std::array<std::uintptr_t, kNumInputs> ReadInputs(const py::tuple& read) const {
    if (read.size() < kNumInputs + 1) {
      throw std::invalid_argument("splitkv internal: launch_read expects " + std::to_string(kNumInputs + 1) +
                                  " items, got " + std::to_string(read.size()));
    }
    std::array<std::uintptr_t, kNumInputs> inputs;
    for (size_t i = 0; i < kNumInputs; ++i) {
      inputs[i] = PyLong_AsUnsignedLongLong(PyTuple_GET_ITEM(read.ptr(), i + 1));
    }
    if (PyErr_Occurred()) throw py::error_already_set();
    if (v_offset) inputs[2] = inputs[1] + static_cast<std::uintptr_t>(*v_offset);
    return inputs;
  }

  // False when a tensor the layout holds (a nonzero extent) now has no memory: its storage
  // was freed (resized to 0) after the layout was cached. torch then reports its address as
  // 0, or for a view as its offset in bytes; an address below kLowestMapped is one of those,
  // a larger offset cannot be told from an address here (docs/bad_inputs.md). The call then
  // goes to the full path, which names it ("<op>: <name> is null"), in its own order among
  // its other refusals. Runs before anything reads host memory through these addresses (the
  // CPU's seq_lens and cu_seqlens reads below).
  bool AllPresent(const std::array<std::uintptr_t, kNumInputs>& inputs, std::uintptr_t out) const {
    for (size_t i = 0; i <= kNumInputs; ++i) {
      if (extents[i] > 0 && (i < kNumInputs ? inputs[i] : out) < kLowestMapped) return false;
    }
    return true;
  }

  // True if out shares a byte with any input (the index and per-head scale tensors too: the
  // kernels read them while out is written), or the workspace with any tensor.
  bool SharesBytes(const std::array<std::uintptr_t, kNumInputs>& inputs, std::uintptr_t out,
                   const WorkspaceBuffer& workspace) const {
    const auto base = reinterpret_cast<std::uintptr_t>(workspace.data);
    const int64_t out_extent = extents[kNumInputs];
    for (size_t i = 0; i < kNumInputs; ++i) {
      if (Overlap(out, out_extent, inputs[i], extents[i])) return true;
    }
    if (Overlap(out, out_extent, base, workspace.bytes)) return true;
    for (size_t i = 0; i < kNumInputs; ++i) {
      if (Overlap(inputs[i], extents[i], base, workspace.bytes)) return true;
    }
    return false;
  }
};

// Inputs: q, k_cache, v_cache, sinks, block_tables, seq_lens, cu_seqlens_q, kv_offsets,
// full_seq_lens, k_scales, v_scales (a per-head scale tensor; 0 and no extent for a float).
using PagedTemplate = CallTemplate<PagedAttentionParams, 11>;
// Inputs: q, k, v, sinks, cu_seqlens_q, cu_seqlens_kv, k_scales, v_scales.
using RaggedTemplate = CallTemplate<RaggedAttentionParams, 8>;

// Runs launch() without the GIL, between order->Before and order->After (stream_order.h)
// when the caller passes the workspace's StreamOrder (None on the CPU). `order` is taken as
// an object, not a StreamOrder*: pybind11 accepts None for a class pointer only on its
// second, converting pass over all the arguments, which cost ~0.8 us a call.
// `device`: the tensors' CUDA device, made current for the launch (-1: the CPU).
template <typename Launch>
void LaunchInOrder(const py::object& order, void* stream, int device, Launch launch) {
  StreamOrder* const stream_order = order.is_none() ? nullptr : order.cast<StreamOrder*>();
  py::gil_scoped_release release;
  const ScopedDevice current(device);
  const bool ordered = stream_order != nullptr && stream_order->Before(stream);
  try {
    launch();
  } catch (...) {
    // A launch that raised may have enqueued work first (the reset that heals a reported
    // dirty counter): later launches from other streams must still wait for it.
    if (ordered) stream_order->After(stream);
    throw;
  }
  if (ordered) stream_order->After(stream);
}

// One call of a paged layout. sinks, kv_offsets, full_seq_lens, k_scales and v_scales are 0
// when the layout has none (the layout cache keys on whether each is a tensor, and on its
// shape).
bool LaunchPaged(const PagedTemplate& layout, const std::array<std::uintptr_t, 11>& inputs, std::uintptr_t out,
                 std::uintptr_t lse, const WorkspaceBuffer& workspace, const py::handle& stream, int device,
                 int64_t max_q_len, const py::object& order) {
  const auto [q, k_cache, v_cache, sinks, block_tables, seq_lens, cu_seqlens_q, kv_offsets, full_seq_lens, k_scales,
              v_scales] = inputs;
  if (!layout.AllPresent(inputs, out) || layout.SharesBytes(inputs, out, workspace)) return false;
  PagedAttentionParams p = layout.plan;
  p.q = Address<const void>(q);
  p.k_cache = Address<const void>(k_cache);
  p.v_cache = Address<const void>(v_cache);
  p.options.sinks = Address<const float>(sinks);
  p.kv_storage.k_scales = Address<const float>(k_scales);
  p.kv_storage.v_scales = Address<const float>(v_scales);
  p.block_tables = Address<const int32_t>(block_tables);
  p.seq_lens = Address<const int32_t>(seq_lens);
  p.cu_seqlens_q = Address<const int32_t>(cu_seqlens_q);
  p.kv_offsets = Address<const int32_t>(kv_offsets);
  p.full_seq_lens = Address<const int32_t>(full_seq_lens);
  p.out = Address<void>(out);
  p.lse = Address<float>(lse);
  p.workspace = workspace;
  p.stream = LaunchStream(stream, device);
  if (max_q_len < 0 && p.cu_seqlens_q != nullptr) {
    p.max_q_len = std::max<int64_t>(1, LongestSegment(p.cu_seqlens_q, p.batch_size));
  } else {
    p.max_q_len = max_q_len;
  }
  if (p.backend == Backend::kCpu && p.batch_size > 0) {
    // The split heuristic's bound on keys, as _paged_params computes it.
    const int64_t longest = *std::max_element(p.seq_lens, p.seq_lens + p.batch_size);
    p.max_kv_len = std::max<int64_t>(0, std::min(longest, p.max_pages_per_seq * p.page_size));
  }
  LaunchInOrder(order, p.stream, device, [&] { LaunchPagedAttention(p); });
  return true;
}

bool LaunchPagedFrom(const PagedTemplate& layout, std::uintptr_t q, std::uintptr_t k_cache,
                     std::uintptr_t v_cache, std::uintptr_t sinks, std::uintptr_t block_tables,
                     std::uintptr_t seq_lens, std::uintptr_t cu_seqlens_q, std::uintptr_t kv_offsets,
                     std::uintptr_t full_seq_lens, std::uintptr_t out, std::uintptr_t lse,
                     const WorkspaceBuffer& workspace, const py::handle& stream, int device, int64_t max_q_len,
                     std::uintptr_t k_scales, std::uintptr_t v_scales, const py::object& order) {
  return LaunchPaged(layout,
                     {q, k_cache, v_cache, sinks, block_tables, seq_lens, cu_seqlens_q, kv_offsets, full_seq_lens,
                      k_scales, v_scales},
                     out, lse, workspace, stream, device, max_q_len, order);
}

// One call of a ragged layout; as LaunchPagedFrom.
bool LaunchRagged(const RaggedTemplate& layout, const std::array<std::uintptr_t, 8>& inputs, std::uintptr_t out,
                  std::uintptr_t lse, const WorkspaceBuffer& workspace, const py::handle& stream, int device,
                  int64_t max_q_len, const py::object& order) {
  const auto [q, k, v, sinks, cu_seqlens_q, cu_seqlens_kv, k_scales, v_scales] = inputs;
  if (!layout.AllPresent(inputs, out) || layout.SharesBytes(inputs, out, workspace)) return false;
  RaggedAttentionParams p = layout.plan;
  p.q = Address<const void>(q);
  p.k = Address<const void>(k);
  p.v = Address<const void>(v);
  p.options.sinks = Address<const float>(sinks);
  p.kv_storage.k_scales = Address<const float>(k_scales);
  p.kv_storage.v_scales = Address<const float>(v_scales);
  p.cu_seqlens_q = Address<const int32_t>(cu_seqlens_q);
  p.cu_seqlens_kv = Address<const int32_t>(cu_seqlens_kv);
  p.out = Address<void>(out);
  p.lse = Address<float>(lse);
  p.workspace = workspace;
  p.stream = LaunchStream(stream, device);
  if (max_q_len >= 0 || p.cu_seqlens_q == nullptr) {
    p.max_q_len = max_q_len;
  } else {
    p.max_q_len = LongestSegment(p.cu_seqlens_q, p.batch_size);
  }
  if (p.backend == Backend::kCpu && p.cu_seqlens_kv != nullptr) {
    const int64_t longest = LongestSegment(p.cu_seqlens_kv, p.batch_size);
    p.max_kv_len = std::max<int64_t>(0, std::min(longest, p.total_kv));
  }
  LaunchInOrder(order, p.stream, device, [&] { LaunchRaggedAttention(p); });
  return true;
}

bool LaunchRaggedFrom(const RaggedTemplate& layout, std::uintptr_t q, std::uintptr_t k,
                      std::uintptr_t v, std::uintptr_t sinks, std::uintptr_t cu_seqlens_q,
                      std::uintptr_t cu_seqlens_kv, std::uintptr_t out, std::uintptr_t lse,
                      const WorkspaceBuffer& workspace, const py::handle& stream, int device, int64_t max_q_len,
                      std::uintptr_t k_scales, std::uintptr_t v_scales, const py::object& order) {
  return LaunchRagged(layout, {q, k, v, sinks, cu_seqlens_q, cu_seqlens_kv, k_scales, v_scales}, out, lse, workspace,
                      stream, device, max_q_len, order);
}

// Sets the Python error pybind11's default translators set for the standard exceptions
// (errors.h: the std::invalid_argument family ValueError, CudaError RuntimeError), for the
// raw functions below. Call it from a catch block.
void SetPythonError() {
  try {
    throw;
  } catch (py::error_already_set& e) {
    e.restore();
  } catch (const py::builtin_exception& e) {
    e.set_error();
  } catch (const std::bad_alloc&) {
    PyErr_NoMemory();
  } catch (const std::out_of_range& e) {
    PyErr_SetString(PyExc_IndexError, e.what());
  } catch (const std::overflow_error& e) {
    PyErr_SetString(PyExc_OverflowError, e.what());
  } catch (const std::invalid_argument& e) {
    PyErr_SetString(PyExc_ValueError, e.what());
  } catch (const std::domain_error& e) {
    PyErr_SetString(PyExc_ValueError, e.what());
  } catch (const std::length_error& e) {
    PyErr_SetString(PyExc_ValueError, e.what());
  } catch (const std::range_error& e) {
    PyErr_SetString(PyExc_ValueError, e.what());
  } catch (const std::exception& e) {
    PyErr_SetString(PyExc_RuntimeError, e.what());
  } catch (...) {
    PyErr_SetString(PyExc_RuntimeError, "splitkv internal: unknown C++ exception");
  }
}

// LaunchPagedRead / LaunchRaggedRead(template, read, out, lse, workspace, stream, device,
// max_q_len, order) -> bool: a call of a layout from a LayoutKey result (`read`: its inputs'
// addresses, read with the key) and the addresses of out and lse; as the templates' `launch`
// otherwise. Raw METH_FASTCALL functions, as LayoutKey: pybind11's dispatch of these nine
// arguments cost ~0.5 us a call, a tenth of the per-call path's host time (measured on the
// CPU machine: 0.80 us for a call the template refuses at once).
template <typename Template, size_t kNumInputs,
          bool (*kLaunch)(const Template&, const std::array<std::uintptr_t, kNumInputs>&, std::uintptr_t,
                          std::uintptr_t, const WorkspaceBuffer&, const py::handle&, int, int64_t, const py::object&)>
PyObject* LaunchRead(PyObject* /*module*/, PyObject* const* args, Py_ssize_t nargs) {
  try {
    if (nargs != 9 || !PyTuple_CheckExact(args[1])) {
      throw std::invalid_argument("splitkv internal: launch_read expects (template, read tuple, out, lse, workspace, "
                                  "stream, device, max_q_len, order)");
    }
    const auto& layout = py::handle(args[0]).cast<const Template&>();
    const auto& workspace = py::handle(args[4]).cast<const WorkspaceBuffer&>();
    const std::uintptr_t out = PyLong_AsUnsignedLongLong(args[2]);
    const std::uintptr_t lse = PyLong_AsUnsignedLongLong(args[3]);
    const long device = PyLong_AsLong(args[6]);
    const long long max_q_len = PyLong_AsLongLong(args[7]);
    if (PyErr_Occurred()) throw py::error_already_set();
    const bool launched = kLaunch(layout, layout.ReadInputs(py::reinterpret_borrow<py::tuple>(args[1])), out, lse,
                                  workspace, py::handle(args[5]), static_cast<int>(device), max_q_len,
                                  py::reinterpret_borrow<py::object>(args[8]));
    return PyBool_FromLong(launched);
  } catch (...) {
    SetPythonError();
    return nullptr;
  }
}

PyMethodDef launch_paged_read_def = {
    "LaunchPagedRead",
    reinterpret_cast<PyCFunction>(reinterpret_cast<void*>(&LaunchRead<PagedTemplate, 11, &LaunchPaged>)), METH_FASTCALL,
    "A paged layout's call from a LayoutKey result (internal: splitkv._calls.launch_read)."};
PyMethodDef launch_ragged_read_def = {
    "LaunchRaggedRead",
    reinterpret_cast<PyCFunction>(reinterpret_cast<void*>(&LaunchRead<RaggedTemplate, 8, &LaunchRagged>)), METH_FASTCALL,
    "A ragged layout's call from a LayoutKey result (internal: splitkv._calls.launch_read)."};

// The templates are immutable once made: `launch` is their one method (LaunchPagedRead and
// LaunchRaggedRead the other way to call them).
template <typename Template, typename Launch>
void BindTemplate(py::module_& m, const char* name, Launch launch) {
  py::class_<Template>(m, name)
      .def(py::init<const decltype(Template::plan)&, const std::vector<int64_t>&, std::optional<int64_t>>(),
           py::arg("params"), py::arg("extents"), py::arg("v_offset") = py::none())
      .def_property_readonly("params", [](const Template& self) { return self.plan; })
      // Both hold the GIL while they read their arguments (LaunchInOrder releases it).
      .def("launch", launch);
}

void BindLaunchers(py::module_& m) {
  // The launchers run attention on the thread pool (CPU) or enqueue it (CUDA): other
  // Python threads keep running meanwhile.
  const auto release = py::call_guard<py::gil_scoped_release>();
  m.def("LaunchPagedAttention", &LaunchPagedAttention, py::arg("params"), release);
  m.def("LaunchRaggedAttention", &LaunchRaggedAttention, py::arg("params"), release);
  m.def(
      "CheckOptions", [](const std::string& op, const AttentionOptions& options) { CheckOptions(op.c_str(), options); },
      py::arg("op"), py::arg("options"));
  m.def("PlanPagedAttention", &PlanPagedAttention, py::arg("params"), release);
  m.def("PlanRaggedAttention", &PlanRaggedAttention, py::arg("params"), release);
  BindTemplate<PagedTemplate>(m, "PagedTemplate", &LaunchPagedFrom);
  BindTemplate<RaggedTemplate>(m, "RaggedTemplate", &LaunchRaggedFrom);
  m.add_object("LaunchPagedRead",
               py::reinterpret_steal<py::object>(PyCFunction_New(&launch_paged_read_def, nullptr)));
  m.add_object("LaunchRaggedRead",
               py::reinterpret_steal<py::object>(PyCFunction_New(&launch_ragged_read_def, nullptr)));
  // One per workspace memory (CUDA), held by splitkv.workspace; the templates' launch takes it
  // last. Before/After serve the full path (workspace.exclusive); the device must be current.
  py::class_<StreamOrder>(m, "StreamOrder")
      .def(py::init<>())
      .def("Before", [](StreamOrder& self, std::uintptr_t stream) { return self.Before(reinterpret_cast<void*>(stream)); },
           py::arg("stream"))
      .def("After", [](StreamOrder& self, std::uintptr_t stream) { self.After(reinterpret_cast<void*>(stream)); },
           py::arg("stream"));
  m.def(
      "CheckCounterRegionZero",
      [](std::uintptr_t workspace, int64_t workspace_bytes) {
        CheckCounterRegionZero(reinterpret_cast<const void*>(workspace), workspace_bytes);
      },
      py::arg("workspace"), py::arg("workspace_bytes"), release);
  m.def(
      "CheckWorkspaceStatus",
      [](const std::string& op, const WorkspaceBuffer& workspace, Backend backend, std::uintptr_t stream) {
        CheckWorkspaceStatus(op.c_str(), workspace, backend, reinterpret_cast<void*>(stream));
      },
      py::arg("op"), py::arg("workspace"), py::arg("backend"), py::arg("stream"), release);
  m.def(
      "ResetCounterRegion",
      [](const WorkspaceBuffer& workspace, Backend backend, std::uintptr_t stream) {
        ResetCounterRegion(workspace, backend, reinterpret_cast<void*>(stream));
      },
      py::arg("workspace"), py::arg("backend"), py::arg("stream"), release);
  m.def("CudaBackendAvailable", &CudaBackendAvailable);
}

// ---- layout keys (python/splitkv/_calls.py's cache), read through torch's DLPack table ----

// LayoutKey(options, *tensors): (key, address, ...): bytes naming the option values (a
// tuple; TensorReader::AppendOption) and the layouts of `tensors` (None or plain tensors,
// in order), then each tensor's address (0 for None): a template's launch_read takes the
// tuple whole. None when any value or tensor cannot be read here (TensorReader::AppendKey)
// or the reader is off. A raw METH_FASTCALL function: pybind11's dispatch would cost a
// third of the work.
PyObject* LayoutKey(PyObject* /*module*/, PyObject* const* args, Py_ssize_t nargs) {
  thread_local std::string key;
  thread_local std::vector<std::uintptr_t> addresses;
  key.clear();
  addresses.clear();
  if (!tensor_reader.on() || nargs < 1 || !PyTuple_CheckExact(args[0])) Py_RETURN_NONE;
  const Py_ssize_t num_options = PyTuple_GET_SIZE(args[0]);
  for (Py_ssize_t i = 0; i < num_options; ++i) {
    if (!TensorReader::AppendOption(PyTuple_GET_ITEM(args[0], i), key)) Py_RETURN_NONE;
  }
  key.push_back('|');  // options end: a tensor's marker cannot pass for an option's tag
  ++args;
  --nargs;
  for (Py_ssize_t i = 0; i < nargs; ++i) {
    std::uintptr_t address = 0;
    if (!tensor_reader.AppendKey(args[i], key, address)) Py_RETURN_NONE;
    addresses.push_back(address);
  }
  PyObject* read = PyTuple_New(nargs + 1);
  if (read == nullptr) return nullptr;
  PyObject* bytes = PyBytes_FromStringAndSize(key.data(), static_cast<Py_ssize_t>(key.size()));
  if (bytes == nullptr) {
    Py_DECREF(read);
    return nullptr;
  }
  PyTuple_SET_ITEM(read, 0, bytes);
  for (Py_ssize_t i = 0; i < nargs; ++i) {
    PyObject* address = PyLong_FromUnsignedLongLong(addresses[i]);
    if (address == nullptr) {
      Py_DECREF(read);
      return nullptr;
    }
    PyTuple_SET_ITEM(read, i + 1, address);
  }
  return read;
}

PyMethodDef layout_key_def = {"LayoutKey", reinterpret_cast<PyCFunction>(reinterpret_cast<void*>(&LayoutKey)),
                              METH_FASTCALL, "Layout key of tensors (internal: splitkv._calls)."};

void BindTensorReader(py::module_& m) {
  // Call once torch is imported: the DLPack table's (major, minor) version, or None when the
  // reader stays off (then LayoutKey always returns None).
  m.def("InitTensorReader", []() -> py::object {
    if (!tensor_reader.Init()) return py::none();
    return py::make_tuple(tensor_reader.version().major, tensor_reader.version().minor);
  });
  m.add_object("LayoutKey", py::reinterpret_steal<py::object>(PyCFunction_New(&layout_key_def, nullptr)));
}

// MergeStates from addresses and strides, one call (merge.py builds no params object).
void BindMerge(py::module_& m) {
  m.def(
      "MergeStates",
      [](std::uintptr_t outs, int64_t outs_stride_state, int64_t outs_stride_token, int64_t outs_stride_head,
         std::uintptr_t lses, int64_t lses_stride_state, int64_t lses_stride_token, int64_t lses_stride_head,
         std::uintptr_t out, int64_t out_stride_token, int64_t out_stride_head, std::uintptr_t lse,
         int64_t lse_stride_token, int64_t lse_stride_head, int64_t num_states, int64_t total_q,
         int64_t num_qo_heads, int64_t head_dim, DType dtype, Backend backend, std::uintptr_t stream) {
        MergeStatesParams p;
        p.outs = reinterpret_cast<const void*>(outs);
        p.outs_stride_state = outs_stride_state;
        p.outs_stride_token = outs_stride_token;
        p.outs_stride_head = outs_stride_head;
        p.lses = reinterpret_cast<const float*>(lses);
        p.lses_stride_state = lses_stride_state;
        p.lses_stride_token = lses_stride_token;
        p.lses_stride_head = lses_stride_head;
        p.out = reinterpret_cast<void*>(out);
        p.out_stride_token = out_stride_token;
        p.out_stride_head = out_stride_head;
        p.lse = reinterpret_cast<float*>(lse);
        p.lse_stride_token = lse_stride_token;
        p.lse_stride_head = lse_stride_head;
        p.num_states = num_states;
        p.total_q = total_q;
        p.num_qo_heads = num_qo_heads;
        p.head_dim = head_dim;
        p.dtype = dtype;
        p.backend = backend;
        p.stream = reinterpret_cast<void*>(stream);
        MergeStates(p);
      },
      py::call_guard<py::gil_scoped_release>());
}

}  // namespace
}  // namespace splitkv

PYBIND11_MODULE(_splitkv, m) {
  m.doc() = "splitkv's C++ core (internal: use the splitkv package).";
  splitkv::BindEnums(m);
  splitkv::BindLayout(m);
  splitkv::BindOptions(m);
  splitkv::BindPagedParams(m);
  splitkv::BindRaggedParams(m);
  splitkv::BindLaunchers(m);
  splitkv::BindMerge(m);
  splitkv::BindTensorReader(m);
}
