// Sparse-query attention (kvfuse::cuda::sparse_attention): a random sorted subset of r % of an N-token
// prompt's tokens attends to the whole prompt with the exact positional causal mask. bf16, Hq = 32,
// Hkv = 8, head_dim 64 and 128, N = 8K and 32K, r = 5, 15, 30 and 100 % (100 % = dense causal attention).
// Useful FLOPs are 4 · Hq · d · Σ_i (pos_i + 1) (QK^T and PV over the visible keys only), the number that
// PyTorch SDPA flash causal is measured with in scripts/bench_sdpa.py (4 · Hq · d · N(N+1)/2 at r = 100 %).
// Also times the launch with the chunk-mass epilogue (16 equal chunks), and, where the launcher asks for a
// workspace (split KV: few query tiles), the same launch without it.
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <vector>

#include "bench_common.cuh"
#include "kvfuse/cuda/sparse_attention.cuh"

namespace {

template <class T>
T* device_alloc(std::size_t count) {
  T* p = nullptr;
  kvfuse::bench::cuda_check(cudaMalloc(&p, std::max<std::size_t>(count, 1) * sizeof(T)), "cudaMalloc");
  return p;
}

// Fills a device buffer of bf16 with values in [-1, 1) (a cheap host pattern, uploaded once).
void fill_bf16(kvfuse::bf16* dst, std::size_t count, std::mt19937& rng) {
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  std::vector<kvfuse::bf16> host(std::min<std::size_t>(count, std::size_t{1} << 20));
  for (auto& x : host) x = kvfuse::to_bf16(dist(rng));
  for (std::size_t off = 0; off < count; off += host.size()) {
    const std::size_t n = std::min(host.size(), count - off);
    kvfuse::bench::cuda_check(cudaMemcpy(dst + off, host.data(), n * sizeof(kvfuse::bf16), cudaMemcpyHostToDevice),
                              "upload");
  }
}

}  // namespace

