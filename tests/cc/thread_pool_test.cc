// The CPU backend's thread pool: every task index runs exactly once, tasks really run in
// parallel, a task's exception reaches the caller after the rest ran, concurrent callers
// are serialised safely, SPLITKV_NUM_THREADS sizes the global pool, and a fork() during a
// call leaves the child a pool that works. Run under TSAN too.
#include "cc/splitkv/cpu/thread_pool.h"

#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "tests/cc/test_check.h"

namespace {

using splitkv::cpu::ThreadPool;

// Runs ParallelFor(n) and returns how many indices did not run exactly once.
int64_t WrongCounts(ThreadPool& pool, int64_t n) {
  std::vector<std::atomic<int>> hits(n);
  pool.ParallelFor(n, [&](int64_t i) { hits[i].fetch_add(1, std::memory_order_relaxed); });
  int64_t wrong = 0;
  for (auto& h : hits) wrong += h.load() != 1;
  return wrong;
}

TEST(EveryIndexRunsOnce) {
  for (int threads : {1, 2, 4}) {
    ThreadPool pool(threads);
    EXPECT_EQ(threads, pool.num_threads());
    for (int64_t n : {0, 1, 2, 3, 7, 100, 10000}) EXPECT_EQ(int64_t{0}, WrongCounts(pool, n));
  }
  ThreadPool clamped(0);
  EXPECT_EQ(1, clamped.num_threads());
  EXPECT_EQ(int64_t{0}, WrongCounts(clamped, 5));
}

TEST(TasksRunInParallel) {
  // Two tasks that each wait (up to 10 s) for the other to start: only parallel workers finish quickly.
  ThreadPool pool(2);
  std::atomic<int> started{0};
  std::atomic<int> met{0};
  pool.ParallelFor(2, [&](int64_t) {
    started.fetch_add(1);
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (started.load() < 2 && std::chrono::steady_clock::now() < deadline) std::this_thread::yield();
    if (started.load() == 2) met.fetch_add(1);
  });
  EXPECT_EQ(2, met.load());
}

TEST(ExceptionReachesTheCallerAfterTheOtherTasks) {
  ThreadPool pool(3);
  std::atomic<int> ran{0};
  EXPECT_THROWS(std::runtime_error, pool.ParallelFor(50, [&](int64_t i) {
    ran.fetch_add(1);
    if (i == 17) throw std::runtime_error("task 17 failed");
  }), "task 17 failed");
  EXPECT_EQ(50, ran.load());
  // The pool still works afterwards, without the old error.
  EXPECT_EQ(int64_t{0}, WrongCounts(pool, 64));
}

TEST(ConcurrentCallersAreSerialised) {
  ThreadPool pool(3);
  constexpr int kCallers = 3, kCalls = 30;
  std::vector<int64_t> wrong(kCallers, 0);
  std::vector<std::thread> callers;
  for (int c = 0; c < kCallers; ++c) {
    callers.emplace_back([&, c] {
      for (int k = 0; k < kCalls; ++k) wrong[c] += WrongCounts(pool, 1 + (k * 37 + c) % 200);
    });
  }
  for (auto& t : callers) t.join();
  for (int c = 0; c < kCallers; ++c) EXPECT_EQ(int64_t{0}, wrong[c]);
}

TEST(ManyShortCallsInARow) {
  // Workers woken for one call may arrive during the next: each call must still see its own tasks.
  ThreadPool pool(4);
  int64_t wrong = 0;
  for (int k = 0; k < 2000; ++k) wrong += WrongCounts(pool, 1 + k % 5);
  EXPECT_EQ(int64_t{0}, wrong);
}

TEST(GlobalPoolSizeComesFromTheEnvironment) {
  EXPECT_EQ(3, ThreadPool::Global().num_threads());
  EXPECT_TRUE(&ThreadPool::Global() == &ThreadPool::Global());
}

#if !SPLITKV_TEST_TSAN  // TSAN ends a child of a multi-threaded process that starts threads
TEST(ForkDuringACallLeavesTheChildAWorkingPool) {
  // Another thread's call is inside the global pool when this thread forks. The child has
  // neither that thread nor the pool's workers: before, its first call waited forever on the
  // call lock the other thread held. The fork now waits for that call to end, and the child
  // makes a pool of its own.
  ThreadPool& pool = ThreadPool::Global();
  std::atomic<int> started{0}, finished{0};
  std::thread caller([&] {
    pool.ParallelFor(3, [&](int64_t) {
      started.fetch_add(1);
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
      finished.fetch_add(1);
    });
  });
  while (started.load() == 0) std::this_thread::yield();
  const pid_t pid = fork();
  if (pid == 0) {
    alarm(20);  // a hang ends the child with SIGALRM, which the parent reports
    ThreadPool& own = ThreadPool::Global();
    const bool ok = own.num_threads() == 3 && WrongCounts(own, 1000) == 0 && WrongCounts(own, 7) == 0;
    _exit(ok ? 0 : 1);
  }
  EXPECT_TRUE(pid > 0);
  EXPECT_EQ(3, finished.load());  // the fork waited for the running call
  caller.join();
  int status = 0;
  EXPECT_EQ(pid, waitpid(pid, &status, 0));
  EXPECT_TRUE(WIFEXITED(status));
  EXPECT_EQ(0, WEXITSTATUS(status));
  EXPECT_EQ(int64_t{0}, WrongCounts(pool, 100));  // the parent's pool is untouched
}
#endif

}  // namespace

int main() {
  setenv("SPLITKV_NUM_THREADS", "3", /*overwrite=*/1);
  return splitkv_test::RunAllTests();
}
