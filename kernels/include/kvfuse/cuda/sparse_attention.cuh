#pragma once
// Sparse-query attention with an exact positional causal mask (selective KV recompute, CacheBlend §4.2:
// only the selected tokens' queries are computed): S selected query tokens attend to the full K/V of an
// N-token prompt; key j is visible to query i iff pos_k[j] <= pos_q[i].
// Arguments, semantics and layouts: kvfuse/kernel_args/sparse_attention.hpp (SparseAttentionArgs, shared with the
// CPU reference kvfuse::ref::sparse_attention). Element math: kvfuse/detail/attention.hpp.
//
//   kvfuse::SparseAttentionArgs a;           // fill sizes, device pointers, strides (0 = packed NHD)
//   if (auto s = kvfuse::cuda::sparse_attention(a, stream); s != kvfuse::Status::success) ...
//
// Kernel (FlashAttention-2 style, tensor cores via mma.sync m16n8k16 bf16/f16 -> fp32):
//  - a block of 4 warps owns 64 selected queries (query tile) of ONE query head; warp w owns rows
//    16w..16w+15. Grid (query tiles, Hq); the tiles with the largest positions are scheduled first.
//  - the block's KV loop runs over keys [0, kv_end) with kv_end = upper_bound(pos_k, max pos_q of the
//    tile) (binary search; key positions must be non-decreasing), in tiles of 64 keys, K/V double-buffered
//    in shared memory with 16-byte cp.async. Keys >= kv_end are zero-filled and masked.
//  - scores stay in registers; online softmax per row (the 4 threads of a quad share a row); the mask is
//    applied only to key tiles that are not entirely visible to every query of the tile.
//  - split KV (flash-decoding style), when the caller passes a workspace and there are too few query
//    tiles to fill the GPU: grid z splits each block's KV tiles; every split writes its normalized fp32 O
//    and LSE to the workspace, and a combine kernel merges them (sparse_attention_workspace_bytes).
//  - the optional chunk-mass and query-mass epilogues are another kernel that, with the LSE known,
//    recomputes the scores and adds 2^(s − LSE·log2 e) per (query, chunk) and per key (over the query rows)
//    with atomicAdd over heads (and KV splits); it runs only on the query tiles when only the query mass is
//    wanted. The optional self-mass epilogue is a small kernel of one warp per query (one dot product per
//    head).
// Supported by the kernel: bf16 and f16 storage (f32 is refused as unsupported), head_dim 64 and 128,
// 16-byte aligned base pointers and strides that are multiples of 8 elements. Query positions need no
// order for correctness, but sorted queries make each tile's KV loop short. Inputs must be finite (a NaN
// in an invisible key that shares a 64-key tile with visible ones would still reach the output: 0 · NaN).
//
// Fragment layouts of mma.sync.aligned.m16n8k16.row.col.f32.{bf16,f16} (PTX ISA, "Matrix fragments for
// mma.m16n8k16"), with g = lane / 4 (group) and t = lane % 4 (thread in group); every 32-bit register
// holds two 16-bit elements, the lower column/row index in the low half:
//   A 16x16 row-major, 4 regs: a0 = (row g,   cols 2t, 2t+1)   a1 = (row g+8, cols 2t, 2t+1)
//                              a2 = (row g,   cols 2t+8, 2t+9) a3 = (row g+8, cols 2t+8, 2t+9)
//   B 16x8 "col" (k x n), 2 regs: b0 = (k 2t, 2t+1; n g)       b1 = (k 2t+8, 2t+9; n g)
//   C/D 16x8 fp32, 4 regs: c0, c1 = (row g, cols 2t, 2t+1)     c2, c3 = (row g+8, cols 2t, 2t+1)
// ldmatrix.m8n8.x4: lanes 8i..8i+7 give the row addresses of 8x8 matrix i; register i of a lane receives
// (row g, cols 2t, 2t+1) of matrix i, or with .trans (rows 2t, 2t+1; col g).

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "kvfuse/core/dtype.hpp"
#include "kvfuse/cuda/status.cuh"
#include "kvfuse/detail/attention.hpp"
#include "kvfuse/kernel_args/sparse_attention.hpp"

namespace kvfuse::cuda {

using kvfuse::SparseAttentionArgs;

namespace impl {

inline constexpr int kAttnBlockM = 64;   // queries per block (4 warps x 16 rows)
inline constexpr int kAttnBlockN = 64;   // keys per KV tile
inline constexpr int kAttnThreads = 128;

// Device-side arguments: typed pointers, resolved strides, int sizes.
template <class T>
struct AttnParams {
  const T* q;
  const T* k;
  const T* v;
  T* o;
  const std::int32_t* q_pos;
  const std::int32_t* k_pos;
  float* lse;
  const std::int64_t* chunk_starts;
  float* mass;
  const std::int32_t* self_rows;
  float* self_mass;   // null: no self-mass epilogue
  float* query_mass;  // null: no query-mass epilogue
  int query_begin, query_end;
  float* part_o;    // split KV: [splits][S][Hq][d] fp32 normalized partial outputs; null: write o, lse
  float* part_lse;  // split KV: [splits][S][Hq] partial LSEs (natural log)
  std::int64_t q_ts, q_hs, k_ts, k_hs, v_ts, v_hs, o_ts, o_hs;
  int num_queries, num_keys, num_q_heads, group, num_chunks;
  int kv_tiles_per_split;  // KV tiles of one block; block z runs tiles [z * this, (z + 1) * this)
  float score_factor;  // scale * log2(e)
};

// The CUDA 16-bit type of a kvfuse storage type and its packing of two floats (round to nearest even).
template <class T>
struct AttnType;
template <>
struct AttnType<kvfuse::bf16> {
  static __device__ __forceinline__ std::uint32_t pack(float lo, float hi) {
    const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);  // .x = lo: the low 16 bits
    return *reinterpret_cast<const std::uint32_t*>(&v);
  }
  // D += A * B, m16n8k16, bf16 inputs, fp32 accumulators.
  static __device__ __forceinline__ void mma(float (&d)[4], const std::uint32_t (&a)[4], std::uint32_t b0,
                                             std::uint32_t b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
};
template <>
struct AttnType<kvfuse::f16> {
  static __device__ __forceinline__ std::uint32_t pack(float lo, float hi) {
    const __half2 v = __floats2half2_rn(lo, hi);
    return *reinterpret_cast<const std::uint32_t*>(&v);
  }
  static __device__ __forceinline__ void mma(float (&d)[4], const std::uint32_t (&a)[4], std::uint32_t b0,
                                             std::uint32_t b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
};

__device__ __forceinline__ unsigned smem_address(const void* p) {
  return static_cast<unsigned>(__cvta_generic_to_shared(p));
}

// 16 bytes global -> shared, asynchronous; `valid` false zero-fills the destination (reads nothing).
__device__ __forceinline__ void cp_async_16(void* dst, const void* src, bool valid) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_address(dst)), "l"(src),
               "r"(valid ? 16 : 0)
               : "memory");
}

