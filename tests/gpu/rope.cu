// GPU tests of the RoPE kernels (kernels/include/kvfuse/cuda/rope.cuh): apply, inverse and shift on
// every dtype x pairing x head_dim x NHD/HND x in/out of place, multi-layer, random positions up to
// 131072, against an fp64 reference computed here (angle p·θ_f in double, θ_f the float table the kernel
// gets) and against the CPU reference (kvfuse::ref, same fp32 math); padding between strided rows is
// poisoned and must stay so; round trip and shift properties on the device; refusals launch nothing.
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "harness.cuh"
#include "kvfuse/cuda/rope.cuh"
#include "kvfuse/harness/ref/rope.hpp"
#include "../support/rope_test_util.hpp"

using kvfuse::DType;
using kvfuse::Status;
using kvfuse::RopePairing;
using kvfuse::gpu_test::DeviceBuffer;
using kvfuse::gpu_test::rng;
using kvfuse::RopeArgs;
using kvfuse::RopeOp;
using kvfuse::RopeStrides;
using kvfuse::test::AlignedBuffer;
using kvfuse::test::Layout;
using kvfuse::test::load;
using kvfuse::test::offset;
using kvfuse::test::padded_strides;
using kvfuse::test::run_ref;
using kvfuse::test::storage_ulp;
using kvfuse::test::store;

