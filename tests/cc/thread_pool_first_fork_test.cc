// A fork() by one thread while another makes the process's first ThreadPool::Global() call.
// Before, Global() registered the fork handlers at that first call, under its mutex: a fork
// in that window (before the registration returned) ran no handler, and the child inherited
// the mutex locked by a thread it does not have, so its first call hung. Its own binary: the
// process must not have made the pool before the trial. Not under TSAN (it ends such children).
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <thread>

#include "cc/splitkv/cpu/thread_pool.h"
#include "tests/cc/test_check.h"

#if defined(__GLIBC__) && !SPLITKV_TEST_ASAN && !SPLITKV_TEST_TSAN
#include <dlfcn.h>
// pthread_atfork (libc_nonshared) calls this: widen the registration so that the fork below
// lands inside it whenever the registration runs at the first call (deterministic). Not
// under the sanitizers, whose runtimes register fork handlers of their own.
extern "C" int __register_atfork(void (*prepare)(), void (*parent)(), void (*child)(), void* dso) {
  using Real = int (*)(void (*)(), void (*)(), void (*)(), void*);
  static Real real = reinterpret_cast<Real>(dlsym(RTLD_NEXT, "__register_atfork"));
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  return real(prepare, parent, child, dso);
}
#endif

namespace {

using splitkv::cpu::ThreadPool;

#if !SPLITKV_TEST_TSAN
TEST(ForkDuringTheFirstCallLeavesTheChildAWorkingPool) {
  std::thread first([] { ThreadPool::Global(); });
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  const pid_t pid = fork();
  if (pid == 0) {
    alarm(20);  // a hang ends the child with SIGALRM, which the parent reports
    std::atomic<int> ran{0};
    ThreadPool::Global().ParallelFor(8, [&](int64_t) { ran.fetch_add(1); });
    _exit(ran.load() == 8 ? 0 : 1);
  }
  first.join();
  EXPECT_TRUE(pid > 0);
  int status = 0;
  EXPECT_EQ(pid, waitpid(pid, &status, 0));
  EXPECT_TRUE(WIFEXITED(status));
  EXPECT_EQ(0, WEXITSTATUS(status));
}
#endif

}  // namespace

int main() { return splitkv_test::RunAllTests(); }
