#include "cc/splitkv/cpu/thread_pool.h"

#include <cstdlib>
#include <string>

namespace splitkv::cpu {

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
  static ThreadPool* pool = [] {
    int threads = static_cast<int>(std::thread::hardware_concurrency());
    if (const char* env = std::getenv("SPLITKV_NUM_THREADS")) {
      const int requested = std::atoi(env);
      if (requested > 0) threads = requested;
    }
    return new ThreadPool(threads);  // never destroyed: workers may outlive static teardown
  }();
  return *pool;
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