// 4 bytes global -> shared, asynchronous; `valid` false zero-fills.
__device__ __forceinline__ void cp_async_4(void* dst, const void* src, bool valid) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(smem_address(dst)), "l"(src),
               "r"(valid ? 4 : 0)
               : "memory");
}

__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }

// Waits until at most `pending` of this thread's committed cp.async groups are still in flight.
template <int pending>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(pending) : "memory");
}

__device__ __forceinline__ void ldmatrix_x4(std::uint32_t (&r)[4], const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_address(p))
               : "memory");
}

__device__ __forceinline__ void ldmatrix_x4_trans(std::uint32_t (&r)[4], const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_address(p))
               : "memory");
}

// Shared-memory row pitch in elements: d plus 16 bytes, so the 8 rows an ldmatrix reads at the same
// column start in 8 different 16-byte bank groups (no bank conflicts). Rows stay 16-byte aligned.
template <int D>
inline constexpr int kAttnPitch = D + 8;

// Bytes of dynamic shared memory: Q tile, `kv_buffers` tiles of 64 rows (K, or K and V, double-buffered)
// and 2 x 64 ints per KV buffer pair (key positions, and for the mass kernel nothing else).
template <int D>
constexpr int attn_smem_bytes(int kv_tiles) {
  return (kAttnBlockM + kv_tiles * kAttnBlockN) * kAttnPitch<D> * 2 + 2 * kAttnBlockN * 4;
}

// Copies `rows` (<= 64) rows of d elements, row r at src + r * token_stride, into a 64-row shared tile;
// rows >= `rows` are zero-filled. All 128 threads take part.
template <class T, int D>
__device__ __forceinline__ void load_tile_async(T* dst, const T* src, std::int64_t token_stride, int rows) {
  constexpr int vectors = D / 8;  // 16-byte vectors per row
  for (int idx = threadIdx.x; idx < kAttnBlockM * vectors; idx += kAttnThreads) {
    const int r = idx / vectors;
    const int c = (idx % vectors) * 8;
    const bool valid = r < rows;
    cp_async_16(dst + r * kAttnPitch<D> + c, valid ? src + r * token_stride + c : src, valid);
  }
}

// What every block of both kernels computes first: its query tile and head, the positions of the two rows
// this thread owns in the C fragments (g and g+8 of its warp's 16), the tile's smallest and largest query
// position, kv_end = the number of keys with pos_k <= the largest (pos_k non-decreasing), and the KV
// tiles [kt_begin, kt_end) of this block's split (blockIdx.z) of [0, ceil(kv_end / 64)).
struct AttnTile {
  int q0;        // first query of the tile
  int rows;      // valid queries in the tile (<= 64)
  int head;      // query head
  int kv_head;   // KV head (GQA)
  int row0;      // this thread's rows in the tile: row0 and row0 + 8
  std::int32_t qpos0, qpos1;
  std::int32_t min_qpos;
  int kv_end;
  int kt_begin, kt_end;
};

template <class T>
__device__ AttnTile attn_tile(const AttnParams<T>& p, int* s_reduce) {
  AttnTile tile;
  const int lane = threadIdx.x % 32;
  const int warp = threadIdx.x / 32;
  // blockIdx.x = (tiles counted from the last) * Hq + head: the head varies fastest, so the blocks of the
  // largest positions (the longest KV loops, if the queries are sorted) start first across all heads.
  const int q_tiles = (p.num_queries + kAttnBlockM - 1) / kAttnBlockM;
  tile.head = static_cast<int>(blockIdx.x % static_cast<unsigned>(p.num_q_heads));
  tile.q0 = (q_tiles - 1 - static_cast<int>(blockIdx.x / static_cast<unsigned>(p.num_q_heads))) * kAttnBlockM;
  tile.rows = min(kAttnBlockM, p.num_queries - tile.q0);
  tile.kv_head = tile.head / p.group;
  tile.row0 = warp * 16 + lane / 4;
  // Rows past the end of the queries take the last query's position: they are computed, never stored.
  tile.qpos0 = p.q_pos[tile.q0 + min(tile.row0, tile.rows - 1)];
  tile.qpos1 = p.q_pos[tile.q0 + min(tile.row0 + 8, tile.rows - 1)];
  // Smallest and largest query position of the tile: warp shuffles, then across the 4 warps.
  std::int32_t lo = min(tile.qpos0, tile.qpos1);
  std::int32_t hi = max(tile.qpos0, tile.qpos1);
  for (int offset = 16; offset > 0; offset /= 2) {
    lo = min(lo, __shfl_xor_sync(0xffffffffu, lo, offset));
    hi = max(hi, __shfl_xor_sync(0xffffffffu, hi, offset));
  }
  if (lane == 0) {
    s_reduce[warp] = lo;
    s_reduce[4 + warp] = hi;
  }
  __syncthreads();
  tile.min_qpos = min(min(s_reduce[0], s_reduce[1]), min(s_reduce[2], s_reduce[3]));
  const std::int32_t max_qpos = max(max(s_reduce[4], s_reduce[5]), max(s_reduce[6], s_reduce[7]));
  // upper_bound(pos_k, max_qpos): every thread searches (same addresses: broadcast loads).
  int first = 0;
  int count = p.num_keys;
  while (count > 0) {
    const int step = count / 2;
    if (p.k_pos[first + step] <= max_qpos) {
      first += step + 1;
      count -= step + 1;
    } else {
      count = step;
    }
  }
  tile.kv_end = first;
  const int kv_tiles = (first + kAttnBlockN - 1) / kAttnBlockN;
  tile.kt_begin = min(kv_tiles, static_cast<int>(blockIdx.z) * p.kv_tiles_per_split);
  tile.kt_end = min(kv_tiles, tile.kt_begin + p.kv_tiles_per_split);
  return tile;
}

