// The CPU backend's run-time choice of kernel build: SPLITKV_CPU_ISA picks a narrower build
// (a wider one than the CPU has falls back to the best it runs), anything else is refused.
// Run once per build by Bazel (env), so it also shows the variable reaches the tests.
#include <cstdio>
#include <cstdlib>
#include <stdexcept>
#include <string>

#include "cc/splitkv/cpu/attention_kernels.h"
#include "tests/cc/test_check.h"

namespace {

using splitkv::cpu::ActiveIsa;
using splitkv::cpu::BestSupportedIsa;
using splitkv::cpu::Isa;
using splitkv::cpu::IsaName;

Isa Expected(Isa requested) { return requested <= BestSupportedIsa() ? requested : BestSupportedIsa(); }

TEST(TheEnvironmentOfThisRunReachesTheDispatcher) {
  const char* env = std::getenv("SPLITKV_CPU_ISA");
  std::printf("best supported: %s; SPLITKV_CPU_ISA=%s; active: %s\n", IsaName(BestSupportedIsa()),
              env ? env : "(unset)", IsaName(ActiveIsa()));
  if (env == nullptr) {
    EXPECT_EQ(static_cast<int>(BestSupportedIsa()), static_cast<int>(ActiveIsa()));
    return;
  }
  for (Isa isa : {Isa::kBaseline, Isa::kAvx2, Isa::kAvx512}) {
    if (std::string(env) == IsaName(isa)) EXPECT_EQ(static_cast<int>(Expected(isa)), static_cast<int>(ActiveIsa()));
  }
}

TEST(EachNameSelectsItsBuildOrTheBestBelow) {
  const char* saved = std::getenv("SPLITKV_CPU_ISA");
  const std::string restore = saved ? saved : "";
  const bool had = saved != nullptr;
  for (Isa isa : {Isa::kBaseline, Isa::kAvx2, Isa::kAvx512}) {
    setenv("SPLITKV_CPU_ISA", IsaName(isa), 1);
    EXPECT_EQ(static_cast<int>(Expected(isa)), static_cast<int>(ActiveIsa()));
  }
  setenv("SPLITKV_CPU_ISA", "", 1);
  EXPECT_EQ(static_cast<int>(BestSupportedIsa()), static_cast<int>(ActiveIsa()));
  setenv("SPLITKV_CPU_ISA", "sse9", 1);
  EXPECT_THROWS(std::invalid_argument, ActiveIsa(), "SPLITKV_CPU_ISA invalid", "baseline, avx2 or avx512",
                "got 'sse9'");
  if (had) {
    setenv("SPLITKV_CPU_ISA", restore.c_str(), 1);
  } else {
    unsetenv("SPLITKV_CPU_ISA");
  }
}

}  // namespace

int main() { return splitkv_test::RunAllTests(); }
