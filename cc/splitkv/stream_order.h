// Orders one workspace's CUDA launches across streams (the Python package keeps one per
// workspace memory): a launch on a stream other than the last launch's first waits, on the
// GPU, for that launch, so two launches never share the counter region at once and no host
// thread blocks. Each stream gets one event, made on first use and recorded again after
// every launch there (a wait already enqueued keeps the state it saw).
#ifndef SPLITKV_STREAM_ORDER_H_
#define SPLITKV_STREAM_ORDER_H_

#include <utility>
#include <vector>

namespace splitkv {

// Not thread-safe: its callers hold the workspace for the whole launch (one call at a time).
class StreamOrder {
 public:
  StreamOrder() = default;
  ~StreamOrder();
  StreamOrder(const StreamOrder&) = delete;
  StreamOrder& operator=(const StreamOrder&) = delete;

  // Before a launch on `stream` (a cudaStream_t; its device current): makes it wait for the
  // last recorded launch when that ran on another stream. Returns false, doing nothing,
  // while `stream` captures a CUDA graph: the graph orders the launches it captures and its
  // replays run on the caller's streams, so a captured launch is neither waited for nor
  // recorded (the caller then skips After). Throws CudaError if a CUDA call fails.
  bool Before(void* stream);

  // After a launch on `stream` for which Before returned true: records the stream's event.
  void After(void* stream);

 private:
  std::vector<std::pair<void*, void*>> events_;  // (stream, its event): a few streams at most
  void* last_stream_ = nullptr;                  // valid when last_event_ is set (0 is a stream)
  void* last_event_ = nullptr;
};

// Makes a CUDA `device` current for a scope (nothing for device < 0, the CPU, or when it
// already is) and restores the previous one at its end. The Python templates' launch takes
// the tensors' device and runs under one of these instead of entering torch.cuda.device
// (about a microsecond a call on the GPU machines' hosts). Throws CudaError if the device
// cannot be made current; a failure to restore it is ignored (the launch's own error, if
// any, is the one to report).
class ScopedDevice {
 public:
  explicit ScopedDevice(int device);
  ~ScopedDevice();
  ScopedDevice(const ScopedDevice&) = delete;
  ScopedDevice& operator=(const ScopedDevice&) = delete;

 private:
  int previous_ = -1;
};

}  // namespace splitkv

#endif  // SPLITKV_STREAM_ORDER_H_
