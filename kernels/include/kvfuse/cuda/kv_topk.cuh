#pragma once
// CUDA KV deviation and deterministic top-k (CacheBlend section 4.1 "KV deviation", section 4.3 HKVD tokens).
//
//   kv_deviation(args, stream)                      dev[t] = sum_h sum_e (recomputed - cached)^2, fp32
//   top_k_tokens(args, workspace, bytes, stream)    the k highest scores (ties -> lower index), ascending
//   top_k_tokens_by_sort(args, workspace, bytes, s) the same set by a full sort: the benchmark baseline
//   hkvd_select(args, workspace, bytes, stream)     S_{l+1} from S_l by the same top-k (gradual filtering)
//
// Arguments, layouts and validation are shared with the CPU references (kvfuse/kernel_args/kv_topk.hpp).
//
// Deviation: one warp per token, 16-byte vector loads when both tensors' pointers, strides and head rows are
// 16-byte aligned (else scalar loads), fp32 sums reduced by a fixed butterfly: deterministic run to run,
// but summed in another order than the CPU reference (relative differences ~1e-6).
//
// Top-k: a radix select over the unique 64-bit keys of detail/topk.hpp (score bits, then the complement of
// the index), so the k largest keys are exactly the wanted set and ties need no extra logic. Six passes of
// 11/11/10 bits; each pass is one kernel: a shared-memory histogram of the digit over the keys that match the
// prefix found so far (grid-stride, merged into global memory with atomics), and the last block to finish
// (atomic ticket) finds the bin of the remaining-th largest key and records the next prefix on the device.
// Once a bin is taken whole the select is done and later passes return at once. A stable compaction
// (cub::DeviceSelect::If over the indices, keeping key >= threshold) writes the indices in ascending order.
// Counts are integers, so the result is the same whatever the scheduling: bit-identical to
// kvfuse::ref::top_k_tokens. Launches: 1 memset + 6 passes + 2 CUB kernels, all on `stream`, no host
// synchronization and no allocation (CUDA-graph capturable); temporary memory comes from `workspace`, at
// least top_k_workspace_bytes(num_items) bytes, 256-byte aligned (cudaMalloc's alignment).
//
// Gradual filtering (CacheBlend section 4.3, HKVDSelector::select on the device): a kernel ranks the entries of
// S_l (detail::hkvd_rank_score: the mandatory rows out of the ranking), the radix select above finds the
// min(keep, |S_l|)-th largest key, a kernel flags the kept entries (detail::hkvd_kept) and a stable
// compaction (cub::DeviceSelect::Flagged) writes their rows, ascending, and the count. Same determinism and
// workspace rules as top_k_tokens (hkvd_select_workspace_bytes).

#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <thrust/iterator/counting_iterator.h>
#include <cstddef>
#include <cstdint>
#include <cub/block/block_scan.cuh>
#include <cub/device/device_radix_sort.cuh>
#include <cub/device/device_select.cuh>

#include "kvfuse/cuda/status.cuh"
#include "kvfuse/detail/topk.hpp"
#include "kvfuse/kernel_args/kv_topk.hpp"