namespace {

constexpr std::uint8_t poison_byte = 0xFF;

// Bound of an elementwise difference that one storage rounding (16-bit) or the fp32 math (f32) explains,
// at a pair of magnitude m.
double pair_bound(DType t, double m) { return t == DType::f32 ? 1e-6 * m : storage_ulp(t, m); }

const char* layout_name(Layout l) { return l == Layout::nhd ? "NHD" : "HND"; }
const char* pairing_name(RopePairing p) { return p == RopePairing::interleaved ? "interleaved" : "half_split"; }

Status launch(RopeOp op, const RopeArgs& a) {
  switch (op) {
    case RopeOp::apply: return kvfuse::cuda::rope_apply(a);
    case RopeOp::inverse: return kvfuse::cuda::rope_inverse(a);
    case RopeOp::shift: return kvfuse::cuda::rope_shift(a);
  }
  return Status::unsupported;
}

struct Config {
  DType dtype;
  RopePairing pairing;
  std::int64_t head_dim;
  Layout layout;
  bool in_place;
  std::int64_t tokens;
  std::int64_t heads;
  std::int64_t layers;
  RopeOp op;
};

std::string describe(const Config& c) {
  return kvfuse::gpu_test::strf("%s %s %s d=%lld %s %s N=%lld H=%lld L=%lld", kvfuse::rope_op_name(c.op),
                                kvfuse::dtype_name(c.dtype), pairing_name(c.pairing),
                                static_cast<long long>(c.head_dim), layout_name(c.layout),
                                c.in_place ? "in-place" : "out-of-place", static_cast<long long>(c.tokens),
                                static_cast<long long>(c.heads), static_cast<long long>(c.layers));
}

// Runs one configuration on fresh random inputs and checks it (see the file comment).
void check_config(const Config& c) {
  const std::string what = describe(c);
  const int size = kvfuse::dtype_size(c.dtype);
  const std::int64_t d = c.head_dim;
  RopeArgs a;
  a.dtype = c.dtype;
  a.pairing = c.pairing;
  a.head_dim = d;
  a.num_tokens = c.tokens;
  a.num_heads = c.heads;
  a.num_layers = c.layers;
  kvfuse::RopeFrequencyConfig frequencies;
  frequencies.head_dim = d;
  frequencies.base = 500000.0;
  frequencies.scaling = kvfuse::RopeScaling::llama3;
  frequencies.factor = 8.0;
  KVFUSE_GPU_OK(kvfuse::rope_frequencies(frequencies, a.theta));
  a.in_strides = padded_strides(c.layout, c.dtype, c.tokens, c.heads, d);
  a.out_strides = c.in_place ? a.in_strides
                             : padded_strides(c.layout == Layout::nhd ? Layout::hnd : Layout::nhd, c.dtype, c.tokens,
                                              c.heads, d);
  const auto in_bytes = static_cast<std::size_t>(c.layers * a.in_strides.layer * size);
  const auto out_bytes = static_cast<std::size_t>(c.layers * a.out_strides.layer * size);

  // Inputs: random values in the view, poison (0xFF bytes, NaN) everywhere else.
  AlignedBuffer in_host(in_bytes, poison_byte);
  std::uniform_real_distribution<float> value(-3.0f, 3.0f);
  for (std::int64_t l = 0; l < c.layers; ++l)
    for (std::int64_t t = 0; t < c.tokens; ++t)
      for (std::int64_t h = 0; h < c.heads; ++h)
        for (std::int64_t e = 0; e < d; ++e) store(c.dtype, in_host.data(), offset(a.in_strides, l, t, h) + e, value(rng()));
  std::uniform_int_distribution<std::int32_t> position(0, 131072);
  std::vector<std::int32_t> from(static_cast<std::size_t>(c.tokens)), to(static_cast<std::size_t>(c.tokens));
  for (std::size_t t = 0; t < from.size(); ++t) {
    from[t] = t == 0 ? 131072 : position(rng());
    to[t] = t == 1 ? 131072 : position(rng());
  }

  DeviceBuffer<std::uint8_t> d_in(in_bytes);
  DeviceBuffer<std::uint8_t> d_out(c.in_place ? 0 : out_bytes);
  DeviceBuffer<std::int32_t> d_from(from.size());
  DeviceBuffer<std::int32_t> d_to(to.size());
  KVFUSE_GPU_CUDA(cudaMemcpy(d_in.data(), in_host.data(), in_bytes, cudaMemcpyHostToDevice));
  if (!c.in_place) d_out.poison();
  d_from.upload(from);
  d_to.upload(to);
  a.in = d_in.data();
  a.out = c.in_place ? d_in.data() : d_out.data();
  a.positions = d_from.data();
  if (c.op == RopeOp::shift) a.new_positions = d_to.data();
  KVFUSE_GPU_OK(launch(c.op, a));
  KVFUSE_GPU_CUDA(cudaDeviceSynchronize());
  const std::vector<std::uint8_t> out_bytes_device = c.in_place ? d_in.download() : d_out.download();
  AlignedBuffer got(out_bytes, poison_byte);
  std::memcpy(got.data(), out_bytes_device.data(), out_bytes);

  // CPU reference on the same inputs.
  AlignedBuffer cpu(out_bytes, poison_byte);
  if (c.in_place) std::memcpy(cpu.data(), in_host.data(), in_bytes);
  RopeArgs h = a;
  h.in = c.in_place ? static_cast<const void*>(cpu.data()) : static_cast<const void*>(in_host.data());
  h.out = cpu.data();
  h.positions = from.data();
  h.new_positions = c.op == RopeOp::shift ? to.data() : nullptr;
  KVFUSE_GPU_OK(run_ref(c.op, h));

  // fp64 reference, compared pair by pair.
  std::vector<double> got_all, ref_all;
  got_all.reserve(static_cast<std::size_t>(c.layers * c.tokens * c.heads * d));
  ref_all.reserve(got_all.capacity());
  double worst_fp64 = 0;  // elementwise |gpu − fp64| over its bound
  double worst_cpu = 0;   // elementwise |gpu − cpu ref| over one storage ulp of the pair
  std::string first_bad;
  for (std::int64_t t = 0; t < c.tokens; ++t) {
    const auto ti = static_cast<std::size_t>(t);
    const double q = c.op == RopeOp::apply     ? static_cast<double>(from[ti])
                     : c.op == RopeOp::inverse ? -static_cast<double>(from[ti])
                                               : static_cast<double>(to[ti]) - static_cast<double>(from[ti]);
    for (std::int64_t l = 0; l < c.layers; ++l)
      for (std::int64_t hd = 0; hd < c.heads; ++hd) {
        const std::int64_t src = offset(a.in_strides, l, t, hd);
        const std::int64_t dst = offset(a.out_strides, l, t, hd);
        for (std::int64_t i = 0; i < d / 2; ++i) {
          // Pair i: (2i, 2i+1) interleaved, (i, i + d/2) half split.
          const std::int64_t e0 = c.pairing == RopePairing::interleaved ? 2 * i : i;
          const std::int64_t e1 = c.pairing == RopePairing::interleaved ? 2 * i + 1 : i + d / 2;
          const double x0 = load(c.dtype, in_host.data(), src + e0);
          const double x1 = load(c.dtype, in_host.data(), src + e1);
          const double angle = q * static_cast<double>(a.theta[i]);
          const double want[2] = {x0 * std::cos(angle) - x1 * std::sin(angle),
                                  x0 * std::sin(angle) + x1 * std::cos(angle)};
          const std::int64_t at[2] = {dst + e0, dst + e1};
          const double magnitude = std::hypot(x0, x1);
          for (int k = 0; k < 2; ++k) {
            const double g = load(c.dtype, got.data(), at[k]);
            const double r = load(c.dtype, cpu.data(), at[k]);
            got_all.push_back(g);
            ref_all.push_back(want[k]);
            const double math = 1e-6 * magnitude;
            const double bound = math + 0.5 * storage_ulp(c.dtype, std::fabs(want[k]) + math);
            const double e64 = std::isfinite(g) ? std::fabs(g - want[k]) / bound : INFINITY;
            const double ecpu = std::isfinite(g) ? std::fabs(g - r) / pair_bound(c.dtype, magnitude) : INFINITY;
            if ((e64 > 1.0 || ecpu > 1.0) && first_bad.empty())
              first_bad = kvfuse::gpu_test::strf(
                  "layer %lld token %lld head %lld pair %lld elem %d (pos %g): gpu %.9g fp64 %.9g cpu %.9g",
                  static_cast<long long>(l), static_cast<long long>(t), static_cast<long long>(hd),
                  static_cast<long long>(i), k, q, g, want[k], r);
            worst_fp64 = std::max(worst_fp64, e64);
            worst_cpu = std::max(worst_cpu, ecpu);
          }
        }
      }
  }
  const double rel = kvfuse::gpu_test::relative_error(got_all, ref_all);
  const double tol = c.dtype == DType::f32 ? 1e-5 : 1e-2;
  KVFUSE_GPU_CHECK(rel <= tol, "%s: relative error %.3g vs fp64 > %.0e", what.c_str(), rel, tol);
  KVFUSE_GPU_CHECK(worst_fp64 <= 1.0 && worst_cpu <= 1.0,
                   "%s: elementwise error %.3g (fp64 bound) / %.3g (cpu ref bound); first: %s", what.c_str(),
                   worst_fp64, worst_cpu, first_bad.c_str());

  // Untouched memory: every byte outside the output view is still poison; out of place, the input as uploaded.
  std::vector<bool> view(out_bytes, false);
  for (std::int64_t l = 0; l < c.layers; ++l)
    for (std::int64_t t = 0; t < c.tokens; ++t)
      for (std::int64_t hd = 0; hd < c.heads; ++hd)
        for (std::int64_t b = 0; b < d * size; ++b)
          view[static_cast<std::size_t>(offset(a.out_strides, l, t, hd) * size + b)] = true;
  std::size_t stray = 0;
  for (std::size_t b = 0; b < out_bytes; ++b)
    if (!view[b] && got.bytes()[b] != poison_byte) ++stray;
  KVFUSE_GPU_CHECK(stray == 0, "%s: %zu bytes outside the output view changed", what.c_str(), stray);
  if (!c.in_place) {
    const std::vector<std::uint8_t> in_after = d_in.download();
    KVFUSE_GPU_CHECK(std::memcmp(in_after.data(), in_host.data(), in_bytes) == 0, "%s: the input changed",
                     what.c_str());
  }
}

}  // namespace

