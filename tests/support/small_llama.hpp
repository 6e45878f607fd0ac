#pragma once
// The small random-weights Llama the CPU-backend tests run everywhere (6 layers, d 32, GQA 4/2 heads of 8,
// a 96-token vocabulary): fast enough for every method on every prompt, real enough for the loop's math.
#include <cstdint>

#include "kvfuse/backend/cpu/llama.hpp"
#include "kvfuse/backend/cpu/llama_config.hpp"

namespace kvfuse_test {

inline kvfuse::LlamaConfig small_llama_config() {
  kvfuse::LlamaConfig c;
  c.n_layer = 6;
  c.n_embd = 32;
  c.n_head = 4;
  c.n_head_kv = 2;
  c.head_dim = 8;
  c.n_ff = 64;
  c.n_vocab = 96;
  c.rope_base = 10000.0;
  c.rms_eps = 1e-5;
  return c;
}

inline kvfuse::CpuLlama small_llama(std::uint64_t seed = 5) {
  const kvfuse::LlamaConfig c = small_llama_config();
  return kvfuse::CpuLlama(c, kvfuse::LlamaWeights::random(c, seed), kvfuse::CpuLlamaOptions{2, 8});
}

}  // namespace kvfuse_test
