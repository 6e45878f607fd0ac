// CPU emulation of the RoPE kernels (tests/emu/README.md): the real kernels/include/kvfuse/cuda/rope.cuh,
// transformed by transform_kernel.py and run thread by thread through the launcher, against
// kvfuse::ref::rope_apply / rope_inverse / rope_shift. Both share the element math (detail/rope.hpp), so the
// outputs must be bit-identical, padding between rows included (both start from the same poisoned bytes).
// Covers every dtype x pairing x head_dim x layout (NHD, HND, out of place across layouts) x op, in place and
// out of place, padded strides, several layers, and large chunks where each thread runs every item.
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <random>
#include <vector>

#include "kvfuse/harness/ref/rope.hpp"
#include "rope_emu.cuh"

namespace {

using kvfuse::DType;
using kvfuse::RopeArgs;
using kvfuse::RopeOp;
using kvfuse::RopePairing;
using kvfuse::RopeStrides;
using kvfuse::Status;

// Bytes of a tensor, 16-byte aligned, poisoned with 0xFF.
struct Buffer {
  std::vector<std::uint64_t> words;
  std::uint8_t* data;
  explicit Buffer(std::size_t bytes) : words(bytes / 8 + 4, ~std::uint64_t{0}) {
    data = reinterpret_cast<std::uint8_t*>(words.data());
    data += (16 - reinterpret_cast<std::uintptr_t>(data) % 16) % 16;
  }
};

// NHD or HND strides with 16 bytes of padding after every token row / head block / layer.
RopeStrides padded_strides(bool nhd, int elem_bytes, std::int64_t n, std::int64_t h, std::int64_t d) {
  const std::int64_t pad = 16 / elem_bytes;
  if (nhd) {
    const std::int64_t token = h * d + pad;
    return {token, d, n * token + pad};
  }
  const std::int64_t head = n * d + pad;
  return {d, head, h * head + pad};
}

struct Case {
  DType dtype;
  RopePairing pairing;
  std::int64_t head_dim;
  bool nhd;
  bool in_place;
  std::int64_t tokens, heads, layers;
  RopeOp op;
};

int runs = 0;
int failures = 0;

void describe(const Case& c) {
  std::printf("dtype=%s pairing=%s head_dim=%lld layout=%s %s tokens=%lld heads=%lld layers=%lld op=%s",
              kvfuse::dtype_name(c.dtype), c.pairing == RopePairing::interleaved ? "interleaved" : "half_split",
              static_cast<long long>(c.head_dim), c.nhd ? "NHD" : "HND",
              c.in_place ? "in-place" : "out-of-place(other layout)", static_cast<long long>(c.tokens),
              static_cast<long long>(c.heads), static_cast<long long>(c.layers), kvfuse::rope_op_name(c.op));
}

Status call(bool kernel, RopeOp op, const RopeArgs& a) {
  switch (op) {
    case RopeOp::apply: return kernel ? kvfuse::cuda::rope_apply(a) : kvfuse::ref::rope_apply(a);
    case RopeOp::inverse: return kernel ? kvfuse::cuda::rope_inverse(a) : kvfuse::ref::rope_inverse(a);
    case RopeOp::shift: break;
  }
  return kernel ? kvfuse::cuda::rope_shift(a) : kvfuse::ref::rope_shift(a);
}

// Index of the first differing element (elem_bytes wide) of two byte ranges, or -1.
std::int64_t first_difference(const std::uint8_t* x, const std::uint8_t* y, std::size_t bytes, int elem_bytes) {
  for (std::size_t i = 0; i < bytes; ++i)
    if (x[i] != y[i]) return static_cast<std::int64_t>(i) / elem_bytes;
  return -1;
}

void run(const Case& c, std::mt19937& rng) {
  ++runs;
  const int size = kvfuse::dtype_size(c.dtype);
  RopeArgs a;
  a.dtype = c.dtype;
  a.pairing = c.pairing;
  a.head_dim = c.head_dim;
  a.num_tokens = c.tokens;
  a.num_heads = c.heads;
  a.num_layers = c.layers;
  kvfuse::RopeFrequencyConfig f;
  f.head_dim = c.head_dim;
  f.base = 500000.0;
  f.scaling = kvfuse::RopeScaling::llama3;
  f.factor = 8.0;
  if (kvfuse::rope_frequencies(f, a.theta) != Status::success) {
    std::printf("FAIL rope_frequencies: %s\n", kvfuse::last_status_message());
    ++failures;
    return;
  }
  a.in_strides = padded_strides(c.nhd, size, c.tokens, c.heads, c.head_dim);
  a.out_strides = c.in_place ? a.in_strides : padded_strides(!c.nhd, size, c.tokens, c.heads, c.head_dim);
  const auto in_bytes = static_cast<std::size_t>(c.layers * a.in_strides.layer * size);
  const auto out_bytes = static_cast<std::size_t>(c.layers * a.out_strides.layer * size);
  Buffer in_kernel(in_bytes), out_kernel(out_bytes), in_ref(in_bytes), out_ref(out_bytes);
  std::uniform_real_distribution<float> value(-3.0f, 3.0f);
  for (std::int64_t l = 0; l < c.layers; ++l)
    for (std::int64_t t = 0; t < c.tokens; ++t)
      for (std::int64_t h = 0; h < c.heads; ++h)
        for (std::int64_t e = 0; e < c.head_dim; ++e) {
          const std::int64_t at = l * a.in_strides.layer + t * a.in_strides.token + h * a.in_strides.head + e;
          const float v = value(rng);
          if (c.dtype == DType::f32)
            reinterpret_cast<float*>(in_kernel.data)[at] = v;
          else if (c.dtype == DType::f16)
            reinterpret_cast<kvfuse::f16*>(in_kernel.data)[at] = kvfuse::to_f16(v);
          else
            reinterpret_cast<kvfuse::bf16*>(in_kernel.data)[at] = kvfuse::to_bf16(v);
        }
  std::memcpy(in_ref.data, in_kernel.data, in_bytes);
  std::vector<std::int32_t> from(static_cast<std::size_t>(c.tokens)), to(from.size());
  std::uniform_int_distribution<std::int32_t> position(0, 131072);
  for (auto& p : from) p = position(rng);
  for (auto& p : to) p = position(rng);
  a.positions = from.data();
  if (c.op == RopeOp::shift) a.new_positions = to.data();

  RopeArgs r = a;
  a.in = in_kernel.data;
  a.out = c.in_place ? in_kernel.data : out_kernel.data;
  r.in = in_ref.data;
  r.out = c.in_place ? in_ref.data : out_ref.data;
  const Status kernel_status = call(true, c.op, a);
  const Status ref_status = call(false, c.op, r);
  const std::int64_t in_diff = first_difference(in_kernel.data, in_ref.data, in_bytes, size);
  const std::int64_t out_diff = c.in_place ? -1 : first_difference(out_kernel.data, out_ref.data, out_bytes, size);
  if (kernel_status == Status::success && ref_status == Status::success && in_diff < 0 && out_diff < 0) return;
  ++failures;
  std::printf("FAIL ");
  describe(c);
  if (kernel_status != Status::success || ref_status != Status::success)
    std::printf(": kernel status %s, reference status %s (%s)\n", kvfuse::status_string(kernel_status),
                kvfuse::status_string(ref_status), kvfuse::last_status_message());
  else if (in_diff >= 0)
    std::printf(": %s buffer differs from the reference first at element %lld\n", c.in_place ? "in-place" : "input",
                static_cast<long long>(in_diff));
  else
    std::printf(": output differs from the reference first at element %lld (strides token %lld head %lld layer %lld)\n",
                static_cast<long long>(out_diff), static_cast<long long>(a.out_strides.token),
                static_cast<long long>(a.out_strides.head), static_cast<long long>(a.out_strides.layer));
}

}  // namespace

