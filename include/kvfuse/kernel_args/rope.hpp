#pragma once
// RoPE kernels' arguments, validation and float frequency table. The CUDA launchers (kvfuse/cuda/rope.cuh) and
// the CPU references of the test harness (kvfuse::ref::rope_apply, rope_inverse, rope_shift in
// harness/include/kvfuse/harness/ref/rope.hpp) take the same RopeArgs, run the same validate(), and the same
// element math (detail/rope.hpp, fp32 angles).
//
// Layout. A RoPE tensor is a strided view [layer][token][head][head_dim] of fp32, fp16 or bf16 storage:
// element (l, t, h, e) lives at data[l·layer + t·token + h·head + e] (strides in elements, head_dim
// elements contiguous). The usual layouts:
//   NHD  [tokens][heads][d]          rope_nhd_strides(): token = H·d, head = d
//   HND  [heads][tokens][d]          rope_hnd_strides(): token = d,   head = N·d
//   layers of either, one after the other: layer = N·H·d, so one launch rotates a chunk's K in every layer
//   a fused QKV row [Hq + 2·Hkv][d]: token = (Hq + 2·Hkv)·d, head = d, num_heads = Hq + Hkv rotates Q
//   and K in one launch (V, the last Hkv heads, is not touched).
// Positions are per token (int32, arbitrary order, shared by every layer and head).
// Input and output have their own strides: out == in (same strides) rotates in place; otherwise the two
// views must not overlap. Strides must keep 16-byte vectors aligned (multiples of 16 bytes) and the view's
// rows apart (see validate()).
//
// Operations (Δ and p per token; the kernels compute one rotation per pair, angle = p·θ_i):
//   rope_apply    angle  positions[t]·θ_i                       (Q and K before attention)
//   rope_inverse  angle −positions[t]·θ_i                       (un-rotate cached K)
//   rope_shift    angle (new_positions[t] − positions[t])·θ_i   (move cached K from old to new positions
//                 with ONE rotation: R(Δθ)·R(pθ) = R((p + Δ)θ))
// θ_i per pair comes from rope_frequencies() (core/rope.hpp: base, optional linear or Llama-3.1 scaling,
// the table the CPU backend uses too), rounded to float once (the float overload here) and carried by
// value in RopeArgs::theta. Positions and Δ must satisfy |p| < 2^24 (the float angle is exact there); the
// references refuse others, the kernels cannot read device positions before launching and lose accuracy
// beyond that range (memory-safe).
//
// Host-only, fmt-free and CUDA-free: includes no CUDA header, refuses with kvfuse::refuse().

#include <cstdint>

#include "kvfuse/core/dtype.hpp"
#include "kvfuse/core/rope.hpp"
#include "kvfuse/core/status.hpp"
#include "kvfuse/detail/rope.hpp"

namespace kvfuse {

// Pairs of the largest supported head (256): the size of the frequency table.
inline constexpr int rope_max_pairs = 128;

// Strides in elements of one side (input or output) of a RoPE view; layer is unused when num_layers == 1.
struct RopeStrides {
  std::int64_t token = 0;
  std::int64_t head = 0;
  std::int64_t layer = 0;
};

// Arguments of rope_apply / rope_inverse / rope_shift, shared by the CUDA launchers and the references.
struct RopeArgs {
  DType dtype = DType::bf16;  // storage of in and out; math in fp32, one RNE rounding at the store
  RopePairing pairing = RopePairing::half_split;
  std::int64_t head_dim = 128;  // 64, 128 or 256
  std::int64_t num_tokens = 0;  // 0 (or no heads / layers): nothing to do, success
  std::int64_t num_heads = 0;
  std::int64_t num_layers = 1;

  const void* in = nullptr;
  RopeStrides in_strides;
  void* out = nullptr;  // == in: in place (out_strides must equal in_strides)
  RopeStrides out_strides;

  const std::int32_t* positions = nullptr;      // num_tokens positions; rope_shift: the old positions
  const std::int32_t* new_positions = nullptr;  // rope_shift only: the new positions (else nullptr)

