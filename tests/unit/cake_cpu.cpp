// Cake on real compute and real I/O: run_threaded with the reference CPU backend (CpuLlamaSession) as the
// compute side and a DiskKVStore behind a bandwidth-limited link (ThrottledKVStore) as the stored prefix. Whatever
// the split, the assembled KV and the first token's logits equal full prefill's to float rounding (chunked
// prefill groups rows differently from one full prefill, as in CpuLlamaSession's own tests). A small
// random-weights Llama runs everywhere; the "real model" case runs SmolLM2 (Release builds with the model file).
#include <doctest/doctest.h>

#include <cstdint>
#include <span>
#include <vector>

#include "kvfuse/cpu.hpp"
#include "kvfuse/runtime.hpp"

#include "../support/model_path.hpp"
#include "../support/small_llama.hpp"
#include "../support/test_util.hpp"

// Each unit test file lives in its own namespace: the files are compiled together (a unity build).
namespace unit_cake_cpu {

using namespace kvfuse;

namespace {

using LinkedDisk = ThrottledKVStore<DiskKVStore>;

// The prompt's full prefill, and its first `stored` tokens put in `store` as prefix-cache entries of
// `fetch_chunk` tokens (Cake appendix A, step 2: what an earlier request left behind).
LlamaPrefill store_prefix(const CpuLlama& model, std::span<const token_id> tokens, std::int64_t stored,
                          std::int64_t fetch_chunk, DiskKVStore& store) {
  LlamaPrefill full = model.full_prefill(tokens);
  const auto keys = prefix_chunk_keys(model.fingerprint(), tokens, fetch_chunk);
  for (std::int64_t b = 0; b < stored; b += fetch_chunk) {
    const TokenRange r{b, std::min(b + fetch_chunk, stored)};
    store.put(keys[static_cast<std::size_t>(b / fetch_chunk)], full.kv.to_block(r));
  }
  return full;
}

// Runs Cake in `mode` for `tokens` and checks the result against full prefill, bit for bit.
void check_cake_equals_full_prefill(const CpuLlama& model, std::span<const token_id> tokens, std::int64_t stored,
                                    LoaderConfig config, LinkConfig link) {
  kvfuse_test::TempDir dir;
  DiskKVStore disk(dir.path);
  const LlamaPrefill full = store_prefix(model, tokens, stored, config.fetch_chunk, disk);
  config.split = stored / 2 / config.fetch_chunk * config.fetch_chunk;
  for (LoaderMode mode : {LoaderMode::adaptive, LoaderMode::bidirectional, LoaderMode::compute_only,
                          LoaderMode::load_only, LoaderMode::static_split}) {
    CAPTURE(static_cast<int>(mode));
    config.mode = mode;
    LinkedDisk store(disk, link);
    CpuLlamaSession session(model, std::vector<token_id>(tokens.begin(), tokens.end()));
    const LoaderTrace t =
        run_threaded(BidirectionalLoader<CpuLlamaSession, LinkedDisk>(config), session, store, tokens);
    CHECK(t.load_failure.empty());
    CHECK(t.stored_tokens == stored);
    CHECK(t.computed_tokens + t.loaded_tokens == static_cast<std::int64_t>(tokens.size()));
    if (mode == LoaderMode::compute_only) CHECK(t.loaded_tokens == 0);
    if (mode == LoaderMode::load_only) CHECK(t.loaded_tokens == stored);
    if (mode == LoaderMode::static_split) CHECK(t.loaded_tokens == stored - config.split);
    CHECK(store.stats().bytes >= static_cast<std::int64_t>(
                                     t.loaded_tokens * LlamaKVCache::block_bytes(model.config().n_layer,
                                                                                 model.config().kv_dim(), 1)));
    REQUIRE(session.resident_prefix() == static_cast<std::int64_t>(tokens.size()));
    for (std::size_t l = 0; l < full.kv.k.size(); ++l) {
      CHECK(kvfuse_test::diff(session.kv().k[l], full.kv.k[l]).rounding());
      CHECK(kvfuse_test::diff(session.kv().v[l], full.kv.v[l]).rounding());
    }
    const std::span<const float> logits = session.logits();
    CHECK(kvfuse_test::diff(logits, full.logits).rounding());
  }
}

}  // namespace

TEST_CASE("Cake on the CPU backend with a disk store behind a throttled link: the same KV as full prefill") {
  const CpuLlama model = kvfuse_test::small_llama(11);
  std::vector<token_id> tokens(300);
  for (std::size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<token_id>((i * 37 + 5) % 96);
  // 768 B of KV per token: a 32-token fetch chunk is 24 KB, 12 ms at 2 MB/s with 1 ms latency.
  check_cake_equals_full_prefill(model, tokens, 256, {64, 32}, {2.0, 1.0});
}

TEST_CASE("real model: Cake on SmolLM2 with a disk store behind a throttled link equals full prefill") {
  const auto path = kvfuse_test::real_model(/*optimized_only=*/true);
  if (!path) return;
  const GGUFFile file = GGUFFile::open(*path);
  const CpuLlama model = CpuLlama::from_gguf(file);
  std::vector<token_id> tokens(160);
  for (std::size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<token_id>(100 + (i * 7919) % 40000);
  // SmolLM2's fp32 KV is 46 kB per token: a 32-token chunk is 1.5 MB, about 75 ms at 20 MB/s.
  check_cake_equals_full_prefill(model, tokens, 128, {64, 32}, {20.0, 1.0});
}

}  // namespace unit_cake_cpu