// Issues the cp.async of KV tile `kt` (64 keys from kt * 64, zero-filled from kv_end on): K rows, V rows
// when `v_dst` is not null, and the key positions.
template <class T, int D>
__device__ __forceinline__ void load_kv_async(const AttnParams<T>& p, const AttnTile& tile, int kt, T* k_dst, T* v_dst,
                                              std::int32_t* pos_dst) {
  const int key0 = kt * kAttnBlockN;
  const int rows = min(kAttnBlockN, tile.kv_end - key0);
  load_tile_async<T, D>(k_dst, p.k + key0 * p.k_ts + tile.kv_head * p.k_hs, p.k_ts, rows);
  if (v_dst != nullptr) load_tile_async<T, D>(v_dst, p.v + key0 * p.v_ts + tile.kv_head * p.v_hs, p.v_ts, rows);
  if (threadIdx.x < kAttnBlockN) {
    const bool valid = static_cast<int>(threadIdx.x) < rows;
    cp_async_4(pos_dst + threadIdx.x, p.k_pos + (valid ? key0 + static_cast<int>(threadIdx.x) : 0), valid);
  }
}

// This warp's Q rows as A fragments, one per 16 columns of d: loaded once, kept in registers.
template <int D>
__device__ __forceinline__ void load_q_fragments(std::uint32_t (&qf)[D / 16][4], const void* s_q_void) {
  const auto* s_q = static_cast<const unsigned char*>(s_q_void);
  const int lane = threadIdx.x % 32;
  const int warp = threadIdx.x / 32;
  // Matrix i = lane / 8: rows +8 for i = 1, 3; columns +8 for i = 2, 3 -> a0..a3.
  const int row = warp * 16 + lane % 16;
#pragma unroll
  for (int kk = 0; kk < D / 16; ++kk) {
    const int col = kk * 16 + (lane / 16) * 8;
    ldmatrix_x4(qf[kk], s_q + (row * kAttnPitch<D> + col) * 2);
  }
}

// The start both kernels share: the tile's Q and its first K (and V, unless s_v is null) tile in flight,
// then Q in registers once it has landed (the first KV tile may still be in flight: the caller's loop waits).
template <class T, int D>
__device__ __forceinline__ void attn_start(const AttnParams<T>& p, const AttnTile& tile, T* s_q, T* s_k, T* s_v,
                                           std::int32_t* s_pos, std::uint32_t (&qf)[D / 16][4]) {
  load_tile_async<T, D>(s_q, p.q + tile.q0 * p.q_ts + tile.head * p.q_hs, p.q_ts, tile.rows);
  cp_async_commit();
  if (tile.kt_begin < tile.kt_end) load_kv_async<T, D>(p, tile, tile.kt_begin, s_k, s_v, s_pos);
  cp_async_commit();
  cp_async_wait<1>();  // Q has landed (tile 0 may still be in flight)
  __syncthreads();
  load_q_fragments<D>(qf, s_q);
}

// s = Q K^T for this warp's 16 rows and the 64 keys of the tile in `s_k`: s[n] is the C fragment of keys
// 8n..8n+7. B = K^T is "col" (k = d, n = key): b0 = K[key g][d 2t, 2t+1], i.e. rows of K, no transpose.
template <class T, int D>
__device__ __forceinline__ void warp_scores(float (&s)[8][4], const std::uint32_t (&qf)[D / 16][4],
                                            const T* s_k) {
  const int lane = threadIdx.x % 32;
#pragma unroll
  for (int n = 0; n < 8; ++n) s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.0f;
  // Matrix i = lane / 8 covers keys 16np + 8 * (i / 2) .. +7 and d columns 16kk + 8 * (i % 2) .. +7:
  // registers 0, 1 are b0, b1 of key group 2np, registers 2, 3 those of 2np + 1.
  const int key = (lane % 8) + (lane / 16) * 8;
  const int col = ((lane / 8) % 2) * 8;
#pragma unroll
  for (int kk = 0; kk < D / 16; ++kk) {
#pragma unroll
    for (int np = 0; np < 4; ++np) {
      std::uint32_t b[4];
      ldmatrix_x4(b, s_k + (np * 16 + key) * kAttnPitch<D> + kk * 16 + col);
      AttnType<T>::mma(s[2 * np], qf[kk], b[0], b[1]);
      AttnType<T>::mma(s[2 * np + 1], qf[kk], b[2], b[3]);
    }
  }
}

// Scales raw scores to base 2 and masks: -inf where the key is past kv_end or pos_k > pos_q of the row.
// The mask is applied only when some key of the tile may be invisible to some query of the tile.
__device__ __forceinline__ void scale_and_mask(float (&s)[8][4], float factor, const AttnTile& tile, int kt,
                                               const std::int32_t* s_pos) {
  const int key0 = kt * kAttnBlockN;
  const int valid = min(kAttnBlockN, tile.kv_end - key0);
  const bool need_mask = valid < kAttnBlockN || s_pos[valid - 1] > tile.min_qpos;  // pos_k sorted: last is max
  const int t = threadIdx.x % 4;
#pragma unroll
  for (int n = 0; n < 8; ++n) {
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      s[n][e] *= factor;
      if (need_mask) {
        const int col = n * 8 + 2 * t + (e % 2);
        const std::int32_t qpos = e < 2 ? tile.qpos0 : tile.qpos1;
        if (col >= valid || !kvfuse::detail::attention_visible(s_pos[col], qpos))
          s[n][e] = kvfuse::detail::attention_neg_inf();
      }
    }
  }
}

