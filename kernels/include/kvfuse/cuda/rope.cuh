#pragma once
// RoPE kernels: apply (Q and K), inverse (un-rotate cached K), and shift (move cached K from old to new
// positions with ONE rotation by Δ = new − old). Arguments, layouts and validation: kvfuse/kernel_args/
// rope.hpp (RopeArgs, shared with the CPU references); element math: detail/rope.hpp (fp32 angles exact
// below position 2^24, sincosf, explicit-fma rotation, one RNE rounding at the store).
//
//   kvfuse::RopeArgs a;
//   a.dtype = kvfuse::DType::bf16;  a.pairing = kvfuse::RopePairing::half_split;  a.head_dim = 128;
//   a.num_tokens = n;  a.num_heads = 8;  a.num_layers = 1;
//   a.in = a.out = k;  a.in_strides = a.out_strides = kvfuse::rope_nhd_strides(n, 8, 128);
//   a.positions = d_positions;
//   kvfuse::RopeFrequencyConfig f;  f.head_dim = 128;  f.base = 500000.0;
//   kvfuse::rope_frequencies(f, a.theta);   // a Status too
//   if (kvfuse::cuda::rope_apply(a, stream) != kvfuse::Status::success) ... kvfuse::last_status_message()
//
// Work split: a thread owns one token and one slice of its pairs (one 16-byte vector, or for half_split
// the two vectors at e and e + d/2; 8 / 16 / 32 / 64 threads per token), computes their cos / sin once
// (while its first loads are in flight), then rotates that slice in a run of (layer, head) items, loading
// up to 4 vectors before storing so several loads are in flight (in place is safe: a thread reads its
// elements before writing them, and no other thread touches them). While the token threads alone would
// not fill the GPU (~2^18 threads), the (layer, head) items are split across blockIdx.y; larger chunks give
// each thread every item, so the transcendental cost is paid once per (token, pair). 256 threads a block,
// at most 64 registers (4 blocks per SM), no spills; the 32-byte stack frame is sincosf's large-argument
// path, which the reduced angle (|r| <= ~3.6) never takes.

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "kvfuse/core/dtype.hpp"
#include "kvfuse/cuda/status.cuh"
#include "kvfuse/detail/rope.hpp"
#include "kvfuse/kernel_args/rope.hpp"

namespace kvfuse::cuda {

namespace impl {

inline constexpr int rope_block = 256;
// Threads the launcher aims for before it gives each thread every (layer, head) item: about one full
// wave of a large GPU (132 SMs x 2048).
inline constexpr long long rope_target_threads = 1LL << 18;

// Storage element -> float for one 16-byte vector (4 floats or 8 halves).
template <class T>
__device__ __forceinline__ void rope_unpack(const uint4& v, float* x) {
  const std::uint32_t w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    if constexpr (sizeof(T) == 4) {
      x[k] = __uint_as_float(w[k]);
    } else if constexpr (kvfuse::detail::is_bf16<T>) {
      x[2 * k] = __uint_as_float(w[k] << 16);
      x[2 * k + 1] = __uint_as_float(w[k] & 0xffff0000u);
    } else {
      x[2 * k] = __half2float(__ushort_as_half(static_cast<unsigned short>(w[k] & 0xffffu)));
      x[2 * k + 1] = __half2float(__ushort_as_half(static_cast<unsigned short>(w[k] >> 16)));
    }
  }
}

// float -> storage for one 16-byte vector, round to nearest even (what kvfuse::from_float<T> does).
template <class T>
__device__ __forceinline__ uint4 rope_pack(const float* x) {
  std::uint32_t w[4];
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    if constexpr (sizeof(T) == 4) {
      w[k] = __float_as_uint(x[k]);
    } else if constexpr (kvfuse::detail::is_bf16<T>) {
      const __nv_bfloat162 r = __floats2bfloat162_rn(x[2 * k], x[2 * k + 1]);
      w[k] = static_cast<std::uint32_t>(__bfloat16_as_ushort(r.x)) |
             (static_cast<std::uint32_t>(__bfloat16_as_ushort(r.y)) << 16);
    } else {
      const __half2 r = __floats2half2_rn(x[2 * k], x[2 * k + 1]);
      w[k] = static_cast<std::uint32_t>(__half_as_ushort(r.x)) | (static_cast<std::uint32_t>(__half_as_ushort(r.y)) << 16);
    }
  }
  return make_uint4(w[0], w[1], w[2], w[3]);
}

