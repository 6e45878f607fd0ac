// RoPE kernels (kernels/include/kvfuse/cuda/rope.cuh) against device-to-device copy bandwidth: bf16 K in
// place, NHD, 8 KV heads, head_dim 64 and 128, 1K to 128K tokens, one layer and a 4-layer chunk in one
// launch. Each row: the kernel's median time, its effective bandwidth (bytes read + bytes written), the
// bandwidth of cudaMemcpyAsync D2D of the same bytes measured in the same run, and the ratio (the issue's
// goal: >= 85 % of copy).
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "bench_common.cuh"
#include "kvfuse/cuda/rope.cuh"

namespace {

using kvfuse::RopePairing;
using kvfuse::RopeArgs;

void require(kvfuse::Status s, const char* what) {
  if (s != kvfuse::Status::success) {
    std::fprintf(stderr, "%s: %s (%s)\n", what, kvfuse::status_string(s), kvfuse::last_status_message());
    std::exit(1);
  }
}

}  // namespace

int main() {
  using kvfuse::bench::cuda_check;
  kvfuse::bench::print_device();
  const std::int64_t heads = 8;
  const std::int64_t token_counts[] = {1024, 4096, 16384, 32768, 131072};
  const std::int64_t layer_counts[] = {1, 4};
  const std::int64_t max_tokens = 131072;
  const std::int64_t max_layers = 4;
  const std::size_t max_bytes = static_cast<std::size_t>(max_tokens * heads * max_layers * 128) * 2;

  void* x = nullptr;
  void* y = nullptr;
  std::int32_t* positions = nullptr;
  std::int32_t* new_positions = nullptr;
  cuda_check(cudaMalloc(&x, max_bytes), "cudaMalloc x");
  cuda_check(cudaMalloc(&y, max_bytes), "cudaMalloc y");
  cuda_check(cudaMalloc(&positions, max_tokens * sizeof(std::int32_t)), "cudaMalloc positions");
  cuda_check(cudaMalloc(&new_positions, max_tokens * sizeof(std::int32_t)), "cudaMalloc new_positions");
  cuda_check(cudaMemset(x, 0x3c, max_bytes), "cudaMemset x");  // bf16 0x3c3c ≈ 0.0115, finite
  std::vector<std::int32_t> host_positions(static_cast<std::size_t>(max_tokens));
  for (std::size_t t = 0; t < host_positions.size(); ++t) host_positions[t] = static_cast<std::int32_t>(t);
  cuda_check(cudaMemcpy(positions, host_positions.data(), max_tokens * sizeof(std::int32_t), cudaMemcpyHostToDevice),
             "upload positions");
  for (auto& p : host_positions) p += 4096;  // shift every token by +4096
  cuda_check(cudaMemcpy(new_positions, host_positions.data(), max_tokens * sizeof(std::int32_t),
                        cudaMemcpyHostToDevice),
             "upload new_positions");
  cudaStream_t stream = nullptr;
  cuda_check(cudaStreamCreate(&stream), "cudaStreamCreate");

  std::printf("| op | pairing | head_dim | heads | layers | tokens | MB | time us | GB/s | copy GB/s | %% of copy |\n");
  std::printf("|---|---|---|---|---|---|---|---|---|---|---|\n");
  for (std::int64_t d : {64, 128}) {
    kvfuse::RopeFrequencyConfig frequencies;
    frequencies.head_dim = d;
    frequencies.base = 500000.0;
    frequencies.scaling = kvfuse::RopeScaling::llama3;
    frequencies.factor = 8.0;
    for (std::int64_t layers : layer_counts)
      for (std::int64_t n : token_counts) {
        const std::size_t bytes = static_cast<std::size_t>(n * heads * layers * d) * 2;
        const double copy_ms = kvfuse::bench::copy_ms(y, x, bytes, stream);
        const double copy_gbs = 2.0 * static_cast<double>(bytes) / (copy_ms * 1e6);
        struct Row {
          const char* op;
          RopePairing pairing;
        };
        for (const Row row : {Row{"apply", RopePairing::half_split}, Row{"apply", RopePairing::interleaved},
                              Row{"inverse", RopePairing::half_split}, Row{"shift", RopePairing::half_split}}) {
          RopeArgs a;
          a.dtype = kvfuse::DType::bf16;
          a.pairing = row.pairing;
          a.head_dim = d;
          a.num_tokens = n;
          a.num_heads = heads;
          a.num_layers = layers;
          a.in = a.out = x;
          a.in_strides = a.out_strides = kvfuse::rope_nhd_strides(n, heads, d);
          a.positions = positions;
          require(kvfuse::rope_frequencies(frequencies, a.theta), "rope_frequencies");
          const char op = row.op[0];
          if (op == 's') a.new_positions = new_positions;
          const auto launch = [&] {
            if (op == 'a') {
              require(kvfuse::cuda::rope_apply(a, stream), "rope_apply");
            } else if (op == 'i') {
              require(kvfuse::cuda::rope_inverse(a, stream), "rope_inverse");
            } else {
              require(kvfuse::cuda::rope_shift(a, stream), "rope_shift");
            }
          };
          const double ms = kvfuse::bench::median_ms(launch, stream);
          const double gbs = 2.0 * static_cast<double>(bytes) / (ms * 1e6);
          std::printf("| %s | %s | %lld | %lld | %lld | %lld | %.1f | %.1f | %.0f | %.0f | %.1f |\n", row.op,
                      row.pairing == RopePairing::half_split ? "half_split" : "interleaved",
                      static_cast<long long>(d), static_cast<long long>(heads), static_cast<long long>(layers),
                      static_cast<long long>(n), static_cast<double>(bytes) / 1e6, ms * 1e3, gbs, copy_gbs,
                      100.0 * gbs / copy_gbs);
        }
      }
  }
  cuda_check(cudaStreamDestroy(stream), "cudaStreamDestroy");
  cudaFree(x);
  cudaFree(y);
  cudaFree(positions);
  cudaFree(new_positions);
  return 0;
}
