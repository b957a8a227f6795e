#include "cc/splitkv/cpu/thread_pool.h"

#include <pthread.h>

#include <cerrno>
#include <cstdlib>
#include <string>
#include <system_error>
#include <thread>

#include "cc/splitkv/errors.h"

namespace splitkv::cpu {

namespace {

constexpr long kMaxEnvThreads = 1024;

// SPLITKV_NUM_THREADS: a decimal int in [1, kMaxEnvThreads]; unset or empty: the hardware's
// count. Anything else is refused (it was read with atoi: "abc" and "-1" fell back silently,
// "2.5" gave 2, "100000" failed each call to start its threads, naming nothing).
int PoolThreads() {
  const int hardware = static_cast<int>(std::thread::hardware_concurrency());
  const char* env = std::getenv("SPLITKV_NUM_THREADS");
  if (env == nullptr || *env == '\0') return hardware;
  char* end = nullptr;
  errno = 0;
  const long value = std::strtol(env, &end, 10);
  // strtol also takes leading spaces and a sign: only digits are an int here.
  if (*env < '0' || *env > '9' || errno != 0 || *end != '\0' || value < 1 || value > kMaxEnvThreads) {
    throw InvalidArgument("splitkv cpu: SPLITKV_NUM_THREADS invalid: expected an int in [1, " +
                          std::to_string(kMaxEnvThreads) + "] (or unset), got '" + std::string(env) + "'");
  }
  return static_cast<int>(value);
}

// The process-wide pool, made at the first call (Global). Never destroyed: workers may
// outlive static teardown.
std::mutex global_mutex;
ThreadPool* global_pool = nullptr;

}  // namespace

// The fork handlers are registered when this library is loaded, never under global_mutex: a
// fork() by another thread while Global() held global_mutex to register them (at the first
// call) left the child that mutex locked by a thread it does not have (its first call hung).
// pthread_atfork's error, if any, is reported by Global() (nothing can throw here).
const int ThreadPool::fork_handlers_ = pthread_atfork(PrepareFork, AfterForkInParent, AfterForkInChild);

ThreadPool::ThreadPool(int num_threads) : num_threads_(num_threads < 1 ? 1 : num_threads) {
  try {
    for (int i = 1; i < num_threads_; ++i) workers_.emplace_back([this] { WorkerLoop(); });
  } catch (...) {
    // A thread could not start (a pids limit, say): stop the ones that did, then report.
    Stop();
    throw;
  }
}

ThreadPool::~ThreadPool() { Stop(); }

void ThreadPool::Stop() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  work_ready_.notify_all();
  for (auto& worker : workers_) worker.join();
  workers_.clear();
}

ThreadPool& ThreadPool::Global() {
  std::lock_guard<std::mutex> lock(global_mutex);
  if (global_pool == nullptr) {
    if (fork_handlers_ != 0) {
      throw std::system_error(fork_handlers_, std::generic_category(), "splitkv cpu: pthread_atfork");
    }
    // A throw leaves the pool unmade: the next call reads the variable again.
    global_pool = new ThreadPool(PoolThreads());
  }
  return *global_pool;
}

// A fork() child has only the thread that forked. Were another thread's ParallelFor running,
// the child would find call_mutex_ held by a thread it does not have and the tasks handed to
// workers it does not have: every later call there would hang. So the fork waits for the
// running call (the prepare handler takes the call lock), and the child leaves the parent's
// pool behind (leaked: its threads and their state are not the child's) for a new one at its
// first call, which reads SPLITKV_NUM_THREADS again.
void ThreadPool::PrepareFork() {
  global_mutex.lock();
  if (global_pool != nullptr) global_pool->call_mutex_.lock();
}

void ThreadPool::AfterForkInParent() {
  if (global_pool != nullptr) global_pool->call_mutex_.unlock();
  global_mutex.unlock();
}

void ThreadPool::AfterForkInChild() {
  global_pool = nullptr;
  global_mutex.unlock();  // held by this thread since PrepareFork, as in the parent
}

// Takes tasks by index under the lock; a task's own work runs unlocked.
void ThreadPool::RunTasks() {
  std::unique_lock<std::mutex> lock(mutex_);
  while (task_ != nullptr && next_task_ < num_tasks_) {
    const int64_t i = next_task_++;
    const auto* task = task_;
    lock.unlock();
    std::exception_ptr error;
    try {
      (*task)(i);
    } catch (...) {
      error = std::current_exception();
    }
    lock.lock();
    if (error && !error_) error_ = error;
    if (++tasks_done_ == num_tasks_) work_done_.notify_all();
  }
}

void ThreadPool::WorkerLoop() {
  uint64_t seen = 0;
  std::unique_lock<std::mutex> lock(mutex_);
  while (true) {
    work_ready_.wait(lock, [&] { return stopping_ || generation_ != seen; });
    if (stopping_) return;
    seen = generation_;
    lock.unlock();
    RunTasks();
    lock.lock();
  }
}

void ThreadPool::ParallelFor(int64_t num_tasks, const std::function<void(int64_t)>& task) {
  if (num_tasks <= 0) return;
  std::lock_guard<std::mutex> call_lock(call_mutex_);
  {
    std::lock_guard<std::mutex> lock(mutex_);
    task_ = &task;
    num_tasks_ = num_tasks;
    next_task_ = 0;
    tasks_done_ = 0;
    error_ = nullptr;
    ++generation_;
  }
  if (num_tasks > 1) work_ready_.notify_all();
  RunTasks();
  std::exception_ptr error;
  {
    std::unique_lock<std::mutex> lock(mutex_);
    work_done_.wait(lock, [&] { return tasks_done_ == num_tasks_; });
    task_ = nullptr;
    error = error_;
  }
  if (error) std::rethrow_exception(error);
}

}  // namespace splitkv::cpu
