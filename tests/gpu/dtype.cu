// The storage conversions of core/dtype.hpp on the device: bit for bit what the host computes, and what
// CUDA's own round-to-nearest-even intrinsics compute, on every 16-bit pattern and on random floats.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <bit>

#include "harness.cuh"

namespace {

__global__ void convert(const float* in, std::size_t n, std::uint16_t* ours_bf16, std::uint16_t* ours_f16,
                        std::uint16_t* cuda_bf16, std::uint16_t* cuda_f16) {
  const std::size_t i = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x;
  if (i >= n) return;
  ours_bf16[i] = kvfuse::to_bf16(in[i]).bits;
  ours_f16[i] = kvfuse::to_f16(in[i]).bits;
  cuda_bf16[i] = __bfloat16_as_ushort(__float2bfloat16_rn(in[i]));
  cuda_f16[i] = __half_as_ushort(__float2half_rn(in[i]));
}

__global__ void widen(std::size_t n, float* from_bf16, float* from_f16) {
  const std::size_t i = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x;
  if (i >= n) return;
  from_bf16[i] = kvfuse::to_float(kvfuse::bf16{static_cast<std::uint16_t>(i)});
  from_f16[i] = kvfuse::to_float(kvfuse::f16{static_cast<std::uint16_t>(i)});
}

bool is_nan_bits(std::uint16_t h, bool bf) {
  return bf ? (h & 0x7f80u) == 0x7f80u && (h & 0x7fu) != 0 : (h & 0x7c00u) == 0x7c00u && (h & 0x3ffu) != 0;
}

}  // namespace

KVFUSE_GPU_TEST("fp32 -> bf16 / fp16 on the device equals the host and CUDA's _rn intrinsics") {
  const std::size_t n = 1 << 22;
  std::vector<float> host(n);
  std::uniform_int_distribution<std::uint32_t> any_bits;
  std::uniform_real_distribution<float> unit(-2.0f, 2.0f);
  for (std::size_t i = 0; i < n; ++i)
    host[i] = i % 2 == 0 ? std::bit_cast<float>(any_bits(kvfuse::gpu_test::rng())) : unit(kvfuse::gpu_test::rng());
  kvfuse::gpu_test::DeviceBuffer<float> in(n);
  kvfuse::gpu_test::DeviceBuffer<std::uint16_t> ours_bf16(n), ours_f16(n), cuda_bf16(n), cuda_f16(n);
  in.upload(host);
  for (auto* b : {&ours_bf16, &ours_f16, &cuda_bf16, &cuda_f16}) b->poison();
  convert<<<static_cast<unsigned>((n + 255) / 256), 256>>>(in.data(), n, ours_bf16.data(), ours_f16.data(),
                                                             cuda_bf16.data(), cuda_f16.data());
  KVFUSE_GPU_CUDA(cudaGetLastError());
  const auto ob = ours_bf16.download(), of = ours_f16.download(), cb = cuda_bf16.download(), cf = cuda_f16.download();
  int mismatches = 0;
  for (std::size_t i = 0; i < n && mismatches < 10; ++i) {
    const bool nan = std::isnan(host[i]);
    const bool bf_ok = nan ? is_nan_bits(ob[i], true) && is_nan_bits(cb[i], true)
                           : ob[i] == cb[i] && ob[i] == kvfuse::to_bf16(host[i]).bits;
    const bool f_ok = nan ? is_nan_bits(of[i], false) && is_nan_bits(cf[i], false)
                          : of[i] == cf[i] && of[i] == kvfuse::to_f16(host[i]).bits;
    if (!bf_ok || !f_ok) {
      ++mismatches;
      KVFUSE_GPU_CHECK(false, "input %a: bf16 ours %04x cuda %04x host %04x; f16 ours %04x cuda %04x host %04x",
                       static_cast<double>(host[i]), ob[i], cb[i], kvfuse::to_bf16(host[i]).bits, of[i], cf[i],
                       kvfuse::to_f16(host[i]).bits);
    }
  }
}

KVFUSE_GPU_TEST("bf16 / fp16 -> fp32 on the device equals the host for all 65536 patterns") {
  const std::size_t n = 1 << 16;
  kvfuse::gpu_test::DeviceBuffer<float> from_bf16(n), from_f16(n);
  from_bf16.poison();
  from_f16.poison();
  widen<<<static_cast<unsigned>(n / 256), 256>>>(n, from_bf16.data(), from_f16.data());
  KVFUSE_GPU_CUDA(cudaGetLastError());
  const auto b = from_bf16.download(), f = from_f16.download();
  int mismatches = 0;
  for (std::size_t i = 0; i < n && mismatches < 10; ++i) {
    const float hb = kvfuse::to_float(kvfuse::bf16{static_cast<std::uint16_t>(i)});
    const float hf = kvfuse::to_float(kvfuse::f16{static_cast<std::uint16_t>(i)});
    const bool ok_b = std::isnan(hb) ? std::isnan(b[i]) : std::bit_cast<std::uint32_t>(b[i]) == std::bit_cast<std::uint32_t>(hb);
    const bool ok_f = std::isnan(hf) ? std::isnan(f[i]) : std::bit_cast<std::uint32_t>(f[i]) == std::bit_cast<std::uint32_t>(hf);
    if (!ok_b || !ok_f) {
      ++mismatches;
      KVFUSE_GPU_CHECK(false, "pattern %04zx: bf16 device %a host %a; f16 device %a host %a", i,
                       static_cast<double>(b[i]), static_cast<double>(hb), static_cast<double>(f[i]),
                       static_cast<double>(hf));
    }
  }
}