KVFUSE_GPU_TEST("rope: apply / inverse / shift vs fp64 and the CPU reference, every dtype, pairing, head_dim, layout") {
  for (DType dtype : {DType::f32, DType::f16, DType::bf16})
    for (RopePairing pairing : {RopePairing::interleaved, RopePairing::half_split})
      for (std::int64_t d : {64, 128, 256})
        for (Layout layout : {Layout::nhd, Layout::hnd})
          for (bool in_place : {true, false})
            for (RopeOp op : {RopeOp::apply, RopeOp::inverse, RopeOp::shift})
              check_config({dtype, pairing, d, layout, in_place, 333, 3, 2, op});
}

KVFUSE_GPU_TEST("rope: large chunks (each thread loops every layer x head, partial batches)") {
  // N·lanes above the launcher's target: one blockIdx.y, 6 items per thread (a batch of 4, then 2).
  check_config({DType::bf16, RopePairing::interleaved, 128, Layout::nhd, true, 70000, 3, 2, RopeOp::apply});
  check_config({DType::f16, RopePairing::half_split, 64, Layout::hnd, false, 70000, 3, 2, RopeOp::shift});
  check_config({DType::f32, RopePairing::half_split, 256, Layout::nhd, true, 20000, 8, 1, RopeOp::inverse});
  check_config({DType::bf16, RopePairing::half_split, 128, Layout::nhd, true, 1, 1, 1, RopeOp::apply});
}

