#include "cc/splitkv/stream_order.h"

#include "cc/splitkv/backend.h"

namespace splitkv {

StreamOrder::~StreamOrder() {
  for (const auto& entry : events_) cuda::DestroyOrderEvent(entry.second);
}

bool StreamOrder::Before(void* stream) {
  if (cuda::StreamCapturing(stream)) return false;
  if (last_event_ != nullptr && last_stream_ != stream) cuda::WaitOrderEvent(stream, last_event_);
  return true;
}

void StreamOrder::After(void* stream) {
  void* event = nullptr;
  for (const auto& entry : events_) {
    if (entry.first == stream) event = entry.second;
  }
  if (event == nullptr) {
    event = cuda::CreateOrderEvent();
    events_.emplace_back(stream, event);
  }
  cuda::RecordOrderEvent(event, stream);
  last_stream_ = stream;
  last_event_ = event;
}

ScopedDevice::ScopedDevice(int device) {
  if (device < 0) return;
  const int current = cuda::CurrentDevice();
  if (current != device) {
    cuda::SetDevice(device);
    previous_ = current;
  }
}

ScopedDevice::~ScopedDevice() {
  if (previous_ < 0) return;
  try {
    cuda::SetDevice(previous_);
  } catch (...) {  // a destructor must not throw
  }
}

}  // namespace splitkv