template <class T, int D>
__global__ void __launch_bounds__(kAttnThreads) sparse_attention_kernel(const AttnParams<T> p) {
  extern __shared__ __align__(16) unsigned char attn_smem[];
  T* s_q = reinterpret_cast<T*>(attn_smem);
  T* s_k = s_q + kAttnBlockM * kAttnPitch<D>;     // [2][64][pitch]
  T* s_v = s_k + 2 * kAttnBlockN * kAttnPitch<D>;  // [2][64][pitch]
  auto* s_pos = reinterpret_cast<std::int32_t*>(s_v + 2 * kAttnBlockN * kAttnPitch<D>);  // [2][64]
  __shared__ int s_reduce[8];

  const AttnTile tile = attn_tile(p, s_reduce);
  const int lane = threadIdx.x % 32;
  const int t = lane % 4;

  std::uint32_t qf[D / 16][4];
  attn_start<T, D>(p, tile, s_q, s_k, s_v, s_pos, qf);

  float o[D / 8][4];  // C fragments of the output: o[n] holds d columns 8n..8n+7
#pragma unroll
  for (int n = 0; n < D / 8; ++n) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.0f;
  float m[2] = {kvfuse::detail::attention_neg_inf(), kvfuse::detail::attention_neg_inf()};  // rows g, g+8
  float l[2] = {0.0f, 0.0f};  // this thread's share of the row sums (its 2 of every 8 columns)

  for (int kt = tile.kt_begin; kt < tile.kt_end; ++kt) {
    const int buf = (kt - tile.kt_begin) % 2;
    if (kt + 1 < tile.kt_end) {
      // Buffer buf ^ 1 was last read in iteration kt - 1, which ended with __syncthreads.
      load_kv_async<T, D>(p, tile, kt + 1, s_k + (buf ^ 1) * kAttnBlockN * kAttnPitch<D>,
                          s_v + (buf ^ 1) * kAttnBlockN * kAttnPitch<D>, s_pos + (buf ^ 1) * kAttnBlockN);
      cp_async_commit();
      cp_async_wait<1>();  // tile kt has landed, tile kt + 1 may be in flight
    } else {
      cp_async_wait<0>();
    }
    __syncthreads();  // every thread's part of tile kt is visible
    const T* k_tile = s_k + buf * kAttnBlockN * kAttnPitch<D>;
    const T* v_tile = s_v + buf * kAttnBlockN * kAttnPitch<D>;

    float s[8][4];
    warp_scores<T, D>(s, qf, k_tile);
    scale_and_mask(s, p.score_factor, tile, kt, s_pos + buf * kAttnBlockN);

    // Online softmax (kvfuse/detail/attention.hpp). Row g: s[n][0..1], row g+8: s[n][2..3]; a row's 64
    // values are spread over the 4 threads of a quad (lanes 4g..4g+3): reduce with xor 1 and 2.
    float block_max[2] = {kvfuse::detail::attention_neg_inf(), kvfuse::detail::attention_neg_inf()};
#pragma unroll
    for (int n = 0; n < 8; ++n) {
      block_max[0] = fmaxf(block_max[0], fmaxf(s[n][0], s[n][1]));
      block_max[1] = fmaxf(block_max[1], fmaxf(s[n][2], s[n][3]));
    }
    float alpha[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      block_max[r] = fmaxf(block_max[r], __shfl_xor_sync(0xffffffffu, block_max[r], 1));
      block_max[r] = fmaxf(block_max[r], __shfl_xor_sync(0xffffffffu, block_max[r], 2));
      alpha[r] = kvfuse::detail::softmax_advance(m[r], block_max[r]);
      l[r] *= alpha[r];
    }
#pragma unroll
    for (int n = 0; n < 8; ++n) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        s[n][e] = kvfuse::detail::softmax_weight(s[n][e], m[e / 2]);
        l[e / 2] += s[n][e];
      }
    }
#pragma unroll
    for (int n = 0; n < D / 8; ++n) {
      o[n][0] *= alpha[0];
      o[n][1] *= alpha[0];
      o[n][2] *= alpha[1];
      o[n][3] *= alpha[1];
    }

    // o += P V. P as A fragments of keys 16kk..16kk+15: a0 = (row g, keys 16kk+2t..) = s[2kk][0..1],
    // a1 = (row g+8, same keys) = s[2kk][2..3], a2, a3 the same for keys +8 = s[2kk+1].
    // B = V (k = key, n = d) "col": b0 = V[keys 2t, 2t+1][d g], a column of V: ldmatrix .trans of V rows.
    // Matrix i = lane / 8 covers keys 16kk + 8 * (i % 2) .. +7 and d columns 16np + 8 * (i / 2) .. +7:
    // registers 0, 1 are b0, b1 of d group 2np, registers 2, 3 those of 2np + 1.
    const int v_key = (lane % 8) + ((lane / 8) % 2) * 8;
    const int v_col = (lane / 16) * 8;
#pragma unroll
    for (int kk = 0; kk < 4; ++kk) {
      const std::uint32_t a[4] = {AttnType<T>::pack(s[2 * kk][0], s[2 * kk][1]),
                                  AttnType<T>::pack(s[2 * kk][2], s[2 * kk][3]),
                                  AttnType<T>::pack(s[2 * kk + 1][0], s[2 * kk + 1][1]),
                                  AttnType<T>::pack(s[2 * kk + 1][2], s[2 * kk + 1][3])};
#pragma unroll
      for (int np = 0; np < D / 16; ++np) {
        std::uint32_t b[4];
        ldmatrix_x4_trans(b, v_tile + (kk * 16 + v_key) * kAttnPitch<D> + np * 16 + v_col);
        AttnType<T>::mma(o[2 * np], a, b[0], b[1]);
        AttnType<T>::mma(o[2 * np + 1], a, b[2], b[3]);
      }
    }
    __syncthreads();  // every warp is done with buffer buf before iteration kt + 1 refills it
  }

  // Row sums over the quad, then O = acc / l and LSE = (m + log2 l) ln 2.
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    l[r] += __shfl_xor_sync(0xffffffffu, l[r], 1);
    l[r] += __shfl_xor_sync(0xffffffffu, l[r], 2);
  }
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int row = tile.row0 + 8 * r;
    if (row >= tile.rows) continue;
    const float inv = kvfuse::detail::attention_output_scale(l[r]);
    const float lse = kvfuse::detail::attention_lse(m[r], l[r]);
    if (p.part_o != nullptr) {  // split KV: this split's normalized O and LSE, merged by the combine kernel
      const std::int64_t pair =
          (static_cast<std::int64_t>(blockIdx.z) * p.num_queries + tile.q0 + row) * p.num_q_heads + tile.head;
      float* out = p.part_o + pair * D + 2 * t;
#pragma unroll
      for (int n = 0; n < D / 8; ++n)
        *reinterpret_cast<float2*>(out + 8 * n) = make_float2(o[n][2 * r] * inv, o[n][2 * r + 1] * inv);
      if (t == 0) p.part_lse[pair] = lse;
      continue;
    }
    T* out = p.o + (tile.q0 + row) * p.o_ts + tile.head * p.o_hs + 2 * t;