  float theta[rope_max_pairs] = {};  // θ_i of the head_dim / 2 pairs, from rope_frequencies()
};

enum class RopeOp : int { apply = 0, inverse = 1, shift = 2 };

[[nodiscard]] inline const char* rope_op_name(RopeOp op) noexcept {
  switch (op) {
    case RopeOp::apply: return "rope_apply";
    case RopeOp::inverse: return "rope_inverse";
    case RopeOp::shift: return "rope_shift";
  }
  return "rope";
}

// NHD strides: [tokens][heads][head_dim] per layer, layers one after the other.
[[nodiscard]] inline RopeStrides rope_nhd_strides(std::int64_t num_tokens, std::int64_t num_heads,
                                                  std::int64_t head_dim) noexcept {
  return {num_heads * head_dim, head_dim, num_tokens * num_heads * head_dim};
}

// HND strides: [heads][tokens][head_dim] per layer, layers one after the other.
[[nodiscard]] inline RopeStrides rope_hnd_strides(std::int64_t num_tokens, std::int64_t num_heads,
                                                  std::int64_t head_dim) noexcept {
  return {head_dim, num_tokens * head_dim, num_tokens * num_heads * head_dim};
}

namespace rope_checks {

// The head sizes the kernels (and RopeArgs::theta) support.
[[nodiscard]] inline Status check_head_dim(const char* what, std::int64_t head_dim) noexcept {
  if (head_dim <= 0 || head_dim % 2 != 0)
    return refuse(Status::invalid_argument, "%s: head_dim %lld is not a positive even number", what,
                  static_cast<long long>(head_dim));
  if (head_dim != 64 && head_dim != 128 && head_dim != 256)
    return refuse(Status::unsupported, "%s: head_dim %lld is not 64, 128 or 256", what,
                  static_cast<long long>(head_dim));
  return Status::success;
}

// Checks one side (input or output) of the view: sizes, alignment, non-overlapping rows, total extent.
[[nodiscard]] inline Status check_view(const char* what, const char* side, const void* data, const RopeStrides& s,
                                       const RopeArgs& a) noexcept {
  if (data == nullptr) return refuse(Status::invalid_argument, "%s: %s pointer is null", what, side);
  const int elem = dtype_size(a.dtype);
  const auto address = reinterpret_cast<std::uintptr_t>(data);
  if (address % 16 != 0)
    return refuse(Status::invalid_argument, "%s: %s pointer %p is not 16-byte aligned", what, side, data);
  // Dimensions of extent > 1 only: a stride of a dimension of extent 1 is never used.
  struct Dim {
    const char* name;
    std::int64_t stride;
    std::int64_t extent;
  };
  Dim dims[3] = {{"token", s.token, a.num_tokens}, {"head", s.head, a.num_heads}, {"layer", s.layer, a.num_layers}};
  int n = 0;
  Dim used[3] = {};
  for (const Dim& d : dims) {
    if (d.extent <= 1) continue;
    if (d.stride < 0)
      return refuse(Status::invalid_argument, "%s: %s %s stride %lld is negative", what, side, d.name,
                    static_cast<long long>(d.stride));
    if (d.stride > (std::int64_t{1} << 50))
      return refuse(Status::invalid_argument, "%s: %s %s stride %lld is too large", what, side, d.name,
                    static_cast<long long>(d.stride));
    if ((d.stride * elem) % 16 != 0)
      return refuse(Status::invalid_argument,
                    "%s: %s %s stride %lld elements (%lld bytes) is not a multiple of 16 bytes", what, side, d.name,
                    static_cast<long long>(d.stride), static_cast<long long>(d.stride * elem));
    used[n++] = d;
  }
  // Rows must not overlap: sorted by stride, each stride spans the previous dimension entirely (the
  // innermost dimension being the head_dim contiguous elements).
  for (int i = 1; i < n; ++i) {  // insertion sort of at most 3 dimensions
    for (int j = i; j > 0 && used[j].stride < used[j - 1].stride; --j) {
      const Dim swap = used[j];
      used[j] = used[j - 1];
      used[j - 1] = swap;
    }
  }
  std::int64_t span = a.head_dim;
  const char* inner = "head_dim";
  for (int i = 0; i < n; ++i) {
    if (used[i].stride < span)
      return refuse(Status::invalid_argument,
                    "%s: %s %s stride %lld is smaller than %lld elements (the %s it steps over): rows overlap", what,
                    side, used[i].name, static_cast<long long>(used[i].stride), static_cast<long long>(span), inner);
    const double total = static_cast<double>(used[i].stride) * static_cast<double>(used[i].extent);
    if (total > 0x1p60)
      return refuse(Status::invalid_argument, "%s: %s view spans more than 2^60 elements", what, side);
    span = used[i].stride * used[i].extent;
    inner = used[i].name;
  }
  return Status::success;
}

// Byte range [begin, end) covered by a valid view.
inline void view_range(const void* data, const RopeStrides& s, const RopeArgs& a, std::uintptr_t& begin,
                       std::uintptr_t& end) noexcept {
  std::int64_t last = a.head_dim;
  if (a.num_tokens > 1) last += s.token * (a.num_tokens - 1);
  if (a.num_heads > 1) last += s.head * (a.num_heads - 1);
  if (a.num_layers > 1) last += s.layer * (a.num_layers - 1);
  begin = reinterpret_cast<std::uintptr_t>(data);
  end = begin + static_cast<std::uintptr_t>(last) * static_cast<std::uintptr_t>(dtype_size(a.dtype));
}

[[nodiscard]] inline bool same_strides(const RopeArgs& a) noexcept {
  return (a.num_tokens <= 1 || a.in_strides.token == a.out_strides.token) &&
         (a.num_heads <= 1 || a.in_strides.head == a.out_strides.head) &&
         (a.num_layers <= 1 || a.in_strides.layer == a.out_strides.layer);
}

}  // namespace rope_checks

// The kernels' frequency table: rope_frequencies(c, double*) (core/rope.hpp, the one formula) rounded to
// float once, for RopeArgs::theta. head_dim must also be one the kernels support (64, 128 or 256: other
// even values are unsupported). Refuses what the double table refuses; writes nothing then.
[[nodiscard]] inline Status rope_frequencies(const RopeFrequencyConfig& c, float* theta) noexcept {
  if (const Status s = rope_checks::check_head_dim("rope_frequencies", c.head_dim); s != Status::success) return s;
  if (theta == nullptr) return refuse(Status::invalid_argument, "rope_frequencies: theta pointer is null");
  double exact[rope_max_pairs];
  if (const Status s = rope_frequencies(c, exact); s != Status::success) return s;
  for (std::int64_t i = 0; i < c.head_dim / 2; ++i) theta[i] = static_cast<float>(exact[i]);
  return Status::success;
}

// Validates RoPE arguments for `op`; the launchers and the references both call it. Checks: dtype and
// pairing in their enums; head_dim 64/128/256 (odd or <= 0: invalid_argument, other even: unsupported);
// counts >= 0; with work to do (tokens, heads and layers all > 0): non-null in, out and positions
// (new_positions exactly for rope_shift), 16-byte aligned pointers, strides of every dimension of extent > 1
// non-negative multiples of 16 bytes that keep rows apart (sorted by stride, each stride >= the span of
// the dimension below it, innermost head_dim), in place only with equal strides, out of place only with
// disjoint byte ranges, θ_0 .. θ_{d/2−1} positive and finite. Positions themselves are device data for the
// kernels; the references check them separately (check_positions).
[[nodiscard]] inline Status validate(const RopeArgs& a, RopeOp op) noexcept {
  const char* what = rope_op_name(op);
  if (a.dtype != DType::f32 && a.dtype != DType::f16 && a.dtype != DType::bf16)
    return refuse(Status::unsupported, "%s: dtype %d is not f32, f16 or bf16", what, static_cast<int>(a.dtype));
  if (a.pairing != RopePairing::interleaved && a.pairing != RopePairing::half_split)
    return refuse(Status::unsupported, "%s: pairing %d is not interleaved or half_split", what,
                  static_cast<int>(a.pairing));
  if (const Status s = rope_checks::check_head_dim(what, a.head_dim); s != Status::success) return s;
  if (a.num_tokens < 0 || a.num_tokens > INT32_MAX)
    return refuse(Status::invalid_argument, "%s: num_tokens %lld is outside [0, 2^31)", what,
                  static_cast<long long>(a.num_tokens));
  if (a.num_heads < 0 || a.num_heads > INT32_MAX)
    return refuse(Status::invalid_argument, "%s: num_heads %lld is outside [0, 2^31)", what,
                  static_cast<long long>(a.num_heads));
  if (a.num_layers < 0 || a.num_layers > INT32_MAX)
    return refuse(Status::invalid_argument, "%s: num_layers %lld is outside [0, 2^31)", what,
                  static_cast<long long>(a.num_layers));
  if (a.num_heads * a.num_layers > INT32_MAX)
    return refuse(Status::invalid_argument, "%s: num_heads %lld x num_layers %lld exceeds 2^31 - 1", what,
                  static_cast<long long>(a.num_heads), static_cast<long long>(a.num_layers));
  if (op != RopeOp::shift && a.new_positions != nullptr)
    return refuse(Status::invalid_argument, "%s: new_positions must be null (only rope_shift uses it)", what);
  if (a.num_tokens == 0 || a.num_heads == 0 || a.num_layers == 0) return Status::success;

  if (a.positions == nullptr) return refuse(Status::invalid_argument, "%s: positions pointer is null", what);
  if (op == RopeOp::shift && a.new_positions == nullptr)
    return refuse(Status::invalid_argument, "%s: new_positions pointer is null", what);
  if (const Status s = rope_checks::check_view(what, "in", a.in, a.in_strides, a); s != Status::success) return s;
  if (const Status s = rope_checks::check_view(what, "out", a.out, a.out_strides, a); s != Status::success) return s;
  if (a.out == a.in) {
    if (!rope_checks::same_strides(a))
      return refuse(Status::invalid_argument,
                    "%s: in place (out == in) needs out strides equal to in strides (token %lld/%lld, head "
                    "%lld/%lld, layer %lld/%lld)",
                    what, static_cast<long long>(a.out_strides.token), static_cast<long long>(a.in_strides.token),
                    static_cast<long long>(a.out_strides.head), static_cast<long long>(a.in_strides.head),
                    static_cast<long long>(a.out_strides.layer), static_cast<long long>(a.in_strides.layer));
  } else {
    std::uintptr_t in_begin = 0, in_end = 0, out_begin = 0, out_end = 0;
    rope_checks::view_range(a.in, a.in_strides, a, in_begin, in_end);
    rope_checks::view_range(a.out, a.out_strides, a, out_begin, out_end);
    if (in_begin < out_end && out_begin < in_end)
      return refuse(Status::invalid_argument, "%s: out %p overlaps in %p (out of place needs disjoint views)", what,
                    static_cast<void*>(a.out), a.in);
  }
  for (std::int64_t i = 0; i < a.head_dim / 2; ++i) {
    if (!rope_checks::positive_finite(static_cast<double>(a.theta[i])))
      return refuse(Status::invalid_argument,
                    "%s: theta[%lld] = %g is not a positive finite frequency (fill it with rope_frequencies)", what,
                    static_cast<long long>(i), static_cast<double>(a.theta[i]));
  }
  return Status::success;
}

// The references' check of host positions: |positions[t]| (and for rope_shift |new_positions[t]| and
// |new − old|) at most detail::rope_max_position. Call after validate().
[[nodiscard]] inline Status check_positions(const RopeArgs& a, RopeOp op) noexcept {
  const char* what = rope_op_name(op);
  const std::int64_t limit = detail::rope_max_position;
  for (std::int64_t t = 0; t < a.num_tokens; ++t) {
    const std::int64_t p = a.positions[t];
    if (p < -limit || p > limit)
      return refuse(Status::invalid_argument, "%s: positions[%lld] = %lld is outside +-(2^24 - 1)", what,
                    static_cast<long long>(t), static_cast<long long>(p));
    if (op != RopeOp::shift) continue;
    const std::int64_t q = a.new_positions[t];
    if (q < -limit || q > limit)
      return refuse(Status::invalid_argument, "%s: new_positions[%lld] = %lld is outside +-(2^24 - 1)", what,
                    static_cast<long long>(t), static_cast<long long>(q));
    if (q - p < -limit || q - p > limit)
      return refuse(Status::invalid_argument, "%s: shift new_positions[%lld] - positions[%lld] = %lld is outside "
                    "+-(2^24 - 1)", what, static_cast<long long>(t), static_cast<long long>(t),
                    static_cast<long long>(q - p));
  }
  return Status::success;
}

// The angle multiplier of token t for `op` (positions valid per check_positions).
[[nodiscard]] inline std::int32_t rope_angle_position(const RopeArgs& a, RopeOp op, std::int64_t t) noexcept {
  switch (op) {
    case RopeOp::inverse: return -a.positions[t];
    case RopeOp::shift: return a.new_positions[t] - a.positions[t];
    case RopeOp::apply: break;
  }
  return a.positions[t];
}

}  // namespace kvfuse