int main() {
  kvfuse::bench::print_device();
  constexpr int hq = 32, hkv = 8, chunks = 16;
  std::mt19937 rng(42);
  std::printf("# sparse_attention, bf16, Hq %d, Hkv %d; useful TFLOP/s = 4*Hq*d*sum(pos_i+1)/t\n", hq, hkv);
  std::printf("| N | head_dim | r | queries | time (ms) | useful TFLOP/s | time / dense | with mass epilogue (ms) | split KV |\n");
  std::printf("|---|---|---|---|---|---|---|---|---|\n");
  for (const int n : {8192, 32768}) {
    for (const int d : {64, 128}) {
      auto* k = device_alloc<kvfuse::bf16>(static_cast<std::size_t>(n) * hkv * d);
      auto* v = device_alloc<kvfuse::bf16>(static_cast<std::size_t>(n) * hkv * d);
      auto* q = device_alloc<kvfuse::bf16>(static_cast<std::size_t>(n) * hq * d);
      auto* o = device_alloc<kvfuse::bf16>(static_cast<std::size_t>(n) * hq * d);
      auto* lse = device_alloc<float>(static_cast<std::size_t>(n) * hq);
      auto* mass = device_alloc<float>(static_cast<std::size_t>(n) * chunks);
      auto* q_pos = device_alloc<std::int32_t>(static_cast<std::size_t>(n));
      auto* k_pos = device_alloc<std::int32_t>(static_cast<std::size_t>(n));
      auto* starts = device_alloc<std::int64_t>(chunks + 1);
      fill_bf16(k, static_cast<std::size_t>(n) * hkv * d, rng);
      fill_bf16(v, static_cast<std::size_t>(n) * hkv * d, rng);
      fill_bf16(q, static_cast<std::size_t>(n) * hq * d, rng);
      std::vector<std::int32_t> all(static_cast<std::size_t>(n));
      for (int j = 0; j < n; ++j) all[static_cast<std::size_t>(j)] = j;
      kvfuse::bench::cuda_check(cudaMemcpy(k_pos, all.data(), all.size() * 4, cudaMemcpyHostToDevice), "upload");
      std::vector<std::int64_t> chunk_starts(chunks + 1);
      for (int c = 0; c <= chunks; ++c) chunk_starts[static_cast<std::size_t>(c)] = static_cast<std::int64_t>(n) * c / chunks;
      kvfuse::bench::cuda_check(cudaMemcpy(starts, chunk_starts.data(), chunk_starts.size() * 8, cudaMemcpyHostToDevice),
                                "upload");
      double dense_ms = 0;
      for (const int r : {100, 5, 15, 30}) {  // dense first: the other rows are reported relative to it
        std::vector<std::int32_t> sel = all;
        if (r < 100) {
          std::shuffle(sel.begin(), sel.end(), rng);
          sel.resize(static_cast<std::size_t>(n) * r / 100);
          std::sort(sel.begin(), sel.end());
        }
        kvfuse::bench::cuda_check(cudaMemcpy(q_pos, sel.data(), sel.size() * 4, cudaMemcpyHostToDevice), "upload");
        double visible = 0;
        for (const std::int32_t p : sel) visible += static_cast<double>(p) + 1.0;
        kvfuse::SparseAttentionArgs a;
        a.dtype = kvfuse::DType::bf16;
        a.num_queries = static_cast<std::int64_t>(sel.size());
        a.num_keys = n;
        a.num_q_heads = hq;
        a.num_kv_heads = hkv;
        a.head_dim = d;
        a.q = q;
        a.k = k;
        a.v = v;
        a.o = o;
        a.q_pos = q_pos;
        a.k_pos = k_pos;
        a.lse = lse;
        // The workspace the launcher asks for (split KV when few queries would leave SMs idle).
        a.workspace_bytes = kvfuse::cuda::sparse_attention_workspace_bytes(a);
        void* workspace = a.workspace_bytes > 0 ? device_alloc<unsigned char>(static_cast<std::size_t>(a.workspace_bytes))
                                                : nullptr;
        a.workspace = workspace;
        const auto launch = [&](const kvfuse::SparseAttentionArgs& args) {
          if (kvfuse::cuda::sparse_attention(args) != kvfuse::Status::success) {
            std::fprintf(stderr, "sparse_attention: %s\n", kvfuse::last_status_message());
            std::exit(1);
          }
        };
        const double ms = kvfuse::bench::median_ms([&] { launch(a); }, nullptr, 3, r == 100 && n > 8192 ? 10 : 30);
        kvfuse::SparseAttentionArgs with_mass = a;
        with_mass.num_chunks = chunks;
        with_mass.chunk_starts = starts;
        with_mass.mass = mass;
        const double mass_ms =
            kvfuse::bench::median_ms([&] { launch(with_mass); }, nullptr, 3, r == 100 && n > 8192 ? 10 : 30);
        kvfuse::SparseAttentionArgs no_split = a;  // the same launch without the workspace, for comparison
        no_split.workspace = nullptr;
        no_split.workspace_bytes = 0;
        const double no_split_ms =
            a.workspace_bytes > 0 ? kvfuse::bench::median_ms([&] { launch(no_split); }, nullptr, 3, 30) : 0.0;
        if (r == 100) dense_ms = ms;
        const double tflops = 4.0 * hq * d * visible / (ms * 1e-3) / 1e12;
        char split[64] = "no";
        if (a.workspace_bytes > 0) std::snprintf(split, sizeof split, "yes (%.3f ms without)", no_split_ms);
        std::printf("| %d | %d | %d %% | %zu | %.3f | %.1f | %.3f | %.3f | %s |\n", n, d, r, sel.size(), ms, tflops,
                    ms / dense_ms, mass_ms, split);
        std::fflush(stdout);
        cudaFree(workspace);
      }
      for (void* p : {static_cast<void*>(k), static_cast<void*>(v), static_cast<void*>(q), static_cast<void*>(o),
                      static_cast<void*>(lse), static_cast<void*>(mass), static_cast<void*>(q_pos),
                      static_cast<void*>(k_pos), static_cast<void*>(starts)})
        cudaFree(p);
    }
  }
  return 0;
}
