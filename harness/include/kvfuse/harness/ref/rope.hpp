#pragma once
// CPU reference of the RoPE apply / inverse / shift (kvfuse::ref::rope_apply, rope_inverse, rope_shift) kernels: host
// memory, element by element, the same element math as the CUDA kernels, so CI checks the kernels without a GPU
// (tests/emu runs the kernels' own sources against it). Part of kvfuse's test and benchmark harness, not of the
// library: arguments, layouts and validation are kvfuse/kernel_args/rope.hpp, which the launchers
// (kvfuse/cuda/rope.cuh) share.

#include <cstdint>

#include "kvfuse/kernel_args/rope.hpp"

namespace kvfuse {

namespace ref {

namespace rope_detail {

template <class T>
void rotate_all(const RopeArgs& a, RopeOp op) noexcept {
  const std::int64_t d = a.head_dim;
  const std::int64_t pairs = d / 2;
  const auto* in = static_cast<const T*>(a.in);
  auto* out = static_cast<T*>(a.out);
  float cos_phi[rope_max_pairs];
  float sin_phi[rope_max_pairs];
  float x[2 * rope_max_pairs];
  for (std::int64_t t = 0; t < a.num_tokens; ++t) {
    const std::int32_t p = rope_angle_position(a, op, t);
    for (std::int64_t i = 0; i < pairs; ++i) detail::rope_cos_sin_f32(p, a.theta[i], cos_phi[i], sin_phi[i]);
    for (std::int64_t l = 0; l < a.num_layers; ++l) {
      for (std::int64_t h = 0; h < a.num_heads; ++h) {
        const T* src = in + l * a.in_strides.layer + t * a.in_strides.token + h * a.in_strides.head;
        T* dst = out + l * a.out_strides.layer + t * a.out_strides.token + h * a.out_strides.head;
        for (std::int64_t e = 0; e < d; ++e) x[e] = to_float(src[e]);
        for (std::int64_t i = 0; i < pairs; ++i) {
          std::int64_t first = 0;
          std::int64_t second = 0;
          detail::rope_pair(a.pairing, d, i, first, second);
          detail::rope_rotate_pair_f32(x[first], x[second], cos_phi[i], sin_phi[i]);
        }
        for (std::int64_t e = 0; e < d; ++e) dst[e] = from_float<T>(x[e]);
      }
    }
  }
}

[[nodiscard]] inline Status run(const RopeArgs& a, RopeOp op) noexcept {
  if (const Status s = validate(a, op); s != Status::success) return s;
  if (a.num_tokens == 0 || a.num_heads == 0 || a.num_layers == 0) return Status::success;
  if (const Status s = check_positions(a, op); s != Status::success) return s;
  switch (a.dtype) {
    case DType::f32: rotate_all<float>(a, op); break;
    case DType::f16: rotate_all<f16>(a, op); break;
    case DType::bf16: rotate_all<bf16>(a, op); break;
  }
  return Status::success;
}

}  // namespace rope_detail

// CPU references on host memory: the kernels' element math (fp32 angles, detail::rope_cos_sin_f32 and
// rope_rotate_pair_f32, one RNE rounding at the store), element by element.
[[nodiscard]] inline Status rope_apply(const RopeArgs& args) noexcept { return rope_detail::run(args, RopeOp::apply); }
[[nodiscard]] inline Status rope_inverse(const RopeArgs& args) noexcept {
  return rope_detail::run(args, RopeOp::inverse);
}
[[nodiscard]] inline Status rope_shift(const RopeArgs& args) noexcept { return rope_detail::run(args, RopeOp::shift); }

}  // namespace ref
}  // namespace kvfuse
