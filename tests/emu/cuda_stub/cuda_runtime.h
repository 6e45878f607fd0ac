#pragma once
// Stub of cuda_runtime.h for the CPU emulation of kvfuse's kernels (tests/emu/README.md). Device code is
// compiled as host C++ (__global__, __device__ ... expand to nothing) and a launch runs the grid block by
// block on the calling thread:
//  - emu::launch_serial: each CUDA thread of a block runs to completion in turn (kernels without barriers
//    or warp-collective operations; a barrier aborts with a message);
//  - emu::launch: every CUDA thread of a block is a fiber with its own stack (started with ucontext,
//    switched with _setjmp / _longjmp); __syncthreads and warp-collective operations (emu::warp_exchange)
//    are barriers at which a fiber yields. The scheduler always resumes the lowest-numbered runnable
//    thread, so warp 0 runs as far ahead of the others as the barriers allow (a missing barrier shows up
//    as a read of data not yet written, or already overwritten). With emu::concurrent_blocks_max set, a
//    grid of up to that many blocks runs all its blocks at once, resuming a random runnable thread.
//    A barrier nobody can complete (a thread exited, or diverging barriers) aborts with a message.
//  - cp.async: emu::cp_async queues a copy in the issuing thread's open group; cp_async_wait(n) lands all
//    but the n most recent committed groups. emu::eager_copies lands each copy when issued instead.
// Dynamic shared memory (emu::dynamic_smem) and static shared memory that the transform turned into
// emu::block_shared are filled with 0xFF bytes (NaN) before each block.
// Blocks run in the order emu::block_order says (forward by default; reversed, or shuffled by
// emu::block_order_rng), so a kernel that relies on the order blocks start or finish in (e.g. a last-block
// ticket that assumes the highest blockIdx finishes last) is exposed. Atomics are plain read-modify-writes
// (one OS thread runs every CUDA thread and a fiber only yields at a barrier), __threadfence is a no-op.
#include <setjmp.h>
#include <ucontext.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <algorithm>
#include <deque>
#include <map>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "cuda_runtime_api.h"

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __launch_bounds__(...)
#define __shared__ static
#define __align__(n) alignas(n)