#pragma unroll
    for (int n = 0; n < D / 8; ++n)
      *reinterpret_cast<std::uint32_t*>(out + 8 * n) = AttnType<T>::pack(o[n][2 * r] * inv, o[n][2 * r + 1] * inv);
    if (t == 0) p.lse[static_cast<std::int64_t>(tile.q0 + row) * p.num_q_heads + tile.head] = lse;
  }
}

// Split KV: merges the `splits` partial results of each (query, head) — one warp per pair. The partial LSEs
// are the scores of a softmax over the splits (in base 2: lse · log2 e), so the merge is the same math:
// LSE = ln Σ_z e^(lse_z), O = Σ_z e^(lse_z − LSE) · O_z; a split that saw no key has lse_z = −inf, weight 0.
template <class T, int D>
__global__ void __launch_bounds__(kAttnThreads) sparse_attention_combine_kernel(const AttnParams<T> p, int splits) {
  const std::int64_t pairs = static_cast<std::int64_t>(p.num_queries) * p.num_q_heads;
  const std::int64_t pair = static_cast<std::int64_t>(blockIdx.x) * (kAttnThreads / 32) + threadIdx.x / 32;
  if (pair >= pairs) return;
  const int lane = threadIdx.x % 32;
  float m = kvfuse::detail::attention_neg_inf();
  for (int z = 0; z < splits; ++z) m = fmaxf(m, p.part_lse[z * pairs + pair] * kvfuse::detail::kAttentionLog2e);
  float l = 0.0f;
  for (int z = 0; z < splits; ++z)
    l += kvfuse::detail::softmax_weight(p.part_lse[z * pairs + pair] * kvfuse::detail::kAttentionLog2e, m);
  const float lse = kvfuse::detail::attention_lse(m, l);
  const std::int64_t i = pair / p.num_q_heads;
  const std::int64_t h = pair % p.num_q_heads;
  T* out = p.o + i * p.o_ts + h * p.o_hs;
  for (int e = 2 * lane; e < D; e += 64) {
    float x0 = 0.0f;
    float x1 = 0.0f;
    for (int z = 0; z < splits; ++z) {
      const float w =
          kvfuse::detail::attention_probability(p.part_lse[z * pairs + pair] * kvfuse::detail::kAttentionLog2e, lse);
      if (w == 0.0f) continue;  // a split without visible keys (its O_z is 0 anyway)
      const float2 x = *reinterpret_cast<const float2*>(p.part_o + (z * pairs + pair) * D + e);
      x0 += w * x.x;
      x1 += w * x.y;
    }
    *reinterpret_cast<std::uint32_t*>(out + e) = AttnType<T>::pack(x0, x1);
  }
  if (lane == 0) p.lse[pair] = lse;
}

// The mass epilogues, for this block's head (the launcher zeroes the outputs first; heads and KV splits add
// up through atomicAdd). Scores are recomputed exactly as sparse_attention_kernel computed them.
//  - chunk mass (num_chunks > 0): mass[i][c] += Σ_{j in chunk c, visible} 2^(s_ij − LSE_i log2 e), Cache-Craft
//    eq. 3–4 weights. Each thread walks its keys in increasing order (those of its quad column: 8n + 2t,
//    8n + 2t + 1 of every tile) and flushes a running sum per row whenever the chunk changes, so the atomics
//    number about (chunks touched) x 4 per row and head.
//  - query mass (query_mass set, on tiles holding query rows): query_mass[j] += Σ_{query rows i} 2^(s_ij −
//    LSE_i log2 e). Per tile the rows' weights of a key are added over the 8 row groups of a warp (shuffles),
//    over the 4 warps (shared memory), then one atomicAdd per key.
// A block with neither returns after attn_tile (with only the query mass wanted: every non-query tile).
template <class T, int D>
__global__ void __launch_bounds__(kAttnThreads) sparse_attention_mass_kernel(const AttnParams<T> p) {
  extern __shared__ __align__(16) unsigned char attn_smem[];
  T* s_q = reinterpret_cast<T*>(attn_smem);
  T* s_k = s_q + kAttnBlockM * kAttnPitch<D>;  // [2][64][pitch]
  auto* s_pos = reinterpret_cast<std::int32_t*>(s_k + 2 * kAttnBlockN * kAttnPitch<D>);  // [2][64]
  __shared__ int s_reduce[8];
  __shared__ float s_query[kAttnBlockN];  // query mass of the tile's 64 keys, summed over the 4 warps

  const AttnTile tile = attn_tile(p, s_reduce);
  const bool chunks = p.num_chunks > 0;
  const bool query_tile = p.query_mass != nullptr && tile.q0 < p.query_end && tile.q0 + tile.rows > p.query_begin;
  if (!chunks && !query_tile) return;  // block-uniform
  const int lane = threadIdx.x % 32;
  const int t = lane % 4;
  if (threadIdx.x < kAttnBlockN) s_query[threadIdx.x] = 0.0f;  // visible to all after attn_start's barrier

  std::uint32_t qf[D / 16][4];
  attn_start<T, D>(p, tile, s_q, s_k, nullptr, s_pos, qf);

  const bool store0 = tile.row0 < tile.rows;
  const bool store1 = tile.row0 + 8 < tile.rows;
  const std::int64_t base0 = static_cast<std::int64_t>(tile.q0 + tile.row0);
  const bool query0 = store0 && base0 >= p.query_begin && base0 < p.query_end;
  const bool query1 = store1 && base0 + 8 >= p.query_begin && base0 + 8 < p.query_end;
  // LSE of the two rows (a row past the end of the queries is never stored: any finite value).
  const float lse[2] = {store0 ? p.lse[base0 * p.num_q_heads + tile.head] : 0.0f,
                        store1 ? p.lse[(base0 + 8) * p.num_q_heads + tile.head] : 0.0f};
  int chunk = -1;  // chunk of the keys being summed; -1 before the first chunk
  std::int64_t chunk_end = chunks ? p.chunk_starts[0] : INT64_MAX;  // first key past the current chunk
  float sum[2] = {0.0f, 0.0f};
  const auto flush = [&] {
    if (chunk >= 0 && chunk < p.num_chunks) {
      if (store0 && sum[0] != 0.0f) atomicAdd(p.mass + base0 * p.num_chunks + chunk, sum[0]);
      if (store1 && sum[1] != 0.0f) atomicAdd(p.mass + (base0 + 8) * p.num_chunks + chunk, sum[1]);
    }
    sum[0] = sum[1] = 0.0f;
  };

  for (int kt = tile.kt_begin; kt < tile.kt_end; ++kt) {
    const int buf = (kt - tile.kt_begin) % 2;
    if (kt + 1 < tile.kt_end) {
      load_kv_async<T, D>(p, tile, kt + 1, s_k + (buf ^ 1) * kAttnBlockN * kAttnPitch<D>, nullptr,
                          s_pos + (buf ^ 1) * kAttnBlockN);
      cp_async_commit();
      cp_async_wait<1>();
    } else {
      cp_async_wait<0>();
    }
    __syncthreads();
    float s[8][4];
    warp_scores<T, D>(s, qf, s_k + buf * kAttnBlockN * kAttnPitch<D>);
    scale_and_mask(s, p.score_factor, tile, kt, s_pos + buf * kAttnBlockN);
    float q[8][2];  // query mass of this thread's keys 8n + 2t + e over its query rows
#pragma unroll
    for (int n = 0; n < 8; ++n) {
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const float p0 = kvfuse::detail::attention_probability(s[n][e], lse[0]);
        const float p1 = kvfuse::detail::attention_probability(s[n][2 + e], lse[1]);
        q[n][e] = (query0 ? p0 : 0.0f) + (query1 ? p1 : 0.0f);
        if (!chunks) continue;
        const std::int64_t key = kt * kAttnBlockN + n * 8 + 2 * t + e;
        if (key >= chunk_end) {  // rare: this thread's keys enter a later chunk (empty chunks skipped)
          flush();
          do {
            ++chunk;
            chunk_end = chunk < p.num_chunks ? p.chunk_starts[chunk + 1] : INT64_MAX;
          } while (key >= chunk_end);
        }
        sum[0] += p0;
        sum[1] += p1;
      }
    }
    if (query_tile) {
      // Over the 8 row groups of the warp (lanes 4g + t, g = 0..7), then lanes 0..3 add into shared memory.
#pragma unroll
      for (int n = 0; n < 8; ++n) {
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          for (int offset = 4; offset < 32; offset *= 2) q[n][e] += __shfl_xor_sync(0xffffffffu, q[n][e], offset);
          if (lane < 4 && q[n][e] != 0.0f) atomicAdd(&s_query[n * 8 + 2 * t + e], q[n][e]);
        }
      }
      __syncthreads();
      if (threadIdx.x < kAttnBlockN) {
        const int key = kt * kAttnBlockN + static_cast<int>(threadIdx.x);
        const float w = s_query[threadIdx.x];
        if (key < tile.kv_end && w != 0.0f) atomicAdd(p.query_mass + key, w);
        s_query[threadIdx.x] = 0.0f;  // read again only after the barrier below
      }
    }
    __syncthreads();
  }
  flush();
}

