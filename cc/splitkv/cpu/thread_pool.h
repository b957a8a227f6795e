// A fixed pool of worker threads for the CPU backend: the CPU's stand-in for a GPU grid.
#ifndef SPLITKV_CPU_THREAD_POOL_H_
#define SPLITKV_CPU_THREAD_POOL_H_

#include <condition_variable>
#include <cstdint>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace splitkv::cpu {

class ThreadPool {
 public:
  // num_threads workers in all, the calling thread included (so num_threads - 1 are started).
  explicit ThreadPool(int num_threads);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  // The process-wide pool: SPLITKV_NUM_THREADS threads if set, else the hardware's count.
  // A fork() waits for a ParallelFor running on another thread, and the child makes a pool
  // of its own at its first call (it has none of the parent's worker threads).
  static ThreadPool& Global();

  int num_threads() const { return num_threads_; }

  // Runs task(i) for every i in [0, num_tasks) across the pool and the caller, in any
  // order, and returns when all are done. The first exception a task throws is rethrown
  // here (the other tasks still run). Calls from several threads are serialised.
  void ParallelFor(int64_t num_tasks, const std::function<void(int64_t)>& task);

 private:
  void WorkerLoop();
  void RunTasks();
  void Stop();  // wakes every worker to exit, and joins them
  // pthread_atfork's handlers for the global pool (thread_pool.cc).
  static void PrepareFork();
  static void AfterForkInParent();
  static void AfterForkInChild();
  static const int fork_handlers_;  // pthread_atfork's result, at load time (thread_pool.cc)

  const int num_threads_;
  std::vector<std::thread> workers_;
  std::mutex call_mutex_;  // one ParallelFor at a time

  std::mutex mutex_;
  std::condition_variable work_ready_;
  std::condition_variable work_done_;
  const std::function<void(int64_t)>* task_ = nullptr;
  int64_t num_tasks_ = 0;
  int64_t next_task_ = 0;
  int64_t tasks_done_ = 0;
  uint64_t generation_ = 0;
  bool stopping_ = false;
  std::exception_ptr error_;
};

}  // namespace splitkv::cpu

#endif  // SPLITKV_CPU_THREAD_POOL_H_