struct uint3 {
  unsigned x, y, z;
};
struct alignas(16) uint4 {  // CUDA's uint4 is 16-byte aligned too
  unsigned x, y, z, w;
};
struct float2 {
  float x, y;
};
inline uint4 make_uint4(unsigned x, unsigned y, unsigned z, unsigned w) { return {x, y, z, w}; }
inline float2 make_float2(float x, float y) { return {x, y}; }
inline float __uint_as_float(unsigned u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
inline unsigned __float_as_uint(float f) {
  unsigned u;
  std::memcpy(&u, &f, 4);
  return u;
}
inline int min(int a, int b) { return a < b ? a : b; }
inline int max(int a, int b) { return a > b ? a : b; }
inline unsigned min(unsigned a, unsigned b) { return a < b ? a : b; }
inline unsigned max(unsigned a, unsigned b) { return a > b ? a : b; }
inline long long min(long long a, long long b) { return a < b ? a : b; }
inline long long max(long long a, long long b) { return a > b ? a : b; }

// The running thread's indices (one OS thread runs every CUDA thread: plain globals, set on each switch).
inline uint3 threadIdx{0, 0, 0};
inline uint3 blockIdx{0, 0, 0};
inline dim3 blockDim;
inline dim3 gridDim;

// glibc's plain _longjmp, bypassing the _FORTIFY_SOURCE redirect to __longjmp_chk (which refuses to jump
// to another stack): a fiber switch is _setjmp on one stack, _longjmp to the other (no signal-mask
// syscall, unlike swapcontext; ucontext only starts a fiber on its stack).
extern "C" [[noreturn]] void emu_longjmp(jmp_buf env, int value) noexcept __asm__("_longjmp");

namespace emu {

inline const char* label = "";  // what the test is running, for fail()

[[noreturn]] inline void fail(const char* what) {
  std::fprintf(stderr, "emu: %s: %s (block %u,%u,%u, thread %u)\n", label, what, blockIdx.x, blockIdx.y, blockIdx.z,
               threadIdx.x);
  std::abort();
}

inline bool eager_copies = false;  // cp.async lands when issued instead of at cp_async_wait
inline long long launches = 0;     // kernel launches so far
inline long long emulated_threads = 0;
inline std::map<std::string, long long> launches_by_kernel;  // by the kernel expression of the launch
inline unsigned long long block_serial = 0;  // serial number of the running block (blocks numbered from 1)
inline unsigned long long launch_first_serial = 0;  // of the current launch's first block

enum class BlockOrder { forward, reversed, shuffled };
inline BlockOrder block_order = BlockOrder::forward;
inline std::mt19937_64 block_order_rng{1};  // also picks the next fiber when blocks run concurrently
// Fiber launches of at most this many blocks (and more than one) run every block at once: the fibers of all
// blocks interleave, the scheduler resuming a random runnable one, so a race between blocks (a block that
// announces it is done before all of its threads are) can show. 0: blocks one after another.
inline unsigned concurrent_blocks_max = 0;

// Static __shared__ T of the running block (transform_kernel.py turns `__shared__ T name;` into
// `auto& name = emu::block_shared<T, __LINE__>();`): poisoned with 0xFF bytes when a block first asks for it;
// blocks of earlier launches are forgotten.
template <class T, int Id>
T& block_shared() {
  static std::map<unsigned long long, std::unique_ptr<unsigned char[]>> per_block;
  per_block.erase(per_block.begin(), per_block.lower_bound(launch_first_serial));
  std::unique_ptr<unsigned char[]>& storage = per_block[block_serial];
  if (!storage) {
    storage.reset(new unsigned char[sizeof(T)]);  // operator new[]: aligned for any fundamental type
    std::memset(storage.get(), 0xFF, sizeof(T));
  }
  return *reinterpret_cast<T*>(storage.get());
}

struct Copy {
  void* dst;
  const void* src;
  int bytes;
  bool valid;  // false: zero-fill dst
};
inline void land(const Copy& c) {
  if (c.valid)
    std::memcpy(c.dst, c.src, static_cast<std::size_t>(c.bytes));
  else
    std::memset(c.dst, 0, static_cast<std::size_t>(c.bytes));
}

struct Barrier {
  unsigned generation = 0;
  int arrived = 0;
};

struct Fiber {
  ucontext_t start;  // entry context (makecontext), used once
  jmp_buf resume;    // where a yielded fiber continues
  bool started = false;
  std::unique_ptr<char[]> stack;
  std::size_t block = 0;  // index into Runtime::blocks
  unsigned thread = 0;
  bool done = false;
  const Barrier* waiting = nullptr;  // blocked until waiting->generation != wait_generation
  unsigned wait_generation = 0;
  unsigned exchange_phase = 0;  // warp_exchange calls so far (picks the exchange buffer)
  std::vector<Copy> open_group;
  std::deque<std::vector<Copy>> groups;
};

inline constexpr int exchange_words = 8;
struct Warp {
  Barrier barrier;
  std::uint64_t slots[2][32][exchange_words];
};

// A resident block: its index, barrier, warps and dynamic shared memory.
struct Block {
  uint3 index{0, 0, 0};
  unsigned long long serial = 0;
  Barrier barrier;
  std::vector<Warp> warps;
  std::vector<unsigned char> smem;
};

struct Runtime {
  static constexpr std::size_t stack_bytes = 256 * 1024;
  bool fibers = false;  // inside emu::launch (else serial)
  int threads = 0;
  int current = 0;
  jmp_buf scheduler;
  std::vector<Fiber> fiber;
  std::vector<Block> blocks;  // resident blocks (one unless concurrent); not resized while they run
  Block* block = nullptr;     // the running block
  void (*body)(void*) = nullptr;
  void* body_arg = nullptr;
};
inline Runtime rt;

inline unsigned char* dynamic_smem() { return rt.block->smem.data(); }

inline Fiber& fiber() {
  if (!rt.fibers) fail("a barrier, warp-collective operation or cp.async in a kernel launched with emu::launch_serial");
  return rt.fiber[static_cast<std::size_t>(rt.current)];
}

// Arrives at `b`, which completes when `expected` threads have arrived; yields until then.
inline void arrive_and_wait(Barrier& b, int expected) {
  Fiber& f = fiber();
  const unsigned generation = b.generation;
  if (++b.arrived == expected) {
    b.arrived = 0;
    ++b.generation;
    return;
  }
  f.waiting = &b;
  f.wait_generation = generation;
  if (_setjmp(f.resume) == 0) emu_longjmp(rt.scheduler, 1);
  f.waiting = nullptr;
}

inline int lane() { return static_cast<int>(threadIdx.x % 32); }

// Warp-collective exchange: every lane of the warp publishes `count` words; returns all 32 lanes' words
// once the whole warp has arrived. Two alternating buffers: a lane cannot reach the call after next before
// every lane has finished reading this one.
inline const std::uint64_t (*warp_exchange(const std::uint64_t* words, int count))[exchange_words] {
  Fiber& f = fiber();
  Warp& w = rt.block->warps[threadIdx.x / 32];
  auto& slot = w.slots[f.exchange_phase++ % 2];
  std::memcpy(slot[lane()], words, static_cast<std::size_t>(count) * sizeof(std::uint64_t));
  arrive_and_wait(w.barrier, 32);
  return slot;
}

// Fails unless [p, p + bytes) lies in this block's dynamic shared memory, aligned to `align` bytes.
inline void check_shared(const void* p, int bytes, int align, const char* what) {
  const auto* c = static_cast<const unsigned char*>(p);
  const std::vector<unsigned char>& smem = rt.block->smem;
  if (c < smem.data() || c + bytes > smem.data() + smem.size()) fail(what);
  if (reinterpret_cast<std::uintptr_t>(p) % static_cast<std::uintptr_t>(align) != 0) fail(what);
}

inline void cp_async(void* dst, const void* src, int bytes, bool valid) {
  Fiber& f = fiber();
  check_shared(dst, bytes, bytes, "cp.async destination outside dynamic shared memory or misaligned");
  if (valid && reinterpret_cast<std::uintptr_t>(src) % static_cast<std::uintptr_t>(bytes) != 0)
    fail("cp.async source misaligned");
  if (eager_copies)
    land({dst, src, bytes, valid});
  else
    f.open_group.push_back({dst, src, bytes, valid});
}
inline void cp_async_commit() {
  Fiber& f = fiber();
  f.groups.push_back(std::move(f.open_group));
  f.open_group.clear();
}
inline void cp_async_wait(int pending) {
  Fiber& f = fiber();
  while (f.groups.size() > static_cast<std::size_t>(pending)) {
    for (const Copy& c : f.groups.front()) land(c);
    f.groups.pop_front();
  }
}

inline void fiber_entry() {
  rt.body(rt.body_arg);
  rt.fiber[static_cast<std::size_t>(rt.current)].done = true;
  emu_longjmp(rt.scheduler, 1);
}

// Makes `b` the running block.
inline void enter(Block& b) {
  rt.block = &b;
  blockIdx = b.index;
  block_serial = b.serial;
}

// Runs every thread of every resident block as a fiber until all are done. One block: the lowest-numbered
// runnable thread goes next; several: a random runnable one.
inline void run_fibers() {
  const auto per_block = static_cast<std::size_t>(rt.threads);
  const std::size_t n = per_block * rt.blocks.size();
  if (rt.fiber.size() < n) rt.fiber.resize(n);
  for (Block& b : rt.blocks) {
    b.warps.assign((per_block + 31) / 32, Warp{});
    b.barrier = Barrier{};
  }
  for (std::size_t i = 0; i < n; ++i) {
    Fiber& f = rt.fiber[i];
    if (!f.stack) f.stack.reset(new char[Runtime::stack_bytes]);
    f.block = i / per_block;
    f.thread = static_cast<unsigned>(i % per_block);
    f.done = false;
    f.waiting = nullptr;
    f.exchange_phase = 0;
    f.open_group.clear();
    f.groups.clear();
    f.started = false;
    getcontext(&f.start);
    f.start.uc_stack.ss_sp = f.stack.get();
    f.start.uc_stack.ss_size = Runtime::stack_bytes;
    f.start.uc_link = nullptr;
    makecontext(&f.start, fiber_entry, 0);
  }
  const bool concurrent = rt.blocks.size() > 1;
  const auto runnable = [](const Fiber& f) {
    return !f.done && (f.waiting == nullptr || f.waiting->generation != f.wait_generation);
  };
  for (;;) {
    int next = -1;
    bool live = false;
    const std::size_t first = concurrent ? static_cast<std::size_t>(block_order_rng() % n) : 0;
    for (std::size_t j = 0; j < n; ++j) {
      const std::size_t i = first + j < n ? first + j : first + j - n;
      const Fiber& f = rt.fiber[i];
      if (f.done) continue;
      live = true;
      if (runnable(f)) {
        next = static_cast<int>(i);
        break;
      }
    }
    if (!live) break;
    if (next < 0) {
      int finished = 0, at_syncthreads = 0, at_warp = 0;
      for (std::size_t i = 0; i < n; ++i) {
        const Fiber& f = rt.fiber[i];
        const bool at_block_barrier = f.waiting == &rt.blocks[f.block].barrier;
        finished += f.done ? 1 : 0;
        at_syncthreads += !f.done && at_block_barrier ? 1 : 0;
        at_warp += !f.done && !at_block_barrier ? 1 : 0;
      }
      char what[200];
      std::snprintf(what, sizeof what,
                    "deadlock: no thread can go on (%d finished, %d wait at __syncthreads, %d at a warp-collective "
                    "operation that other lanes of their warp do not reach)",
                    finished, at_syncthreads, at_warp);
      threadIdx = {0, 0, 0};
      fail(what);
    }
    rt.current = next;
    Fiber& f = rt.fiber[static_cast<std::size_t>(next)];
    enter(rt.blocks[f.block]);
    threadIdx = {f.thread, 0, 0};
    if (_setjmp(rt.scheduler) == 0) {
      if (f.started) emu_longjmp(f.resume, 1);
      f.started = true;
      setcontext(&f.start);
    }
  }
}

template <class Kernel, class... Args>
void launch_grid(const char* name, bool fibers, Kernel kernel, dim3 grid, int threads, int smem_bytes,
                 const Args&... args) {
  ++launches;
  ++launches_by_kernel[name];
  gridDim = grid;
  blockDim = dim3(static_cast<unsigned>(threads));
  rt.fibers = fibers;
  rt.threads = threads;
  auto call = [&] { kernel(args...); };
  rt.body = [](void* c) { (*static_cast<decltype(call)*>(c))(); };
  rt.body_arg = &call;
  std::vector<unsigned long long> order(static_cast<std::size_t>(grid.x) * grid.y * grid.z);
  std::iota(order.begin(), order.end(), 0ull);
  if (block_order == BlockOrder::reversed) std::reverse(order.begin(), order.end());
  if (block_order == BlockOrder::shuffled) std::shuffle(order.begin(), order.end(), block_order_rng);
  launch_first_serial = block_serial + 1;
  const auto make_block = [&](unsigned long long linear) {
    Block b;
    b.index = {static_cast<unsigned>(linear % grid.x), static_cast<unsigned>(linear / grid.x % grid.y),
               static_cast<unsigned>(linear / grid.x / grid.y)};
    b.serial = ++block_serial;
    b.smem.assign(static_cast<std::size_t>(smem_bytes), 0xFF);
    emulated_threads += threads;
    return b;
  };
  if (fibers && order.size() > 1 && order.size() <= concurrent_blocks_max) {
    rt.blocks.clear();
    for (const unsigned long long linear : order) rt.blocks.push_back(make_block(linear));
    run_fibers();
    rt.fibers = false;
    return;
  }
  for (const unsigned long long linear : order) {
    rt.blocks.assign(1, make_block(linear));
    enter(rt.blocks[0]);
    if (fibers) {
      run_fibers();
    } else {
      for (int t = 0; t < threads; ++t) {
        threadIdx = {static_cast<unsigned>(t), 0, 0};
        call();
      }
    }
  }
  rt.fibers = false;
}

// kernel<<<grid, threads, smem_bytes, stream>>>(args...), what the transform (transform_kernel.py) writes:
// `name` is the kernel expression, `kernel` a lambda calling it.
template <class Kernel, class... Args>
void launch(const char* name, Kernel kernel, dim3 grid, int threads, int smem_bytes, cudaStream_t,
            const Args&... args) {
  launch_grid(name, true, kernel, grid, threads, smem_bytes, args...);
}
template <class Kernel, class... Args>
void launch_serial(const char* name, Kernel kernel, dim3 grid, int threads, int smem_bytes, cudaStream_t,
                   const Args&... args) {
  launch_grid(name, false, kernel, grid, threads, smem_bytes, args...);
}

}  // namespace emu

inline void __syncthreads() { emu::arrive_and_wait(emu::rt.block->barrier, emu::rt.threads); }

template <class V>
V __shfl_xor_sync(unsigned, V v, int lane_mask) {
  static_assert(sizeof(V) <= sizeof(std::uint64_t));
  std::uint64_t word = 0;
  std::memcpy(&word, &v, sizeof(V));
  const auto all = emu::warp_exchange(&word, 1);
  V r;
  std::memcpy(&r, &all[emu::lane() ^ lane_mask][0], sizeof(V));
  return r;
}

inline float atomicAdd(float* p, float v) {
  const float old = *p;
  *p = old + v;
  return old;
}
inline unsigned atomicAdd(unsigned* p, unsigned v) {
  const unsigned old = *p;
  *p = old + v;
  return old;
}
inline void __threadfence() {}
template <class T>
T __ldg(const T* p) {
  return *p;
}
template <class T>
T __ldcg(const T* p) {
  return *p;
}