KVFUSE_GPU_TEST("rope: apply-then-inverse and shift-vs-apply-at-new on the device, up to position 131072") {
  for (DType dtype : {DType::f32, DType::f16, DType::bf16})
    for (RopePairing pairing : {RopePairing::interleaved, RopePairing::half_split})
      for (std::int64_t d : {64, 128, 256}) {
        const std::string what = kvfuse::gpu_test::strf("%s %s d=%lld", kvfuse::dtype_name(dtype),
                                                         pairing_name(pairing), static_cast<long long>(d));
        const std::int64_t n = 4096;
        const std::int64_t heads = 8;
        const auto count = static_cast<std::size_t>(n * heads * d);
        const std::size_t bytes = count * static_cast<std::size_t>(kvfuse::dtype_size(dtype));
        RopeArgs a;
        a.dtype = dtype;
        a.pairing = pairing;
        a.head_dim = d;
        a.num_tokens = n;
        a.num_heads = heads;
        a.in_strides = a.out_strides = kvfuse::rope_nhd_strides(n, heads, d);
        kvfuse::RopeFrequencyConfig frequencies;
        frequencies.head_dim = d;
        frequencies.base = 10000.0;
        KVFUSE_GPU_OK(kvfuse::rope_frequencies(frequencies, a.theta));
        AlignedBuffer original(bytes, poison_byte);
        std::uniform_real_distribution<float> value(-4.0f, 4.0f);
        for (std::size_t i = 0; i < count; ++i) store(dtype, original.data(), static_cast<std::int64_t>(i), value(rng()));
        std::uniform_int_distribution<std::int32_t> position(0, 131072);
        std::vector<std::int32_t> old_pos(static_cast<std::size_t>(n)), new_pos(static_cast<std::size_t>(n));
        for (std::size_t t = 0; t < old_pos.size(); ++t) {
          old_pos[t] = t == 0 ? 131072 : position(rng());
          new_pos[t] = t == 1 ? 131072 : position(rng());
        }
        DeviceBuffer<std::uint8_t> x(bytes);
        DeviceBuffer<std::uint8_t> direct(bytes);
        DeviceBuffer<std::int32_t> d_old(old_pos.size());
        DeviceBuffer<std::int32_t> d_new(new_pos.size());
        d_old.upload(old_pos);
        d_new.upload(new_pos);

        // Largest elementwise |got − want| over pair_bound at the pair magnitude of `want`.
        const auto worst = [&](const std::vector<std::uint8_t>& got, const std::uint8_t* want) {
          double w = 0;
          for (std::int64_t row = 0; row < n * heads; ++row)
            for (std::int64_t i = 0; i < d / 2; ++i) {
              const std::int64_t e0 = pairing == RopePairing::interleaved ? 2 * i : i;
              const std::int64_t e1 = pairing == RopePairing::interleaved ? 2 * i + 1 : i + d / 2;
              const double w0 = load(dtype, want, row * d + e0);
              const double w1 = load(dtype, want, row * d + e1);
              const double bound = pair_bound(dtype, std::hypot(w0, w1));
              for (const auto& [e, wv] : {std::pair{e0, w0}, std::pair{e1, w1}}) {
                const double g = load(dtype, got.data(), row * d + e);
                w = std::max(w, std::isfinite(g) ? std::fabs(g - wv) / bound : INFINITY);
              }
            }
          return w;
        };

        KVFUSE_GPU_CUDA(cudaMemcpy(x.data(), original.data(), bytes, cudaMemcpyHostToDevice));
        a.in = a.out = x.data();
        a.positions = d_old.data();
        KVFUSE_GPU_OK(kvfuse::cuda::rope_apply(a));
        KVFUSE_GPU_OK(kvfuse::cuda::rope_inverse(a));
        KVFUSE_GPU_CUDA(cudaDeviceSynchronize());
        const double round_trip = worst(x.download(), original.bytes());
        KVFUSE_GPU_CHECK(round_trip <= 1.0, "%s: apply then inverse differs by %.3g bounds (1 ulp; f32 1e-6)",
                         what.c_str(), round_trip);

        KVFUSE_GPU_CUDA(cudaMemcpy(x.data(), original.data(), bytes, cudaMemcpyHostToDevice));
        KVFUSE_GPU_OK(kvfuse::cuda::rope_apply(a));  // at the old positions
        a.new_positions = d_new.data();
        KVFUSE_GPU_OK(kvfuse::cuda::rope_shift(a));  // old -> new, one rotation
        a.new_positions = nullptr;
        KVFUSE_GPU_CUDA(cudaMemcpy(direct.data(), original.data(), bytes, cudaMemcpyHostToDevice));
        a.in = a.out = direct.data();
        a.positions = d_new.data();
        KVFUSE_GPU_OK(kvfuse::cuda::rope_apply(a));  // straight at the new positions
        KVFUSE_GPU_CUDA(cudaDeviceSynchronize());
        const std::vector<std::uint8_t> direct_host = direct.download();
        const double shift = worst(x.download(), direct_host.data());
        KVFUSE_GPU_CHECK(shift <= 1.0, "%s: shift vs apply at the new positions differs by %.3g bounds", what.c_str(),
                         shift);
      }
}

