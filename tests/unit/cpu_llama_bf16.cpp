// CpuLlama with bf16 products on AMX (CpuLlamaOptions::products = bf16): the equalities the fp32 engine keeps hold bit
// for bit — a request's logits batched as alone, every row recomputed over stale KV as full prefill, CpuBatchEngine's
// tokens batched as alone — its results stay within bf16's rounding of fp32's, and its fingerprint is its own. Where
// the CPU has no AMX-BF16 these report Skipped and the refusal is tested.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <string>
#include <vector>

#include "kvfuse/backend/cpu/batch_engine.hpp"
#include "kvfuse/backend/in_memory_store.hpp"
#include "kvfuse/cpu.hpp"
#include "kvfuse/detail/cpu_amx.hpp"

#include "../support/error_of.hpp"
#include "../support/fusion_prompts.hpp"
#include "../support/llama_kv.hpp"
#include "../support/model_path.hpp"
#include "../support/small_llama.hpp"
#include "../support/test_util.hpp"

// Each unit test file lives in its own namespace: the files are compiled together (a unity build).
namespace unit_cpu_llama_bf16 {

using namespace kvfuse;
using kvfuse_test::Prompt;

namespace {

CpuLlamaOptions bf16_options() {
  CpuLlamaOptions o{2, 8};
  o.products = CpuProducts::bf16;
  return o;
}

CpuLlama small_bf16(std::uint64_t seed = 5) {
  const LlamaConfig c = kvfuse_test::small_llama_config();
  return CpuLlama(c, LlamaWeights::random(c, seed), bf16_options());
}

bool no_amx() {
  if (detail::cpu_uses_amx()) return false;
  kvfuse_test::skip("this CPU (or kernel) has no AMX-BF16: bf16 products cannot run here");
  return true;
}

std::vector<Prompt> prompts() { return kvfuse_test::reordered_prompts(); }

struct NoHooks final : StepHooks {
  Status before_layer(std::size_t, std::int64_t) override { return Status::success; }
  Status after_layer(std::size_t, const LayerReport&, TokenSet&) override { return Status::success; }
};

std::map<std::uint64_t, std::vector<token_id>> serve(CpuBatchEngine<InMemoryKVStore>& engine,
                                                     const std::vector<GenerationRequest>& requests) {
  std::map<std::uint64_t, std::vector<token_id>> out;
  for (const GenerationRequest& r : requests) out[engine.submit(r)];
  for (int step = 0; !engine.idle(); ++step) {
    for (const TokenEvent& e : engine.step()) {
      REQUIRE_MESSAGE(e.status == Status::success, e.error);
      if (e.token) out[e.request].push_back(*e.token);
    }
    REQUIRE(step < 1000);
  }
  return out;
}

}  // namespace

TEST_CASE("bf16 products: built where the CPU has AMX-BF16, refused where it has not, naming the option and the way "
          "out") {
  if (detail::cpu_uses_amx()) {
    CHECK(small_bf16().fingerprint() != 0);
    return;
  }
  const std::string why = kvfuse_test::error_of([] { (void)small_bf16(); });
  CHECK(why.find("products = bf16") != std::string::npos);
  CHECK(why.find("AMX-BF16") != std::string::npos);
  CHECK(why.find("products = fp32") != std::string::npos);
}

TEST_CASE("bf16 products: each request's logits the same bits batched as alone, and every row recomputed over stale "
          "KV equals full prefill") {
  if (no_amx()) return;
  const CpuLlama model = small_bf16();
  const std::vector<Prompt> ps = prompts();
  std::vector<LlamaKVCache> kvs;
  std::vector<BatchItem> items(ps.size());
  for (const Prompt& p : ps) kvs.push_back(model.prefill_chunk(p.tokens, 3));  // stale: computed at other positions
  for (std::size_t i = 0; i < ps.size(); ++i) {
    for (std::size_t r = 0; r < ps[i].tokens.size(); ++r) kvs[i].positions[r] = static_cast<std::int64_t>(r);
    items[i].kv = &kvs[i];
    append_range(items[i].rows, {0, static_cast<std::int64_t>(ps[i].tokens.size())});
    items[i].tokens = ps[i].tokens;
  }
  NoHooks hooks;
  model.forward(items, hooks);
  for (std::size_t i = 0; i < ps.size(); ++i) {
    CAPTURE(i);
    REQUIRE(items[i].status == Status::success);
    const LlamaPrefill full = model.full_prefill(ps[i].tokens);
    CHECK(items[i].logits == full.logits);
    CHECK(kvs[i].k == full.kv.k);
    CHECK(kvs[i].v == full.kv.v);
  }
}

TEST_CASE("bf16 products: CpuBatchEngine gives each request the tokens it gets alone (fixed-set, per-layer and "
          "Cache-Craft methods)") {
  if (no_amx()) return;
  const CpuLlama model = small_bf16();
  const std::vector<Prompt> ps = prompts();
  for (const std::string method : {"full", "naive", "cacheblend", "cachecraft"}) {
    CAPTURE(method);
    InMemoryKVStore store;
    {
      CpuLlamaFusion engine(model);
      FusionPipeline pipeline(engine, store);
      for (const Prompt& p : ps) pipeline.store_chunk_caches(p.tokens, p.layout);
    }
    std::vector<GenerationRequest> all;
    for (const Prompt& p : ps) {
      GenerationRequest r;
      r.tokens = p.tokens;
      r.layout = p.layout;
      r.method = parse_method(method);
      r.max_new_tokens = 5;
      all.push_back(r);
    }
    CpuBatchEngine<InMemoryKVStore> batched(model, store, {{6}, {}, 64});  // a small budget: chunked full prefill
    const auto got = serve(batched, all);
    REQUIRE(got.size() == ps.size());
    std::size_t i = 0;
    for (const auto& [id, tokens] : got) {
      CAPTURE(i);
      CHECK(tokens.size() == 5);
      InMemoryKVStore alone_store;  // the same chunk caches, none of the batch's variants
      {
        CpuLlamaFusion engine(model);
        FusionPipeline pipeline(engine, alone_store);
        for (const Prompt& p : ps) pipeline.store_chunk_caches(p.tokens, p.layout);
      }
      CpuBatchEngine<InMemoryKVStore> alone(model, alone_store);
      if (method != "cachecraft" || i == 0) CHECK(serve(alone, {all[i]}).begin()->second == tokens);
      ++i;
    }
  }
}

TEST_CASE("bf16 products: logits and KV within bf16's rounding of fp32's, and a fingerprint of their own") {
  if (no_amx()) return;
  const CpuLlama bf16_model = small_bf16();
  const CpuLlama fp32_model = kvfuse_test::small_llama();
  CHECK(bf16_model.fingerprint() != fp32_model.fingerprint());
  const Prompt p = prompts()[0];
  const LlamaPrefill a = bf16_model.full_prefill(p.tokens);
  const LlamaPrefill b = fp32_model.full_prefill(p.tokens);
  REQUIRE(a.logits.size() == b.logits.size());
  double worst = 0.0, scale = 0.0;
  for (std::size_t i = 0; i < a.logits.size(); ++i) {
    worst = std::max(worst, static_cast<double>(std::fabs(a.logits[i] - b.logits[i])));
    scale = std::max(scale, static_cast<double>(std::fabs(b.logits[i])));
  }
  CHECK(worst > 0.0);            // bf16 products are not fp32's
  CHECK(worst <= 0.02 * scale);  // and within a few bf16 roundings (2^-8 each) of them
  const std::vector<float> ka = kvfuse_test::flat_kv(a.kv), kb = kvfuse_test::flat_kv(b.kv);
  REQUIRE(ka.size() == kb.size());
  double k_worst = 0.0, k_scale = 0.0;
  for (std::size_t i = 0; i < ka.size(); ++i) {
    k_worst = std::max(k_worst, static_cast<double>(std::fabs(ka[i] - kb[i])));
    k_scale = std::max(k_scale, static_cast<double>(std::fabs(kb[i])));
  }
  CHECK(k_worst <= 0.02 * k_scale);
}

TEST_CASE("real model: SmolLM2 with bf16 products answers the ChatML question as with fp32 products") {
  if (no_amx()) return;
  const auto model_file = kvfuse_test::real_model(/*optimized_only=*/true);
  if (!model_file) return;
  const GGUFFile file = GGUFFile::open(*model_file);
  CpuLlamaOptions options;
  options.products = CpuProducts::bf16;
  const CpuLlama model = CpuLlama::from_gguf(file, options);
  if (model.config().n_layer != 30 || model.config().n_vocab != 49152) {
    kvfuse_test::skip(model_file->string() + " is not SmolLM2-135M");
    return;
  }
  // The prompt and greedy answer of cpu_llama.cpp's real-model case ("The capital of France is Paris.").
  const std::vector<token_id> prompt{1, 4093, 198, 1780, 314, 260, 3575, 282, 4649, 47, 2, 198, 1, 520, 9531, 198};
  const LlamaPrefill full = model.full_prefill(prompt);
  LlamaKVCache kv = full.kv;
  CHECK(model.greedy_decode(kv, full.logits, 16, 2) == std::vector<token_id>{504, 3575, 282, 4649, 314, 7042, 30});
}

}  // namespace unit_cpu_llama_bf16