namespace kvfuse::cuda {

namespace impl::topk {

// ---------------------------------------------------------------------------------------------------------
// Deviation

// The two values of a 32-bit word of T (two f16 or bf16), or the one float.
__device__ __forceinline__ float word_deviation(unsigned x, unsigned y, float) {
  const float d = __uint_as_float(x) - __uint_as_float(y);
  return d * d;
}
__device__ __forceinline__ float word_deviation(unsigned x, unsigned y, kvfuse::bf16) {
  const float d0 = __uint_as_float(x << 16) - __uint_as_float(y << 16);
  const float d1 = __uint_as_float(x & 0xFFFF0000u) - __uint_as_float(y & 0xFFFF0000u);
  return d0 * d0 + d1 * d1;
}
__device__ __forceinline__ float word_deviation(unsigned x, unsigned y, kvfuse::f16) {
  const float2 a = __half22float2(__halves2half2(__ushort_as_half(static_cast<unsigned short>(x & 0xFFFFu)),
                                                 __ushort_as_half(static_cast<unsigned short>(x >> 16))));
  const float2 b = __half22float2(__halves2half2(__ushort_as_half(static_cast<unsigned short>(y & 0xFFFFu)),
                                                 __ushort_as_half(static_cast<unsigned short>(y >> 16))));
  const float d0 = a.x - b.x;
  const float d1 = a.y - b.y;
  return d0 * d0 + d1 * d1;
}

inline constexpr int deviation_threads = 256;

// One warp per token (grid-stride over tokens). Vectorized: head_dim * sizeof(T) is a multiple of 16 and
// every row start is 16-byte aligned (checked by the launcher).
template <class T, bool Vectorized>
__global__ void __launch_bounds__(deviation_threads) kv_deviation_kernel(kvfuse::KVDeviationArgs a) {
  const int lane = static_cast<int>(threadIdx.x) & 31;
  const std::int64_t warps = (static_cast<std::int64_t>(gridDim.x) * deviation_threads) / 32;
  const auto* recomputed = static_cast<const T*>(a.recomputed);
  const auto* cached = static_cast<const T*>(a.cached);
  for (std::int64_t t = (static_cast<std::int64_t>(blockIdx.x) * deviation_threads + threadIdx.x) / 32;
       t < a.num_tokens; t += warps) {
    const std::int64_t row = a.cached_rows != nullptr ? static_cast<std::int64_t>(a.cached_rows[t]) : t;
    const T* r = recomputed + t * a.recomputed_token_stride;
    const T* c = cached + row * a.cached_token_stride;
    float sum = 0.0f;
    if constexpr (Vectorized) {
      constexpr int per_vec = 16 / static_cast<int>(sizeof(T));
      const int vecs_per_head = static_cast<int>(a.head_dim) / per_vec;
      const int total = static_cast<int>(a.num_heads) * vecs_per_head;
      for (int j = lane; j < total; j += 32) {
        const int h = j / vecs_per_head;
        const int v = j - h * vecs_per_head;
        const uint4 x = __ldg(reinterpret_cast<const uint4*>(r + h * a.recomputed_head_stride) + v);
        const uint4 y = __ldg(reinterpret_cast<const uint4*>(c + h * a.cached_head_stride) + v);
        sum += word_deviation(x.x, y.x, T{}) + word_deviation(x.y, y.y, T{}) + word_deviation(x.z, y.z, T{}) +
               word_deviation(x.w, y.w, T{});
      }
    } else {
      const int dim = static_cast<int>(a.head_dim);
      const int total = static_cast<int>(a.num_heads) * dim;
      for (int j = lane; j < total; j += 32) {
        const int h = j / dim;
        const int e = j - h * dim;
        const float d = kvfuse::to_float(r[h * a.recomputed_head_stride + e]) - kvfuse::to_float(c[h * a.cached_head_stride + e]);
        sum += d * d;
      }
    }
    for (int offset = 16; offset > 0; offset /= 2) sum += __shfl_xor_sync(0xFFFFFFFFu, sum, offset);
    if (lane == 0) a.deviation[t] = sum;
  }
}

inline bool aligned16(const void* p) { return (reinterpret_cast<std::uintptr_t>(p) & 15u) == 0; }

template <class T>
Status launch_kv_deviation(const kvfuse::KVDeviationArgs& a, cudaStream_t stream) noexcept {
  const std::int64_t bytes = static_cast<std::int64_t>(sizeof(T));
  const bool vectorized = aligned16(a.recomputed) && aligned16(a.cached) && (a.head_dim * bytes) % 16 == 0 &&
                          (a.recomputed_token_stride * bytes) % 16 == 0 &&
                          (a.recomputed_head_stride * bytes) % 16 == 0 && (a.cached_token_stride * bytes) % 16 == 0 &&
                          (a.cached_head_stride * bytes) % 16 == 0;
  constexpr std::int64_t tokens_per_block = deviation_threads / 32;
  const std::int64_t wanted = (a.num_tokens + tokens_per_block - 1) / tokens_per_block;
  const auto blocks = static_cast<unsigned>(wanted < (1 << 20) ? wanted : (1 << 20));
  if (vectorized) {
    kv_deviation_kernel<T, true><<<blocks, deviation_threads, 0, stream>>>(a);
  } else {
    kv_deviation_kernel<T, false><<<blocks, deviation_threads, 0, stream>>>(a);
  }
  return launch_status("kv_deviation_kernel");
}

// ---------------------------------------------------------------------------------------------------------
// Radix select

// Device state of one select, at the start of the workspace (zeroed by the launcher). Pass p reads prefix[p]
// and remaining[p] (pass 0: 0 and k) and its last block writes entry p + 1, so no entry is read and written
// by the same kernel.
struct RadixState {
  unsigned long long prefix[kvfuse::detail::radix_passes + 1];
  unsigned int remaining[kvfuse::detail::radix_passes + 1];
  unsigned int ticket[kvfuse::detail::radix_passes];
  unsigned int done;
  unsigned long long threshold;  // every key >= threshold is selected; valid once done
};

inline constexpr std::size_t workspace_align = 256;
inline constexpr std::size_t round_up(std::size_t x) {
  return (x + workspace_align - 1) / workspace_align * workspace_align;
}
inline constexpr std::size_t state_bytes = round_up(sizeof(RadixState));
inline constexpr std::size_t hist_bytes =
    round_up(sizeof(unsigned) * kvfuse::detail::radix_max_bins * kvfuse::detail::radix_passes);
inline constexpr std::size_t count_bytes = round_up(sizeof(long long));
inline constexpr std::size_t select_header_bytes = state_bytes + hist_bytes + count_bytes;

inline constexpr int radix_threads = 256;
inline constexpr int radix_items_per_thread = 8;
inline constexpr unsigned radix_max_blocks = 1024;

template <int Threads>
__global__ void __launch_bounds__(Threads) radix_pass_kernel(const float* scores, std::int64_t n, unsigned k, int pass,
                                                             RadixState* state, unsigned* hist_all) {
  static_assert((kvfuse::detail::radix_max_bins / 2) % Threads == 0, "every thread owns whole bins of a 10-bit pass");
  using BlockScan = cub::BlockScan<unsigned, Threads>;
  __shared__ unsigned hist[kvfuse::detail::radix_max_bins];
  __shared__ typename BlockScan::TempStorage scan_storage;
  __shared__ int is_last;

  if (pass > 0 && state->done != 0) return;  // the whole grid sees the same flag (set by an earlier pass)
  const unsigned long long prefix = pass == 0 ? 0ull : state->prefix[pass];
  const unsigned remaining = pass == 0 ? k : state->remaining[pass];
  const unsigned long long mask = kvfuse::detail::radix_prefix_mask(pass);
  const int bins = 1 << kvfuse::detail::radix_pass_bits(pass);
  const int tid = static_cast<int>(threadIdx.x);

  for (int b = tid; b < bins; b += Threads) hist[b] = 0;
  __syncthreads();
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * Threads;
  for (std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * Threads + tid; i < n; i += stride) {
    const unsigned long long key = kvfuse::detail::top_k_key(__ldg(scores + i), i);
    if ((key & mask) == prefix) atomicAdd(&hist[kvfuse::detail::radix_digit(key, pass)], 1u);
  }
  __syncthreads();
  unsigned* global_hist = hist_all + pass * kvfuse::detail::radix_max_bins;
  for (int b = tid; b < bins; b += Threads) {
    if (hist[b] != 0) atomicAdd(global_hist + b, hist[b]);
  }
  __threadfence();
  __syncthreads();
  if (tid == 0) is_last = atomicAdd(&state->ticket[pass], 1u) == gridDim.x - 1 ? 1 : 0;
  __syncthreads();
  if (is_last == 0) return;

  // The last block: the complete histogram, then the bin of the remaining-th largest candidate. Thread tid
  // owns `per` consecutive bins counted from the top; an exclusive scan gives the candidates above them.
  __threadfence();
  for (int b = tid; b < bins; b += Threads) hist[b] = __ldcg(global_hist + b);
  __syncthreads();
  const int per = bins / Threads;
  const int top = bins - 1 - tid * per;  // highest bin of this thread
  unsigned own = 0;
  for (int j = 0; j < per; ++j) own += hist[top - j];
  unsigned above = 0;
  BlockScan(scan_storage).ExclusiveSum(own, above);
  if (above < remaining && remaining <= above + own) {
    for (int j = 0; j < per; ++j) {
      const int b = top - j;
      const unsigned count = hist[b];
      if (above + count >= remaining) {
        const unsigned long long next =
            prefix | (static_cast<unsigned long long>(b) << kvfuse::detail::radix_pass_shift(pass));
        const unsigned left = remaining - above;
        if (pass + 1 < kvfuse::detail::radix_passes) {
          state->prefix[pass + 1] = next;
          state->remaining[pass + 1] = left;
        }
        if (count == left || pass + 1 == kvfuse::detail::radix_passes) {
          state->threshold = next;
          state->done = 1;
        }
        break;
      }
      above += count;
    }
  }
}

// Selects index i iff key(scores[i], i) >= *threshold.
struct KeyAtLeast {
  const float* scores;
  const unsigned long long* threshold;
  __device__ __forceinline__ bool operator()(std::int32_t i) const {
    return kvfuse::detail::top_k_key(scores[i], i) >= *threshold;
  }
};

inline cudaError_t compact_selected(void* temp, std::size_t& temp_bytes, const kvfuse::TopKArgs& a,
                                    const unsigned long long* threshold, long long* count,
                                    cudaStream_t stream) noexcept {
  return cub::DeviceSelect::If(temp, temp_bytes, thrust::counting_iterator<std::int32_t>(0), a.indices, count,
                               a.num_items, KeyAtLeast{a.scores, threshold}, stream);
}

inline Status check_workspace(const char* what, void* workspace, std::size_t have, std::size_t need) noexcept {
  if (need == 0) return refuse(Status::cuda_error, "%s: the CUB workspace size query failed", what);
  if (workspace == nullptr || have < need)
    return refuse(Status::invalid_argument, "%s: workspace %p of %zu bytes, %zu needed", what, workspace, have, need);
  if ((reinterpret_cast<std::uintptr_t>(workspace) & (workspace_align - 1)) != 0)
    return refuse(Status::invalid_argument, "%s: workspace %p is not 256-byte aligned", what, workspace);
  return Status::success;
}

// The radix select of the `k`-th largest key of `scores` (1 <= k <= n) into the RadixState at the start of
// `base` (then its threshold is valid), with the histograms after it: 1 memset and 6 pass kernels on `stream`.
inline Status radix_select(const float* scores, std::int64_t n, std::int64_t k, unsigned char* base,
                           const char* what, cudaStream_t stream) noexcept {
  auto* state = reinterpret_cast<RadixState*>(base);
  auto* hist = reinterpret_cast<unsigned*>(base + state_bytes);
  if (const Status s = from_cuda(cudaMemsetAsync(base, 0, state_bytes + hist_bytes, stream), what);
      s != Status::success)
    return s;
  constexpr std::int64_t per_block = static_cast<std::int64_t>(radix_threads) * radix_items_per_thread;
  const std::int64_t wanted = (n + per_block - 1) / per_block;
  const auto blocks = static_cast<unsigned>(wanted < radix_max_blocks ? wanted : radix_max_blocks);
  for (int pass = 0; pass < kvfuse::detail::radix_passes; ++pass) {
    radix_pass_kernel<radix_threads><<<blocks, radix_threads, 0, stream>>>(scores, n, static_cast<unsigned>(k), pass,
                                                                           state, hist);
    if (const Status s = launch_status("radix_pass_kernel"); s != Status::success) return s;
  }
  return Status::success;
}

// ---------------------------------------------------------------------------------------------------------
// Gradual filtering

inline constexpr int hkvd_threads = 256;

// ranked[i]: the score entry i of S_l ranks with (detail::hkvd_rank_score: -inf for a mandatory row).
__global__ void hkvd_rank_kernel(kvfuse::HKVDSelectArgs a, float* ranked) {
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * hkvd_threads;
  for (std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * hkvd_threads + threadIdx.x; i < a.num_current;
       i += stride)
    ranked[i] = kvfuse::detail::hkvd_rank_score(a.scores[i], a.mandatory[a.current[i]] != 0);
}

// flags[i] = 1 when entry i stays in S_{l+1} (detail::hkvd_kept); `threshold` null: no candidate is kept.
__global__ void hkvd_flag_kernel(kvfuse::HKVDSelectArgs a, const float* ranked, const unsigned long long* threshold,
                                 std::uint8_t* flags) {
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * hkvd_threads;
  const unsigned long long bound = threshold != nullptr ? *threshold : 0ull;
  for (std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * hkvd_threads + threadIdx.x; i < a.num_current;
       i += stride)
    flags[i] = kvfuse::detail::hkvd_kept(a.mandatory[a.current[i]] != 0, kvfuse::detail::top_k_key(ranked[i], i),
                                         threshold != nullptr, bound)
                   ? 1
                   : 0;
}

// Workspace of hkvd_select: the top-k header (state, histograms) | ranked scores [n] | flags [n] | CUB temp.
inline std::size_t hkvd_buffers_bytes(std::int64_t n) {
  return select_header_bytes + round_up(sizeof(float) * static_cast<std::size_t>(n)) +
         round_up(static_cast<std::size_t>(n));
}

inline cudaError_t compact_flagged(void* temp, std::size_t& temp_bytes, const kvfuse::HKVDSelectArgs& a,
                                   const std::uint8_t* flags, cudaStream_t stream) noexcept {
  return cub::DeviceSelect::Flagged(temp, temp_bytes, a.current, flags, a.next, a.num_next, a.num_current, stream);
}

// ---------------------------------------------------------------------------------------------------------
// Full-sort baseline

template <class Index>
__global__ void iota_kernel(Index* out, std::int64_t n) {
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  for (std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride)
    out[i] = static_cast<Index>(i);
}

// Workspace of the baseline: sorted scores [n] | iota [n] | indices by score [n] | CUB temp.
inline std::size_t sort_buffers_bytes(std::int64_t n) {
  return round_up(sizeof(float) * static_cast<std::size_t>(n)) +
         2 * round_up(sizeof(std::int32_t) * static_cast<std::size_t>(n));
}

inline std::size_t sort_temp_bytes(std::int64_t n, std::int64_t k) {
  std::size_t pairs = 0;
  std::size_t keys = 0;
  if (cub::DeviceRadixSort::SortPairsDescending(nullptr, pairs, static_cast<const float*>(nullptr),
                                                static_cast<float*>(nullptr), static_cast<const std::int32_t*>(nullptr),
                                                static_cast<std::int32_t*>(nullptr), n) != cudaSuccess ||
      cub::DeviceRadixSort::SortKeys(nullptr, keys, static_cast<const std::int32_t*>(nullptr),
                                     static_cast<std::int32_t*>(nullptr), k) != cudaSuccess)
    return 0;
  return pairs > keys ? pairs : keys;
}

}  // namespace impl::topk

// Deviation of every token, see kvfuse::KVDeviationArgs. cached_rows entries are trusted (not checked).
[[nodiscard]] inline Status kv_deviation(const kvfuse::KVDeviationArgs& args, cudaStream_t stream = nullptr) noexcept {
  if (const Status s = kvfuse::validate(args); s != Status::success) return s;
  if (args.num_tokens == 0) return Status::success;
  switch (args.dtype) {
    case DType::f32:
      return impl::topk::launch_kv_deviation<float>(args, stream);
    case DType::f16:
      return impl::topk::launch_kv_deviation<kvfuse::f16>(args, stream);
    case DType::bf16:
      return impl::topk::launch_kv_deviation<kvfuse::bf16>(args, stream);
  }
  return refuse(Status::unsupported, "kv_deviation: dtype %d", static_cast<int>(args.dtype));
}

// Bytes of workspace top_k_tokens needs for `num_items` scores (0 if CUB's size query fails).
[[nodiscard]] inline std::size_t top_k_workspace_bytes(std::int64_t num_items) noexcept {
  std::size_t temp = 0;
  kvfuse::TopKArgs probe;
  probe.num_items = num_items;
  if (impl::topk::compact_selected(nullptr, temp, probe, nullptr, nullptr, nullptr) != cudaSuccess) return 0;
  return impl::topk::select_header_bytes + temp;
}

// The k highest scores, ties to the lower index, written to args.indices in ascending order; deterministic.
[[nodiscard]] inline Status top_k_tokens(const kvfuse::TopKArgs& args, void* workspace, std::size_t workspace_bytes,
                                         cudaStream_t stream = nullptr) noexcept {
  if (const Status s = kvfuse::validate(args); s != Status::success) return s;
  if (args.k == 0) return Status::success;
  if (const Status s = impl::topk::check_workspace("top_k_tokens", workspace, workspace_bytes,
                                                     top_k_workspace_bytes(args.num_items));
      s != Status::success)
    return s;
  auto* base = static_cast<unsigned char*>(workspace);
  auto* state = reinterpret_cast<impl::topk::RadixState*>(base);
  auto* count = reinterpret_cast<long long*>(base + impl::topk::state_bytes + impl::topk::hist_bytes);
  void* temp = base + impl::topk::select_header_bytes;
  std::size_t temp_bytes = workspace_bytes - impl::topk::select_header_bytes;
  if (const Status s =
          impl::topk::radix_select(args.scores, args.num_items, args.k, base, "top_k_tokens: memset", stream);
      s != Status::success)
    return s;
  return from_cuda(impl::topk::compact_selected(temp, temp_bytes, args, &state->threshold, count, stream),
                   "top_k_tokens: cub::DeviceSelect::If");
}

// Bytes of workspace hkvd_select needs for an S_l of `num_current` entries (0 if CUB's size query fails).
[[nodiscard]] inline std::size_t hkvd_select_workspace_bytes(std::int64_t num_current) noexcept {
  std::size_t temp = 0;
  kvfuse::HKVDSelectArgs probe;
  probe.num_current = num_current;
  if (impl::topk::compact_flagged(nullptr, temp, probe, nullptr, nullptr) != cudaSuccess) return 0;
  return impl::topk::hkvd_buffers_bytes(num_current) + temp;
}

// CacheBlend section 4.3 gradual filtering on the device, see kvfuse::HKVDSelectArgs: S_{l+1} = the mandatory
// rows of S_l and its `keep` candidates of highest score (ties to the lower row, NaN first), written to
// args.next in ascending order with the count in *args.num_next -- HKVDSelector::select's set, bit-identical
// to kvfuse::ref::hkvd_select. Trusted, not checked (device data): current ascending within [0, num_rows),
// candidate scores not negative (an -inf candidate could lose its place to a mandatory row). Launches: 2
// small kernels + the radix select of top_k_tokens (none when keep = 0) + 2 CUB kernels, all on `stream`.
[[nodiscard]] inline Status hkvd_select(const kvfuse::HKVDSelectArgs& args, void* workspace,
                                        std::size_t workspace_bytes, cudaStream_t stream = nullptr) noexcept {
  if (const Status s = kvfuse::validate(args); s != Status::success) return s;
  const std::int64_t n = args.num_current;
  if (n == 0) return from_cuda(cudaMemsetAsync(args.num_next, 0, sizeof(std::int32_t), stream), "hkvd_select: memset");
  if (const Status s =
          impl::topk::check_workspace("hkvd_select", workspace, workspace_bytes, hkvd_select_workspace_bytes(n));
      s != Status::success)
    return s;
  auto* base = static_cast<unsigned char*>(workspace);
  auto* state = reinterpret_cast<impl::topk::RadixState*>(base);
  auto* ranked = reinterpret_cast<float*>(base + impl::topk::select_header_bytes);
  auto* flags = reinterpret_cast<std::uint8_t*>(base + impl::topk::select_header_bytes +
                                                impl::topk::round_up(sizeof(float) * static_cast<std::size_t>(n)));
  void* temp = base + impl::topk::hkvd_buffers_bytes(n);
  std::size_t temp_bytes = workspace_bytes - impl::topk::hkvd_buffers_bytes(n);

  const std::int64_t wanted = (n + impl::topk::hkvd_threads - 1) / impl::topk::hkvd_threads;
  const auto blocks = static_cast<unsigned>(wanted < 4096 ? wanted : 4096);
  impl::topk::hkvd_rank_kernel<<<blocks, impl::topk::hkvd_threads, 0, stream>>>(args, ranked);
  if (const Status s = launch_status("hkvd_rank_kernel"); s != Status::success) return s;
  const std::int64_t k = args.keep < n ? args.keep : n;
  if (k > 0)
    if (const Status s = impl::topk::radix_select(ranked, n, k, base, "hkvd_select: memset", stream);
        s != Status::success)
      return s;
  impl::topk::hkvd_flag_kernel<<<blocks, impl::topk::hkvd_threads, 0, stream>>>(
      args, ranked, k > 0 ? &state->threshold : nullptr, flags);
  if (const Status s = launch_status("hkvd_flag_kernel"); s != Status::success) return s;
  return from_cuda(impl::topk::compact_flagged(temp, temp_bytes, args, flags, stream),
                   "hkvd_select: cub::DeviceSelect::Flagged");
}

// Bytes of workspace top_k_tokens_by_sort needs for `num_items` scores (0 if CUB's size query fails).
[[nodiscard]] inline std::size_t top_k_by_sort_workspace_bytes(std::int64_t num_items) noexcept {
  const std::size_t temp = impl::topk::sort_temp_bytes(num_items, num_items);
  return temp == 0 ? 0 : impl::topk::sort_buffers_bytes(num_items) + temp;
}

// Baseline: the same selection by a full sort -- cub::DeviceRadixSort::SortPairsDescending of (score, index)
// (stable, so equal scores keep the lower index first), the first k indices, sorted ascending by
// cub::DeviceRadixSort::SortKeys. Equals top_k_tokens for scores without NaN (CUB orders a negative NaN below
// -inf; like top_k_tokens, it sorts -0.0 as +0.0: ProcessFloatMinusZero in cub/block/radix_rank_sort_operations.cuh).
[[nodiscard]] inline Status top_k_tokens_by_sort(const kvfuse::TopKArgs& args, void* workspace,
                                                 std::size_t workspace_bytes, cudaStream_t stream = nullptr) noexcept {
  if (const Status s = kvfuse::validate(args); s != Status::success) return s;
  if (args.k == 0) return Status::success;
  if (const Status s = impl::topk::check_workspace("top_k_tokens_by_sort", workspace, workspace_bytes,
                                                     top_k_by_sort_workspace_bytes(args.num_items));
      s != Status::success)
    return s;
  const std::int64_t n = args.num_items;
  auto* base = static_cast<unsigned char*>(workspace);
  auto* sorted_scores = reinterpret_cast<float*>(base);
  auto* iota =
      reinterpret_cast<std::int32_t*>(base + impl::topk::round_up(sizeof(float) * static_cast<std::size_t>(n)));
  auto* by_score =
      reinterpret_cast<std::int32_t*>(reinterpret_cast<unsigned char*>(iota) +
                                      impl::topk::round_up(sizeof(std::int32_t) * static_cast<std::size_t>(n)));
  void* temp = base + impl::topk::sort_buffers_bytes(n);
  std::size_t temp_bytes = workspace_bytes - impl::topk::sort_buffers_bytes(n);

  const std::int64_t wanted = (n + 255) / 256;
  impl::topk::iota_kernel<<<static_cast<unsigned>(wanted < 4096 ? wanted : 4096), 256, 0, stream>>>(iota, n);
  if (const Status s = launch_status("iota_kernel"); s != Status::success) return s;
  if (const Status s = from_cuda(cub::DeviceRadixSort::SortPairsDescending(temp, temp_bytes, args.scores, sorted_scores,
                                                                           iota, by_score, n, 0, 32, stream),
                                 "top_k_tokens_by_sort: SortPairsDescending");
      s != Status::success)
    return s;
  temp_bytes = workspace_bytes - impl::topk::sort_buffers_bytes(n);
  return from_cuda(cub::DeviceRadixSort::SortKeys(temp, temp_bytes, static_cast<const std::int32_t*>(by_score),
                                                  args.indices, args.k, 0, 32, stream),
                   "top_k_tokens_by_sort: SortKeys");
}

}  // namespace kvfuse::cuda