// The self-mass epilogue: self_mass[i] = Σ_h 2^(s_{h,i,r} − LSE_hi log2 e) with r = self_rows[i] (0 where key
// r is not visible to query i). One warp per query: per head the dot product q_i · k_r split over the lanes
// (a fixed butterfly), heads added in order, one plain store: deterministic, no atomics, Hq·d elements of Q
// and of K read per query.
template <class T, int D>
__global__ void __launch_bounds__(kAttnThreads) sparse_attention_self_mass_kernel(const AttnParams<T> p) {
  const std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * (kAttnThreads / 32) + threadIdx.x / 32;
  if (i >= p.num_queries) return;  // warp-uniform
  const int lane = threadIdx.x % 32;
  const std::int64_t row = p.self_rows[i];
  const bool visible = kvfuse::detail::attention_visible(p.k_pos[row], p.q_pos[i]);
  float sum = 0.0f;
  for (int h = 0; h < p.num_q_heads; ++h) {
    const T* q = p.q + i * p.q_ts + h * p.q_hs;
    const T* k = p.k + row * p.k_ts + (h / p.group) * p.k_hs;
    float dot = 0.0f;
    for (int e = 2 * lane; e < D; e += 64)
      dot += kvfuse::to_float(q[e]) * kvfuse::to_float(k[e]) + kvfuse::to_float(q[e + 1]) * kvfuse::to_float(k[e + 1]);
    for (int offset = 16; offset > 0; offset /= 2) dot += __shfl_xor_sync(0xffffffffu, dot, offset);
    if (visible) sum += kvfuse::detail::attention_probability(dot * p.score_factor, p.lse[i * p.num_q_heads + h]);
  }
  if (lane == 0) p.self_mass[i] = sum;
}

// Split KV (flash-decoding style): with few selected queries the (query tile, head) blocks alone leave
// SMs idle, and the blocks with the largest positions run far longer than the others. Each block then runs
// only `tiles_per_split` of its KV tiles (grid z = splits); attention writes partial results to the
// workspace and a combine kernel merges them, the mass epilogues (atomics) need no workspace.
inline constexpr int kAttnMaxSplits = 16;
inline constexpr int kAttnMinTilesPerSplit = 8;  // 512 keys: keeps the merge cheap against the work

struct AttnSplitPlan {
  int splits;           // grid z
  int tiles_per_split;  // KV tiles per block
};

// Aims at about 4 blocks per SM (two waves of two resident blocks) over the worst case of N keys per tile.
inline AttnSplitPlan attn_split_plan(const SparseAttentionArgs& a, int sm_count) {
  const std::int64_t kv_tiles = (a.num_keys + kAttnBlockN - 1) / kAttnBlockN;
  const std::int64_t blocks = (a.num_queries + kAttnBlockM - 1) / kAttnBlockM * a.num_q_heads;
  const std::int64_t target = 4 * static_cast<std::int64_t>(sm_count);
  std::int64_t splits = blocks == 0 || blocks >= target ? 1 : (target + blocks - 1) / blocks;  // S = 0: no blocks
  splits = std::min(splits, static_cast<std::int64_t>(kAttnMaxSplits));
  splits = std::min(splits, std::max<std::int64_t>(1, kv_tiles / kAttnMinTilesPerSplit));
  const std::int64_t per = std::max<std::int64_t>(1, (kv_tiles + splits - 1) / splits);
  return {static_cast<int>(std::max<std::int64_t>(1, (kv_tiles + per - 1) / per)), static_cast<int>(per)};
}