KVFUSE_GPU_TEST("rope: refusals return their status and launch nothing") {
  const std::int64_t n = 16, heads = 2, d = 128;
  const std::size_t bytes = static_cast<std::size_t>(n * heads * d) * 2 + 64;
  DeviceBuffer<std::uint8_t> buffer(bytes);
  DeviceBuffer<std::int32_t> positions(static_cast<std::size_t>(n));
  positions.upload(std::vector<std::int32_t>(static_cast<std::size_t>(n), 7));
  buffer.poison();
  RopeArgs good;
  good.dtype = DType::bf16;
  good.head_dim = d;
  good.num_tokens = n;
  good.num_heads = heads;
  good.in_strides = good.out_strides = kvfuse::rope_nhd_strides(n, heads, d);
  good.in = good.out = buffer.data();
  good.positions = positions.data();
  kvfuse::RopeFrequencyConfig frequencies;
  frequencies.head_dim = d;
  KVFUSE_GPU_OK(kvfuse::rope_frequencies(frequencies, good.theta));

  struct Bad {
    const char* what;
    RopeArgs args;
    Status status;
  };
  std::vector<Bad> bad;
  RopeArgs a = good;
  a.in = a.out = buffer.data() + 2;
  bad.push_back({"misaligned pointer", a, Status::invalid_argument});
  a = good;
  a.head_dim = 96;
  bad.push_back({"head_dim 96", a, Status::unsupported});
  a = good;
  a.in_strides.token = a.out_strides.token = heads * d + 4;
  bad.push_back({"token stride not a multiple of 16 bytes", a, Status::invalid_argument});
  a = good;
  a.positions = nullptr;
  bad.push_back({"null positions", a, Status::invalid_argument});
  a = good;
  a.theta[0] = 0.0f;
  bad.push_back({"unfilled theta", a, Status::invalid_argument});
  for (const Bad& b : bad) {
    const Status s = kvfuse::cuda::rope_apply(b.args);
    KVFUSE_GPU_CHECK(s == b.status, "%s: status %s (%s), want %s", b.what, kvfuse::status_string(s),
                     kvfuse::last_status_message(), kvfuse::status_string(b.status));
  }
  a = good;
  a.num_tokens = 0;
  KVFUSE_GPU_CHECK(kvfuse::cuda::rope_apply(a) == Status::success, "0 tokens: %s", kvfuse::last_status_message());
  KVFUSE_GPU_CUDA(cudaDeviceSynchronize());
  KVFUSE_GPU_CUDA(cudaGetLastError());
  const std::vector<std::uint8_t> after = buffer.download();
  std::size_t changed = 0;
  for (std::uint8_t byte : after) changed += byte != poison_byte;
  KVFUSE_GPU_CHECK(changed == 0, "%zu bytes written by refused or empty calls", changed);
}
