#pragma once
// detail::WorkerPool: a fixed set of threads that run the iterations of one parallel loop at a time, the
// calling thread included. The CPU backend splits matrix products and attention heads over it.
//
// parallel_for(n, f) calls f(i) once for every i in [0, n) and returns when all calls have returned; the
// first exception a call throws is rethrown in the caller after the loop (the other iterations still run).
// One loop runs on the pool at a time: a parallel_for issued while another is running (from another thread,
// or from inside f) runs serially in its caller instead of waiting, so nested and concurrent use are safe.

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>
#include <utility>
#include <vector>

namespace kvfuse::detail {

class WorkerPool {
 public:
  // `threads` workers in all, the caller of parallel_for counted: threads - 1 are started (none for 1).
  explicit WorkerPool(int threads) {
    const int extra = std::max(threads, 1) - 1;
    workers_.reserve(static_cast<std::size_t>(extra));
    for (int t = 0; t < extra; ++t) workers_.emplace_back([this] { work(); });
  }

  WorkerPool(const WorkerPool&) = delete;
  WorkerPool& operator=(const WorkerPool&) = delete;

  ~WorkerPool() {
    {
      std::lock_guard lock(m_);
      stop_ = true;
    }
    wake_.notify_all();
    for (std::thread& t : workers_) t.join();
  }

  // Threads a loop runs on, the caller included.
  [[nodiscard]] int size() const noexcept { return static_cast<int>(workers_.size()) + 1; }

  template <class F>
  void parallel_for(std::int64_t n, F&& f) {
    if (n <= 0) return;
    std::unique_lock busy(dispatch_, std::try_to_lock);
    if (n == 1 || workers_.empty() || !busy.owns_lock()) {
      for (std::int64_t i = 0; i < n; ++i) f(i);
      return;
    }
    {
      std::lock_guard lock(m_);
      job_ = std::function<void(std::int64_t)>(std::ref(f));
      n_ = n;
      next_.store(0);
      running_ = static_cast<int>(workers_.size());
      error_ = nullptr;
      ++generation_;
    }
    wake_.notify_all();
    drain();
    std::unique_lock lock(m_);
    done_.wait(lock, [this] { return running_ == 0; });
    job_ = nullptr;
    if (error_) std::rethrow_exception(std::exchange(error_, nullptr));
  }

 private:
  // Runs iterations of the current job until none are left.
  void drain() {
    for (std::int64_t i = next_.fetch_add(1); i < n_; i = next_.fetch_add(1)) {
      try {
        job_(i);
      } catch (...) {
        std::lock_guard lock(m_);
        if (!error_) error_ = std::current_exception();
      }
    }
  }

  void work() {
    std::uint64_t seen = 0;
    for (;;) {
      {
        std::unique_lock lock(m_);
        wake_.wait(lock, [&] { return stop_ || generation_ != seen; });
        if (stop_) return;
        seen = generation_;
      }
      drain();
      {
        std::lock_guard lock(m_);
        --running_;
      }
      done_.notify_one();
    }
  }

  std::vector<std::thread> workers_;
  std::mutex dispatch_;  // held by the loop that owns the pool
  std::mutex m_;
  std::condition_variable wake_;
  std::condition_variable done_;
  std::function<void(std::int64_t)> job_;
  std::int64_t n_ = 0;
  std::atomic<std::int64_t> next_{0};
  int running_ = 0;
  std::uint64_t generation_ = 0;
  bool stop_ = false;
  std::exception_ptr error_;
};

}  // namespace kvfuse::detail