// Workspace bytes of a split: fp32 partial outputs [splits][S][Hq][d], then partial LSEs [splits][S][Hq].
inline std::int64_t attn_split_bytes(const SparseAttentionArgs& a, int splits) {
  return static_cast<std::int64_t>(splits) * a.num_queries * a.num_q_heads * (a.head_dim + 1) * 4;
}

inline Status attn_sm_count(int& sm_count) {
  int device = 0;
  if (const Status s = from_cuda(cudaGetDevice(&device), "sparse_attention: cudaGetDevice"); s != Status::success)
    return s;
  return from_cuda(cudaDeviceGetAttribute(&sm_count, cudaDevAttrMultiProcessorCount, device),
                   "sparse_attention: cudaDeviceGetAttribute");
}

enum class AttnKernel { attention, combine, mass, self_mass };

// One launch of one kernel of (T, D); sets the dynamic shared memory limit where it needs one.
template <class T, int D>
Status launch_attention_kernel(AttnKernel which, const AttnParams<T>& params, int splits, cudaStream_t stream) {
  // One block per (query tile, head): q_tiles * Hq < 2^31 (validated by the launcher).
  const std::int64_t q_tiles = (params.num_queries + kAttnBlockM - 1) / kAttnBlockM;
  const dim3 grid(static_cast<unsigned>(q_tiles * params.num_q_heads), 1u, static_cast<unsigned>(splits));
  if (which == AttnKernel::attention) {
    constexpr int bytes = attn_smem_bytes<D>(4);
    if (const Status s = from_cuda(cudaFuncSetAttribute(sparse_attention_kernel<T, D>,
                                                        cudaFuncAttributeMaxDynamicSharedMemorySize, bytes),
                                   "sparse_attention: cudaFuncSetAttribute");
        s != Status::success)
      return s;
    sparse_attention_kernel<T, D><<<grid, kAttnThreads, bytes, stream>>>(params);
    return launch_status("sparse_attention_kernel");
  }
  if (which == AttnKernel::combine) {
    const std::int64_t pairs = static_cast<std::int64_t>(params.num_queries) * params.num_q_heads;
    const auto blocks = static_cast<unsigned>((pairs + kAttnThreads / 32 - 1) / (kAttnThreads / 32));
    sparse_attention_combine_kernel<T, D><<<blocks, kAttnThreads, 0, stream>>>(params, splits);
    return launch_status("sparse_attention_combine_kernel");
  }
  if (which == AttnKernel::self_mass) {
    const std::int64_t warps = params.num_queries;
    const auto blocks = static_cast<unsigned>((warps + kAttnThreads / 32 - 1) / (kAttnThreads / 32));
    sparse_attention_self_mass_kernel<T, D><<<blocks, kAttnThreads, 0, stream>>>(params);
    return launch_status("sparse_attention_self_mass_kernel");
  }
  constexpr int bytes = attn_smem_bytes<D>(2);
  if (const Status s = from_cuda(cudaFuncSetAttribute(sparse_attention_mass_kernel<T, D>,
                                                      cudaFuncAttributeMaxDynamicSharedMemorySize, bytes),
                                 "sparse_attention: cudaFuncSetAttribute");
      s != Status::success)
    return s;
  sparse_attention_mass_kernel<T, D><<<grid, kAttnThreads, bytes, stream>>>(params);
  return launch_status("sparse_attention_mass_kernel");
}

template <class T>
Status sparse_attention_typed(const SparseAttentionArgs& a, cudaStream_t stream) {
  int sm_count = 0;
  if (const Status s = attn_sm_count(sm_count); s != Status::success) return s;
  const AttnSplitPlan plan = attn_split_plan(a, sm_count);
  const bool split = plan.splits > 1 && a.workspace != nullptr && a.workspace_bytes >= attn_split_bytes(a, plan.splits);
  const int all_tiles = static_cast<int>(std::max<std::int64_t>(1, (a.num_keys + kAttnBlockN - 1) / kAttnBlockN));

  AttnParams<T> p{};
  p.q = static_cast<const T*>(a.q);
  p.k = static_cast<const T*>(a.k);
  p.v = static_cast<const T*>(a.v);
  p.o = static_cast<T*>(a.o);
  p.q_pos = a.q_pos;
  p.k_pos = a.k_pos;
  p.lse = a.lse;
  p.chunk_starts = a.chunk_starts;
  p.mass = a.mass;
  p.self_rows = a.self_rows;
  p.self_mass = a.self_mass;
  p.query_mass = a.query_mass;
  p.query_begin = static_cast<int>(a.query_begin);
  p.query_end = static_cast<int>(a.query_end);
  p.part_o = split ? static_cast<float*>(a.workspace) : nullptr;
  p.part_lse = split ? p.part_o + static_cast<std::int64_t>(plan.splits) * a.num_queries * a.num_q_heads * a.head_dim
                     : nullptr;
  p.q_ts = a.q_token_stride;
  p.q_hs = a.q_head_stride;
  p.k_ts = a.k_token_stride;
  p.k_hs = a.k_head_stride;
  p.v_ts = a.v_token_stride;
  p.v_hs = a.v_head_stride;
  p.o_ts = a.o_token_stride;
  p.o_hs = a.o_head_stride;
  p.num_queries = static_cast<int>(a.num_queries);
  p.num_keys = static_cast<int>(a.num_keys);
  p.num_q_heads = static_cast<int>(a.num_q_heads);
  p.group = static_cast<int>(a.num_q_heads / a.num_kv_heads);
  p.num_chunks = static_cast<int>(a.num_chunks);
  p.kv_tiles_per_split = split ? plan.tiles_per_split : all_tiles;
  p.score_factor = kvfuse::detail::attention_score_factor(a.scale);
  const auto run = [&](AttnKernel which, int splits) {
    return a.head_dim == 64 ? launch_attention_kernel<T, 64>(which, p, splits, stream)
                            : launch_attention_kernel<T, 128>(which, p, splits, stream);
  };
  if (const Status s = run(AttnKernel::attention, split ? plan.splits : 1); s != Status::success) return s;
  if (split)
    if (const Status s = run(AttnKernel::combine, plan.splits); s != Status::success) return s;
  if (a.self_mass != nullptr)
    if (const Status s = run(AttnKernel::self_mass, 1); s != Status::success) return s;
  if (a.num_chunks > 0)
    if (const Status s = from_cuda(cudaMemsetAsync(a.mass, 0,
                                                   static_cast<std::size_t>(a.num_queries * a.num_chunks) * 4, stream),
                                   "sparse_attention: zeroing mass");
        s != Status::success)
      return s;
  if (a.query_mass != nullptr && a.num_keys > 0)
    if (const Status s = from_cuda(cudaMemsetAsync(a.query_mass, 0, static_cast<std::size_t>(a.num_keys) * 4, stream),
                                   "sparse_attention: zeroing query_mass");
        s != Status::success)
      return s;
  if (a.num_chunks == 0 && (a.query_mass == nullptr || a.query_begin == a.query_end)) return Status::success;
  p.kv_tiles_per_split = plan.tiles_per_split;  // the mass kernel splits without a workspace
  return run(AttnKernel::mass, plan.splits);
}

