// The CUDA backend's stand-in for CPU-only builds: it says the backend is absent.
#include <string>

#include "cc/splitkv/backend.h"
#include "cc/splitkv/errors.h"

namespace splitkv {

namespace cuda {
namespace {
[[noreturn]] void Absent(const char* op) {
  throw UnsupportedError(std::string(op) + ": backend cuda is not in this build: expected a build with "
                         "--config=cuda, got a CPU-only build");
}
}  // namespace

bool Available() { return false; }
BackendTraits Traits(int64_t, int64_t, int64_t, void*, bool, bool) { Absent("splitkv"); }
void PagedAttention(const PagedAttentionParams&, const SplitPlan&) { Absent("paged_attention"); }
void RaggedAttention(const RaggedAttentionParams&, const SplitPlan&) { Absent("ragged_attention"); }
bool InvariantSplitsInCta(const PagedAttentionParams&) { Absent("paged_attention"); }
bool InvariantSplitsInCta(const RaggedAttentionParams&) { Absent("ragged_attention"); }
void ZeroCounterRegion(void*, void*) { Absent("reset_counter_region"); }
void ReadStatusRecord(const void*, void*, uint32_t*) { Absent("check_workspace_status"); }
void MergeStates(const MergeStatesParams&) { Absent("merge_states"); }
void* CreateOrderEvent() { Absent("splitkv"); }
void DestroyOrderEvent(void*) noexcept {}
void RecordOrderEvent(void*, void*) { Absent("splitkv"); }
void WaitOrderEvent(void*, void*) { Absent("splitkv"); }
bool StreamCapturing(void*) { Absent("splitkv"); }
int CurrentDevice() { Absent("splitkv"); }
void SetDevice(int) { Absent("splitkv"); }

}  // namespace cuda
}  // namespace splitkv