int main() {
  std::mt19937 rng(1);
  for (DType dtype : {DType::f32, DType::f16, DType::bf16})
    for (RopePairing pairing : {RopePairing::interleaved, RopePairing::half_split})
      for (std::int64_t d : {64, 128, 256})
        for (bool nhd : {true, false})
          for (bool in_place : {true, false})
            for (RopeOp op : {RopeOp::apply, RopeOp::inverse, RopeOp::shift}) {
              run({dtype, pairing, d, nhd, in_place, 333, 3, 2, op}, rng);  // several blocks, items split over y
              run({dtype, pairing, d, nhd, in_place, 1, 1, 1, op}, rng);    // one token: a partial block
              run({dtype, pairing, d, nhd, in_place, 7, 5, 3, op}, rng);    // partial item batches
            }
  // Large chunks: each thread runs every (layer, head) item (one split), with partial batches.
  run({DType::bf16, RopePairing::interleaved, 128, true, true, 70000, 3, 2, RopeOp::apply}, rng);
  run({DType::f16, RopePairing::half_split, 64, false, false, 70000, 3, 2, RopeOp::shift}, rng);
  run({DType::f32, RopePairing::half_split, 256, true, true, 20000, 8, 1, RopeOp::inverse}, rng);
  run({DType::bf16, RopePairing::half_split, 128, true, true, 20000, 5, 3, RopeOp::apply}, rng);
  std::printf("emu.rope: %d cases, %d failed, %lld kernel launches, %lld emulated threads\n", runs, failures,
              emu::launches, emu::emulated_threads);
  return failures == 0 ? 0 : 1;
}