template <class T, kvfuse::RopePairing Pairing, int HeadDim>
struct RopeShape {
  static constexpr int vector = 16 / static_cast<int>(sizeof(T));                      // elements per vector
  static constexpr bool split = Pairing == kvfuse::RopePairing::half_split;
  static constexpr int vectors = split ? 2 : 1;                                        // per thread and item
  static constexpr int pairs = split ? vector : vector / 2;                            // per thread
  static constexpr int lanes = HeadDim / (vector * vectors);                           // threads per token
  static constexpr int batch = 4 / vectors;                                            // items loaded at once
  static_assert(lanes >= 1 && rope_block % lanes == 0);
};

// grid.x covers num_tokens x lanes threads; blockIdx.y picks items [y·items_per_thread, ...) of the
// num_layers x num_heads (layer-major) items.
template <class T, kvfuse::RopePairing Pairing, int HeadDim>
__global__ void __launch_bounds__(rope_block, 4) rope_kernel(const RopeArgs args, RopeOp op, int items_per_thread) {
  using Shape = RopeShape<T, Pairing, HeadDim>;
  constexpr int V = Shape::vector;
  const long long g = static_cast<long long>(blockIdx.x) * rope_block + threadIdx.x;
  const long long t = g / Shape::lanes;
  const int lane = static_cast<int>(g % Shape::lanes);
  if (t >= args.num_tokens) return;

  std::int32_t p = args.positions[t];
  if (op == RopeOp::inverse) {
    p = -p;
  } else if (op == RopeOp::shift) {
    p = static_cast<std::int32_t>(static_cast<long long>(args.new_positions[t]) - p);
  }
  const int pair0 = lane * Shape::pairs;
  float cos_phi[Shape::pairs];
  float sin_phi[Shape::pairs];

  // Interleaved: the vector at element lane·V holds pairs lane·V/2 ..; half_split: the vectors at lane·V
  // and lane·V + d/2 hold pairs lane·V .. (element j of each).
  const T* in = static_cast<const T*>(args.in) + t * args.in_strides.token + lane * V;
  T* out = static_cast<T*>(args.out) + t * args.out_strides.token + lane * V;
  const int heads = static_cast<int>(args.num_heads);
  const int items = heads * static_cast<int>(args.num_layers);
  const int begin = static_cast<int>(blockIdx.y) * items_per_thread;
  const int end = items - begin > items_per_thread ? begin + items_per_thread : items;
  int layer = begin / heads;
  int head = begin % heads;
  for (int m = begin; m < end; m += Shape::batch) {
    uint4 v[Shape::batch][Shape::vectors];
    long long out_offset[Shape::batch];
#pragma unroll
    for (int k = 0; k < Shape::batch; ++k) {
      out_offset[k] = 0;
      if (m + k < end) {
        const long long in_offset = layer * args.in_strides.layer + head * args.in_strides.head;
        out_offset[k] = layer * args.out_strides.layer + head * args.out_strides.head;
#pragma unroll
        for (int q = 0; q < Shape::vectors; ++q)
          v[k][q] = *reinterpret_cast<const uint4*>(in + in_offset + q * (HeadDim / 2));
        if (++head == heads) {
          head = 0;
          ++layer;
        }
      }
    }
    if (m == begin) {  // cos / sin once, while the first batch of loads is in flight
#pragma unroll
      for (int j = 0; j < Shape::pairs; ++j)
        kvfuse::detail::rope_cos_sin_f32(p, args.theta[pair0 + j], cos_phi[j], sin_phi[j]);
    }
#pragma unroll
    for (int k = 0; k < Shape::batch; ++k) {
      if (m + k < end) {
        float x[Shape::vectors][V];
#pragma unroll
        for (int q = 0; q < Shape::vectors; ++q) rope_unpack<T>(v[k][q], x[q]);
        if constexpr (Shape::split) {
#pragma unroll
          for (int j = 0; j < V; ++j)
            kvfuse::detail::rope_rotate_pair_f32(x[0][j], x[1][j], cos_phi[j], sin_phi[j]);
        } else {
#pragma unroll
          for (int j = 0; j < V / 2; ++j)
            kvfuse::detail::rope_rotate_pair_f32(x[0][2 * j], x[0][2 * j + 1], cos_phi[j], sin_phi[j]);
        }
#pragma unroll
        for (int q = 0; q < Shape::vectors; ++q)
          *reinterpret_cast<uint4*>(out + out_offset[k] + q * (HeadDim / 2)) = rope_pack<T>(x[q]);
      }
    }
  }
}