// Refuses, as unsupported, what the kernel does not implement (validate() already passed).
inline Status check_kernel_support(const SparseAttentionArgs& a) noexcept {
  if (a.dtype != DType::bf16 && a.dtype != DType::f16)
    return refuse(Status::unsupported, "sparse_attention: dtype %s is not supported by the kernel (bf16, f16)",
                  dtype_name(a.dtype));
  if (a.head_dim != 64 && a.head_dim != 128)
    return refuse(Status::unsupported, "sparse_attention: head_dim %lld is not supported by the kernel (64, 128)",
                  static_cast<long long>(a.head_dim));
  if (a.num_queries > (std::int64_t{1} << 30) || a.num_keys > (std::int64_t{1} << 30))
    return refuse(Status::unsupported, "sparse_attention: %lld queries or %lld keys exceed the kernel's 2^30",
                  static_cast<long long>(a.num_queries), static_cast<long long>(a.num_keys));
  if ((a.num_queries + kAttnBlockM - 1) / kAttnBlockM * a.num_q_heads > std::int64_t{0x7fffffff})
    return refuse(Status::unsupported,
                  "sparse_attention: %lld query tiles x %lld heads exceed the grid limit 2^31 - 1 blocks",
                  static_cast<long long>((a.num_queries + kAttnBlockM - 1) / kAttnBlockM),
                  static_cast<long long>(a.num_q_heads));
  const struct {
    const char* name;
    std::int64_t value;
  } strides[] = {{"q_token_stride", a.q_token_stride}, {"q_head_stride", a.q_head_stride},
                 {"k_token_stride", a.k_token_stride}, {"k_head_stride", a.k_head_stride},
                 {"v_token_stride", a.v_token_stride}, {"v_head_stride", a.v_head_stride},
                 {"o_token_stride", a.o_token_stride}, {"o_head_stride", a.o_head_stride}};
  for (const auto& s : strides)
    if (s.value % 8 != 0)
      return refuse(Status::unsupported, "sparse_attention: %s %lld is not a multiple of 8 elements (16 bytes)",
                    s.name, static_cast<long long>(s.value));
  const struct {
    const char* name;
    const void* ptr;
  } pointers[] = {{"q", a.q}, {"k", a.k}, {"v", a.v}, {"o", a.o}, {"workspace", a.workspace}};
  for (const auto& x : pointers)
    if (reinterpret_cast<std::uintptr_t>(x.ptr) % 16 != 0)
      return refuse(Status::unsupported, "sparse_attention: %s %p is not 16-byte aligned", x.name, x.ptr);
  return Status::success;
}

}  // namespace impl

// Bytes of workspace with which sparse_attention(args) on the current device splits the KV loops of its
// blocks over several blocks (few selected queries: S/64 x Hq blocks would leave SMs idle); 0 when it
// would not split, or when args are invalid or unsupported. Pass a device buffer of at least this size
// (16-byte aligned) as args.workspace / workspace_bytes; without it the launcher does not split.
[[nodiscard]] inline std::int64_t sparse_attention_workspace_bytes(const SparseAttentionArgs& args) noexcept {
  if (kvfuse::validate(args) != Status::success) return 0;
  const SparseAttentionArgs a = kvfuse::resolved(args);
  if (impl::check_kernel_support(a) != Status::success) return 0;
  int sm_count = 0;
  if (impl::attn_sm_count(sm_count) != Status::success) return 0;
  const impl::AttnSplitPlan plan = impl::attn_split_plan(a, sm_count);
  return plan.splits > 1 ? impl::attn_split_bytes(a, plan.splits) : 0;
}

// Sparse-query attention on device pointers (see kvfuse/kernel_args/sparse_attention.hpp for the semantics):
// writes O and LSE, with num_chunks > 0 the chunk mass, with query_mass the query mass (one more kernel for
// both; mass and query_mass are zeroed first, on the same stream) and with self_mass the self mass (a small
// kernel). Preconditions that are not checked (device data): pos_k non-decreasing; chunk_starts
// non-decreasing within [0, N]; self_rows within [0, N); finite inputs. Asynchronous: returns after
// enqueueing on `stream`.
[[nodiscard]] inline Status sparse_attention(const SparseAttentionArgs& args, cudaStream_t stream = nullptr) noexcept {
  if (const Status s = kvfuse::validate(args); s != Status::success) return s;
  const SparseAttentionArgs a = kvfuse::resolved(args);
  if (const Status s = impl::check_kernel_support(a); s != Status::success) return s;
  if (a.num_queries == 0)  // no query puts weight on any key
    return a.query_mass == nullptr || a.num_keys == 0
               ? Status::success
               : from_cuda(cudaMemsetAsync(a.query_mass, 0, static_cast<std::size_t>(a.num_keys) * 4, stream),
                           "sparse_attention: zeroing query_mass");
  if (a.dtype == DType::bf16) return impl::sparse_attention_typed<kvfuse::bf16>(a, stream);
  return impl::sparse_attention_typed<kvfuse::f16>(a, stream);
}

}  // namespace kvfuse::cuda