template <class T, kvfuse::RopePairing Pairing, int HeadDim>
Status rope_launch(const RopeArgs& a, RopeOp op, cudaStream_t stream) noexcept {
  using Shape = RopeShape<T, Pairing, HeadDim>;
  const long long threads = a.num_tokens * Shape::lanes;
  const long long items = a.num_heads * a.num_layers;
  // Split the items across blockIdx.y only while the token threads alone leave the GPU short of work.
  long long splits = (rope_target_threads + threads - 1) / threads;
  splits = splits < 1 ? 1 : (splits > items ? items : splits);
  long long per_thread = (items + splits - 1) / splits;
  const long long min_per_thread = (items + 65534) / 65535;  // gridDim.y <= 65535
  if (per_thread < min_per_thread) per_thread = min_per_thread;
  const dim3 grid(static_cast<unsigned>((threads + rope_block - 1) / rope_block),
                  static_cast<unsigned>((items + per_thread - 1) / per_thread));
  rope_kernel<T, Pairing, HeadDim><<<grid, rope_block, 0, stream>>>(a, op, static_cast<int>(per_thread));
  return launch_status(rope_op_name(op));
}

template <class T, kvfuse::RopePairing Pairing>
Status rope_dispatch_head_dim(const RopeArgs& a, RopeOp op, cudaStream_t stream) noexcept {
  switch (a.head_dim) {
    case 64: return rope_launch<T, Pairing, 64>(a, op, stream);
    case 128: return rope_launch<T, Pairing, 128>(a, op, stream);
    default: return rope_launch<T, Pairing, 256>(a, op, stream);  // validate() admits 64, 128, 256 only
  }
}

template <class T>
Status rope_dispatch_pairing(const RopeArgs& a, RopeOp op, cudaStream_t stream) noexcept {
  if (a.pairing == kvfuse::RopePairing::interleaved)
    return rope_dispatch_head_dim<T, kvfuse::RopePairing::interleaved>(a, op, stream);
  return rope_dispatch_head_dim<T, kvfuse::RopePairing::half_split>(a, op, stream);
}

inline Status rope_run(const RopeArgs& a, RopeOp op, cudaStream_t stream) noexcept {
  if (const Status s = validate(a, op); s != Status::success) return s;
  if (a.num_tokens == 0 || a.num_heads == 0 || a.num_layers == 0) return Status::success;
  switch (a.dtype) {
    case DType::f32: return rope_dispatch_pairing<float>(a, op, stream);
    case DType::f16: return rope_dispatch_pairing<kvfuse::f16>(a, op, stream);
    case DType::bf16: break;
  }
  return rope_dispatch_pairing<kvfuse::bf16>(a, op, stream);
}

}  // namespace impl

// Rotates every (layer, token, head) row of args.in by positions[t]·θ_i into args.out (RoPE of Q or K).
// Device pointers; asynchronous on `stream`. Refusals (validate()) launch nothing.
[[nodiscard]] inline Status rope_apply(const RopeArgs& args, cudaStream_t stream = nullptr) noexcept {
  return impl::rope_run(args, RopeOp::apply, stream);
}

// Rotates by −positions[t]·θ_i: undoes rope_apply at the same positions.
[[nodiscard]] inline Status rope_inverse(const RopeArgs& args, cudaStream_t stream = nullptr) noexcept {
  return impl::rope_run(args, RopeOp::inverse, stream);
}

// Rotates by (new_positions[t] − positions[t])·θ_i: K rotated at the old positions becomes K rotated at the
// new ones, in one rotation.
[[nodiscard]] inline Status rope_shift(const RopeArgs& args, cudaStream_t stream = nullptr) noexcept {
  return impl::rope_run(args, RopeOp::shift, stream);
}

}  // namespace kvfuse::cuda
