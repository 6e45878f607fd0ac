// kvfuse on llama.cpp (LlamaCppFusion), on the real models: the equalities that must hold (kvfuse's full prefill
// and a 100 % recompute equal llama.cpp's own prefill; a chunk computed alone and shifted to p equals it computed
// alone at p), the rows AttnLink recomputes are the rows it planned, bad store entries are refused and recomputed,
// and the attention statistics Cache-Craft profiles with are llama.cpp's softmax.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <doctest/doctest.h>

#include "passages.hpp"
#include <unistd.h>

#include "kvfuse/backend/disk_kv_store.hpp"
#include "kvfuse/backend/in_memory_store.hpp"
#include "kvfuse/harness/metrics.hpp"
#include "kvfuse/fusion/fusion_pipeline.hpp"
#include "kvfuse/llamacpp.hpp"
#include "kvfuse/model/gguf.hpp"
#include "kvfuse/harness/rag_prompt.hpp"
#include "kvfuse/model/tokenizer.hpp"
#include "support/model_path.hpp"

namespace {

using kvfuse::llamacpp::LlamaCppFusion;
using kvfuse::llamacpp::LlamaCppOptions;
using kvfuse_test::RealModel;

struct RealPrompt {
  std::vector<kvfuse::token_id> tokens;
  kvfuse::PromptLayout layout;
};

RealPrompt rag_prompt(const std::filesystem::path& model, std::vector<std::string> passages) {
  const kvfuse::GGUFFile file = kvfuse::GGUFFile::open(model);
  const kvfuse::Tokenizer tok = kvfuse::Tokenizer::from_gguf(file);
  const kvfuse::RagPrompt p = kvfuse::build_rag_prompt(
      tok, "Answer the question using the documents.", passages, "Which river flows through the capital of the country "
                                                                 "where the composer of the opera was born?");
  return {p.tokens, p.layout()};
}

using kvfuse_llamacpp_test::kPassages;

// Relative L2 distance of two logit vectors.
double rel_error(const std::vector<float>& a, const std::vector<float>& b) {
  REQUIRE(a.size() == b.size());
  double num = 0, den = 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    num += (double(a[i]) - b[i]) * (double(a[i]) - b[i]);
    den += double(b[i]) * b[i];
  }
  return std::sqrt(num / den);
}

// llama.cpp by itself: a new context (one sequence, defaults but flash attention as the backend's) decodes the
// prompt; the last token's logits.
std::vector<float> llama_cpp_prefill(const std::filesystem::path& model, std::span<const kvfuse::token_id> tokens) {
  llama_model* m = llama_model_load_from_file(model.string().c_str(), llama_model_default_params());
  REQUIRE(m != nullptr);
  llama_context_params cp = llama_context_default_params();
  cp.n_ctx = 4096;
  cp.n_batch = 512;
  cp.flash_attn_type = LLAMA_FLASH_ATTN_TYPE_DISABLED;
  llama_context* ctx = llama_init_from_model(m, cp);
  REQUIRE(ctx != nullptr);
  std::vector<float> out;
  for (std::size_t done = 0; done < tokens.size();) {
    const std::size_t n = std::min<std::size_t>(512, tokens.size() - done);
    llama_batch b = llama_batch_init(static_cast<std::int32_t>(n), 0, 1);
    b.n_tokens = static_cast<std::int32_t>(n);
    for (std::size_t i = 0; i < n; ++i) {
      b.token[i] = tokens[done + i];
      b.pos[i] = static_cast<llama_pos>(done + i);
      b.n_seq_id[i] = 1;
      b.seq_id[i][0] = 0;
      b.logits[i] = done + i + 1 == tokens.size();
    }
    REQUIRE(llama_decode(ctx, b) == 0);
    if (done + n == tokens.size()) {
      const float* z = llama_get_logits_ith(ctx, static_cast<std::int32_t>(n - 1));
      out.assign(z, z + llama_vocab_n_tokens(llama_model_get_vocab(m)));
    }
    llama_batch_free(b);
    done += n;
  }
  llama_free(ctx);
  llama_model_free(m);
  return out;
}

kvfuse::TokenSet all_rows(std::int64_t n) {
  kvfuse::TokenSet rows;
  for (std::int64_t t = 0; t < n; ++t) rows.push_back(t);
  return rows;
}

// The K and V values of a stored block (LlamaCppFusion: llama.cpp sequence states of at most `window` cells each,
// concatenated; cells without extension data), per cache section (one, or two with sliding-window layers: the
// global layers' cache, then the local layers'), per layer, as floats, the pieces' cells in order.
struct StateSection {
  std::vector<std::vector<float>> k, v;  // per layer of the section
};
std::vector<StateSection> state_values(const std::vector<std::byte>& bytes, std::int64_t cells, std::int64_t window,
                                       std::size_t sections) {
  std::size_t at = 0;
  const auto u32 = [&] {
    std::uint32_t v;
    std::memcpy(&v, bytes.data() + at, 4);
    at += 4;
    return v;
  };
  const auto u64 = [&] {
    std::uint64_t v;
    std::memcpy(&v, bytes.data() + at, 8);
    at += 8;
    return v;
  };
  const auto values = [&](std::uint32_t type, std::size_t count, std::vector<float>& out) {
    REQUIRE((type == GGML_TYPE_F16 || type == GGML_TYPE_F32));
    for (std::size_t i = 0; i < count; ++i) {
      if (type == GGML_TYPE_F32) {
        float f;
        std::memcpy(&f, bytes.data() + at, 4);
        out.push_back(f);
        at += 4;
      } else {
        ggml_fp16_t h;
        std::memcpy(&h, bytes.data() + at, 2);
        out.push_back(ggml_fp16_to_fp32(h));
        at += 2;
      }
    }
  };
  std::vector<StateSection> out(sections);
  for (std::int64_t done = 0; done < cells; done += window) {
    const std::int64_t m = std::min(window, cells - done);
    at += 8;  // magic, sequence id
    for (StateSection& sec : out) {
      REQUIRE(u32() == 1);  // streams
      REQUIRE(u32() == static_cast<std::uint32_t>(m));
      for (std::int64_t c = 0; c < m; ++c) {
        (void)u32();  // position
        const std::uint32_t n_seq = u32();
        at += 4u * n_seq;
      }
      const std::uint32_t v_trans = u32();
      const std::uint32_t n_layer = u32();
      sec.k.resize(n_layer);
      sec.v.resize(n_layer);
      for (std::uint32_t l = 0; l < n_layer; ++l) {
        const std::uint32_t type = u32();
        const std::uint64_t row = u64();
        values(type, static_cast<std::size_t>(row * m / (type == GGML_TYPE_F32 ? 4 : 2)), sec.k[l]);
      }
      for (std::uint32_t l = 0; l < n_layer; ++l) {
        const std::uint32_t type = u32();
        if (v_trans != 0) {
          const std::uint32_t el = u32();
          const std::uint32_t n_embd = u32();
          REQUIRE(el == (type == GGML_TYPE_F32 ? 4u : 2u));
          values(type, static_cast<std::size_t>(n_embd) * m, sec.v[l]);
        } else {
          const std::uint64_t row = u64();
          values(type, static_cast<std::size_t>(row * m / (type == GGML_TYPE_F32 ? 4 : 2)), sec.v[l]);
        }
      }
    }
  }
  REQUIRE(at == bytes.size());
  return out;
}

// max |a − b| / max |b|
double max_rel(const std::vector<float>& a, const std::vector<float>& b) {
  REQUIRE(a.size() == b.size());
  double d = 0, m = 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    d = std::max(d, std::abs(double(a[i]) - b[i]));
    m = std::max(m, std::abs(double(b[i])));
  }
  return d / m;
}

void for_each_model(const auto& body) {
  for (RealModel which : {RealModel::smollm2, RealModel::gemma3}) {
    const auto path = kvfuse_test::real_model(true, which);
    if (!path) continue;
    CAPTURE(path->filename().string());
    body(*path);
  }
}

}  // namespace

TEST_CASE("real model: llama.cpp: kvfuse's full prefill and a 100 % recompute over loaded chunks equal llama.cpp's "
          "own prefill, with more chunks waiting for their positions than the engine has scratch sequences") {
  for_each_model([](const std::filesystem::path& model) {
    const RealPrompt p = rag_prompt(model, kPassages);
    const auto n = static_cast<std::int64_t>(p.tokens.size());
    const std::vector<float> reference = llama_cpp_prefill(model, p.tokens);

    // Two scratch pairs, the fewest load_rows works with: a loaded block waits outside llama.cpp's cache until the
    // first run that needs it, so it holds no sequence of its own meanwhile.
    LlamaCppFusion engine(model, {.n_ctx = 2048, .scratch_pairs = 2});
    REQUIRE(p.layout.chunks.size() > 2);
    kvfuse::InMemoryKVStore store;
    kvfuse::FusionPipeline pipeline(engine, store);
    const kvfuse::FusionResult full = pipeline.run(p.tokens, p.layout, kvfuse::FullRecompute{});
    CHECK(rel_error(full.logits, reference) < 1e-4);
    CHECK(engine.request_cells() == n);

    // Every chunk loaded from its isolated cache, all of them waiting at position 0 at once, then shifted into place
    // and every row recomputed.
    engine.begin(p.tokens);
    for (const kvfuse::PromptChunk& c : p.layout.chunks)
      engine.load_rows(c.range, engine.chunk_kv(std::span(p.tokens).subspan(static_cast<std::size_t>(c.range.begin),
                                                                             static_cast<std::size_t>(c.range.size())),
                                                0));
    for (const kvfuse::PromptChunk& c : p.layout.chunks)
      if (c.range.begin != 0) engine.shift_rows(c.range, c.range.begin);
    const std::vector<float> recomputed = engine.prefill(all_rows(n));
    CHECK(rel_error(recomputed, reference) < 1e-4);
    CHECK(kvfuse::argmax_token(recomputed) == kvfuse::argmax_token(reference));
    CHECK(engine.request_cells() == n);  // every row once: the loaded copies were dropped
  });
}

// A passage longer than Gemma 3's sliding window (512): its block is stored in pieces of at most a window.
std::string long_passage() {
  std::string text;
  for (int i = 0; i < 4; ++i)
    for (const std::string& p : kPassages) text += p + " ";
  return text;
}

TEST_CASE("real model: llama.cpp: a chunk computed alone and shifted to p equals the chunk computed alone at p, "
          "moved in its bytes by kvfuse (f32, f16 cache) or by llama.cpp (q8_0)") {
  for_each_model([](const std::filesystem::path& model) {
    const RealPrompt p = rag_prompt(model, {kPassages[0], long_passage(), kPassages[1]});
    const kvfuse::TokenRange c = p.layout.chunks[2].range;  // the long passage
    REQUIRE(c.size() > 512);
    const auto chunk = std::span(p.tokens).subspan(static_cast<std::size_t>(c.begin), static_cast<std::size_t>(c.size()));
    for (ggml_type kv : {GGML_TYPE_F32, GGML_TYPE_F16, GGML_TYPE_Q8_0}) {
      const std::string type = ggml_type_name(kv);
      CAPTURE(type);
      // A quantized V cache needs llama.cpp's flash attention; kvfuse rotates f16 and f32 K, llama.cpp the rest.
      const bool quantized = kv == GGML_TYPE_Q8_0;
      LlamaCppFusion engine(model, {.n_ctx = 2048, .kv_type = kv, .flash_attention = quantized});
      CHECK(engine.shifts_blocks() == !quantized);
      // The chunk's rows in a prompt that recomputes everything else: the query's logits and the chunk's stored KV.
      const auto run = [&](const kvfuse::KVBlock& block) {
        engine.begin(p.tokens);
        engine.load_rows(c, block);
        if (block.first_position != c.begin) engine.shift_rows(c, c.begin - block.first_position);
        kvfuse::TokenSet rows;
        for (std::int64_t t = 0; t < static_cast<std::int64_t>(p.tokens.size()); ++t)
          if (!c.contains(t)) rows.push_back(t);
        std::vector<float> logits = engine.prefill(rows);
        return std::pair{logits, engine.save_rows(c)};
      };
      const auto [shifted_logits, shifted] = run(engine.chunk_kv(chunk, 0));
      const auto [direct_logits, direct] = run(engine.chunk_kv(chunk, c.begin));
      REQUIRE(shifted.bytes.size() == direct.bytes.size());
      if (quantized) {  // q8_0 blocks of 32 values with a scale: compared through the logits alone
        MESSAGE("q8_0 cache, shifted by llama.cpp: logits " << rel_error(shifted_logits, direct_logits));
        CHECK(rel_error(shifted_logits, direct_logits) < 0.1);
        CHECK(kvfuse::argmax_token(shifted_logits) == kvfuse::argmax_token(direct_logits));
        continue;
      }
      const std::size_t sections = engine.window() < c.size() ? 2 : 1;  // sliding-window layers: a second cache
      const std::vector<StateSection> a = state_values(shifted.bytes, c.size(), engine.window(), sections);
      const std::vector<StateSection> b = state_values(direct.bytes, c.size(), engine.window(), sections);
      // Layer 0's K depends on the token and its position only: the shift is exact to the rounding of the
      // rotation (llama.cpp's angles are p · θ in float: a relative error growing with p, 1e-5 at p ~ 600) and of
      // the f16 cell. Deeper layers go through attention, where llama.cpp quantizes the
      // activations to 8 bits for its quantized weights: a rounding difference anywhere flips some of those
      // roundings, and that is the floor the rest is compared at (the same floor separates two placements of the
      // same cells: FusionPipeline results on llama.cpp are reproducible only to it).
      const double tol0 = kv == GGML_TYPE_F32 ? 5e-5 : 2e-3;
      CHECK(max_rel(a.back().k[0], b.back().k[0]) < tol0);
      CHECK(max_rel(a.back().v[0], b.back().v[0]) < tol0);
      double worst = 0;
      for (std::size_t sec = 0; sec < a.size(); ++sec)
        for (std::size_t l = 0; l < a[sec].k.size(); ++l)
          worst = std::max({worst, max_rel(a[sec].k[l], b[sec].k[l]), max_rel(a[sec].v[l], b[sec].v[l])});
      MESSAGE("largest difference over all layers " << worst << ", logits " << rel_error(shifted_logits, direct_logits));
      // Measured on this 550-token passage: SmolLM2 0.08, Gemma 3 0.29–0.38 (grows layer by layer from 0.01, no
      // step at a global layer); a wrong rotation on some layers gives O(1) from that layer on.
      CHECK(worst < 0.5);
      CHECK(rel_error(shifted_logits, direct_logits) < 0.1);
      CHECK(kvfuse::argmax_token(shifted_logits) == kvfuse::argmax_token(direct_logits));
    }
  });
}

TEST_CASE("real model: llama.cpp: shift_block moves a block as llama.cpp's own K shift does, on every layer") {
  for_each_model([](const std::filesystem::path& model) {
    const RealPrompt p = rag_prompt(model, {kPassages[0], long_passage(), kPassages[1]});
    const kvfuse::TokenRange c = p.layout.chunks[2].range;  // longer than Gemma 3's window: two pieces
    const auto chunk = std::span(p.tokens).subspan(static_cast<std::size_t>(c.begin), static_cast<std::size_t>(c.size()));
    const std::int64_t delta = 3000;
    for (ggml_type kv : {GGML_TYPE_F32, GGML_TYPE_F16}) {
      const std::string type = ggml_type_name(kv);
      CAPTURE(type);
      LlamaCppFusion engine(model, {.n_ctx = 2048, .kv_type = kv});
      REQUIRE(engine.shifts_blocks());
      engine.begin(p.tokens);
      const kvfuse::KVBlock block = engine.chunk_kv(chunk, 0);
      std::vector<std::byte> ours = block.bytes;
      REQUIRE(engine.shift_block(ours, c.size(), 0, delta));

      // llama.cpp's shift: each piece restored into a context of the engine's kind, moved by llama_memory_seq_add,
      // rotated by the next decode (one token of a third sequence), saved.
      llama_model* m = llama_model_load_from_file(model.string().c_str(), llama_model_default_params());
      REQUIRE(m != nullptr);
      llama_context_params cp = llama_context_default_params();
      cp.n_ctx = 2048;
      cp.n_seq_max = 3;
      cp.type_k = cp.type_v = kv;
      cp.flash_attn_type = LLAMA_FLASH_ATTN_TYPE_DISABLED;
      cp.swa_full = cp.kv_unified = true;
      llama_context* ctx = llama_init_from_model(m, cp);
      REQUIRE(ctx != nullptr);
      std::vector<std::byte> theirs;
      std::size_t at = 0;
      for (std::int64_t done = 0; done < c.size(); done += engine.window()) {
        const std::size_t size = engine.block_bytes(std::min(engine.window(), c.size() - done));
        llama_memory_clear(llama_get_memory(ctx), true);
        REQUIRE(llama_state_seq_set_data(ctx, reinterpret_cast<const std::uint8_t*>(block.bytes.data()) + at, size,
                                         0) == size);
        // Pinned by sequence 1: llama.cpp may give a cell of one sequence that its window masks to a new token.
        llama_memory_seq_cp(llama_get_memory(ctx), 0, 1, -1, -1);
        llama_memory_seq_add(llama_get_memory(ctx), 0, -1, -1, static_cast<llama_pos>(delta));
        llama_batch b = llama_batch_init(1, 0, 1);
        b.n_tokens = 1;
        b.token[0] = p.tokens[0];
        b.pos[0] = 0;
        b.n_seq_id[0] = 1;
        b.seq_id[0][0] = 2;
        b.logits[0] = 1;
        REQUIRE(llama_decode(ctx, b) == 0);
        llama_batch_free(b);
        std::vector<std::byte> piece(llama_state_seq_get_size(ctx, 0));
        REQUIRE(llama_state_seq_get_data(ctx, reinterpret_cast<std::uint8_t*>(piece.data()), piece.size(), 0) ==
                piece.size());
        theirs.insert(theirs.end(), piece.begin(), piece.end());
        at += size;
      }
      llama_free(ctx);
      llama_model_free(m);
      REQUIRE(theirs.size() == ours.size());
      CHECK(engine.block_mismatch(ours, c.size(), delta).empty());  // every cell at its position + delta
      CHECK(engine.block_mismatch(theirs, c.size(), delta).empty());

      // V the same, and K: the same angles (ggml's float table) and rotation, so the same floats but where one
      // compiler fused a multiply-add the other did not (measured 1.2e-7 of the largest value with an f32 cache)
      // and the f16 roundings that flips (one f16 step: 3e-4 to 6e-4 measured).
      const std::size_t sections = engine.window() < c.size() ? 2 : 1;
      const std::vector<StateSection> a = state_values(ours, c.size(), engine.window(), sections);
      const std::vector<StateSection> b = state_values(theirs, c.size(), engine.window(), sections);
      double worst = 0;
      for (std::size_t sec = 0; sec < a.size(); ++sec)
        for (std::size_t l = 0; l < a[sec].k.size(); ++l) {
          CHECK(a[sec].v[l] == b[sec].v[l]);
          worst = std::max(worst, max_rel(a[sec].k[l], b[sec].k[l]));
        }
      MESSAGE("largest K difference over all layers " << worst);
      CHECK(worst < (kv == GGML_TYPE_F32 ? 1e-6 : 1e-3));
    }
  });
}

TEST_CASE("real model: llama.cpp: AttnLink recomputes exactly the planned rows, its runs merged by the cost of a decode, "
          "and its first-token KL is below naive reuse's") {
  for_each_model([](const std::filesystem::path& model) {
    const RealPrompt p = rag_prompt(model, kPassages);
    LlamaCppFusion engine(model, {.n_ctx = 2048, .run_cost_rows = 4096});
    kvfuse::InMemoryKVStore store;
    kvfuse::FusionPipeline pipeline(engine, store);
    pipeline.store_chunk_caches(p.tokens, p.layout);
    const kvfuse::FusionResult full = pipeline.run(p.tokens, p.layout, kvfuse::FullRecompute{});
    const kvfuse::FusionResult naive = pipeline.run(p.tokens, p.layout, kvfuse::NaiveReuse{});
    CHECK(engine.last_prefill_rows() == naive.plan.initial);
    const kvfuse::FusionMethod attnlink = kvfuse::parse_method("attnlink@16");
    const kvfuse::FusionPlan plan = pipeline.plan(p.tokens, p.layout, attnlink);
    kvfuse::EngineShape free_calls = pipeline.shape();
    CHECK(free_calls.run_cost_rows == 4096);
    free_calls.run_cost_rows = 0;
    const kvfuse::FusionPlan unmerged = kvfuse::plan_fusion(0, p.tokens, p.layout, attnlink, free_calls, store);
    CHECK(plan.initial == kvfuse::merge_runs(unmerged.initial, 4096));
    // A decode dearer than the prompt: one run from the first boundary to the end, a superset of AttnLink's rows.
    CHECK(plan.initial.size() > unmerged.initial.size());
    CHECK(plan.initial.back() - plan.initial.front() + 1 == static_cast<std::int64_t>(plan.initial.size()));
    CHECK(plan.initial.front() == unmerged.initial.front());
    const kvfuse::FusionResult linked = pipeline.run(p.tokens, p.layout, attnlink);
    CHECK(linked.plan.initial == plan.initial);
    CHECK(engine.last_prefill_rows() == plan.initial);
    CHECK(engine.request_cells() == static_cast<std::int64_t>(p.tokens.size()));
    CHECK(linked.rejected_entries == 0);
    const double kl_naive = kvfuse::eval::kl_divergence(full.logits, naive.logits);
    const double kl_linked = kvfuse::eval::kl_divergence(full.logits, linked.logits);
    MESSAGE("KL vs full prefill: naive " << kl_naive << ", attnlink@16 " << kl_linked);
    CHECK(kl_naive > 0.0);
    CHECK(kl_linked < kl_naive);

    // CacheBlend changes the set per layer: refused for this backend by name.
    CHECK_THROWS_WITH_AS(pipeline.run(p.tokens, p.layout, kvfuse::parse_method("cacheblend")),
                         doctest::Contains("changes the recomputed set per layer"), kvfuse::error);
  });
}

TEST_CASE("real model: llama.cpp: a block at other positions, with a position held twice, with another layer type or "
          "with bytes that are not a sequence state is refused by load_rows by name, and takes no scratch sequence") {
  const auto model = kvfuse_test::real_model(true, RealModel::smollm2);
  if (!model) return;
  const RealPrompt p = rag_prompt(*model, kPassages);
  LlamaCppFusion engine(*model, {.n_ctx = 2048, .scratch_pairs = 2});
  const kvfuse::TokenRange c = p.layout.chunks[1].range;
  const auto chunk = std::span(p.tokens).subspan(static_cast<std::size_t>(c.begin), static_cast<std::size_t>(c.size()));
  engine.begin(p.tokens);
  kvfuse::KVBlock moved = engine.chunk_kv(chunk, 0);
  moved.first_position = 5;  // the state holds positions 0 ..
  CHECK_THROWS_WITH_AS(engine.load_rows(c, moved), doctest::Contains("holds positions [0, "), kvfuse::error);
  kvfuse::KVBlock garbage = engine.chunk_kv(chunk, 0);
  std::fill(garbage.bytes.begin(), garbage.bytes.begin() + 16, std::byte{0xff});
  CHECK_THROWS_WITH_AS(engine.load_rows(c, garbage), doctest::Contains("is not a sequence state of this model"),
                       kvfuse::error);
  // llama.cpp's state: magic, sequence, stream count, cell count, then 12 bytes per cell (position, 1, sequence),
  // then V transposed, the layer count and layer 0's K type and row size.
  const auto at_cell = [](std::size_t i) { return 16 + 12 * i; };
  kvfuse::KVBlock twice = engine.chunk_kv(chunk, 0);
  std::int32_t fourth = 0;
  std::memcpy(&fourth, twice.bytes.data() + at_cell(3), 4);
  REQUIRE(fourth == 3);
  std::memcpy(twice.bytes.data() + at_cell(4), &fourth, 4);  // cells 3 and 4 both at position 3, none at 4
  CHECK_THROWS_WITH_AS(engine.load_rows(c, twice), doctest::Contains("not each of [0, "), kvfuse::error);
  kvfuse::KVBlock retyped = engine.chunk_kv(chunk, 0);
  const std::size_t k_type = at_cell(static_cast<std::size_t>(c.size())) + 8;
  const std::int32_t f32 = GGML_TYPE_F32;
  std::memcpy(retyped.bytes.data() + k_type, &f32, 4);  // K of layer 0 claims f32 in an f16 cache
  CHECK_THROWS_WITH_AS(engine.load_rows(c, retyped), doctest::Contains("another cache or layer layout"),
                       kvfuse::error);
  // Refusing took no scratch pair: computing a chunk cache takes them both, and a good block loads.
  const kvfuse::KVBlock good = engine.chunk_kv(chunk, 0);
  engine.load_rows(c, good);
  engine.shift_rows(c, c.begin);
  const std::vector<float> logits = engine.prefill(all_rows(static_cast<std::int64_t>(p.tokens.size())));
  CHECK(static_cast<std::int64_t>(logits.size()) == engine.vocab_size());
}

TEST_CASE("real model: llama.cpp: corrupt and foreign store entries are refused and recomputed") {
  const auto model = kvfuse_test::real_model(true, RealModel::smollm2);
  if (!model) return;
  const RealPrompt p = rag_prompt(*model, kPassages);
  LlamaCppFusion engine(*model, {.n_ctx = 2048});
  const std::filesystem::path dir =
      std::filesystem::temp_directory_path() / ("kvfuse-llamacpp-test-" + std::to_string(::getpid()));
  std::filesystem::remove_all(dir);
  kvfuse::FusionResult clean;
  {
    kvfuse::DiskKVStore disk(dir);
    kvfuse::FusionPipeline pipeline(engine, disk);
    pipeline.store_chunk_caches(p.tokens, p.layout);
    clean = pipeline.run(p.tokens, p.layout, kvfuse::NaiveReuse{});
    CHECK(clean.rejected_entries == 0);

    // One payload byte flipped in the second passage's entry: its checksum fails, it is recomputed and put back.
    const kvfuse::PromptChunk& c = p.layout.chunks[2];
    const std::filesystem::path entry = disk.path_for(pipeline.isolated_key(
        std::span(p.tokens).subspan(static_cast<std::size_t>(c.range.begin), static_cast<std::size_t>(c.range.size()))));
    REQUIRE(std::filesystem::exists(entry));
    {
      std::fstream f(entry, std::ios::in | std::ios::out | std::ios::binary);
      f.seekp(static_cast<std::streamoff>(std::filesystem::file_size(entry) - 100));
      char b = 0;
      f.read(&b, 1);
      f.seekp(static_cast<std::streamoff>(std::filesystem::file_size(entry) - 100));
      b = static_cast<char>(b ^ 0x40);
      f.write(&b, 1);
    }
    const kvfuse::FusionResult corrupt = pipeline.run(p.tokens, p.layout, kvfuse::NaiveReuse{});
    CHECK(corrupt.rejected_entries == 1);
    CHECK(rel_error(corrupt.logits, clean.logits) < 0.05);  // the cells sit elsewhere (see the shift test)
    CHECK(kvfuse::argmax_token(corrupt.logits) == kvfuse::argmax_token(clean.logits));
    MESSAGE("recomputed entry: logits differ by " << rel_error(corrupt.logits, clean.logits));
    CHECK(pipeline.run(p.tokens, p.layout, kvfuse::NaiveReuse{}).rejected_entries == 0);  // put back
  }
  std::filesystem::remove_all(dir);

  // Another model's block under this model's key (same tokens): refused by its size, recomputed.
  const auto gemma = kvfuse_test::real_model(true, RealModel::gemma3);
  if (gemma) {
    LlamaCppFusion other(*gemma, {.n_ctx = 1024});
    CHECK(other.model_fingerprint() != engine.model_fingerprint());
    kvfuse::InMemoryKVStore store;
    kvfuse::FusionPipeline pipeline(engine, store);
    pipeline.store_chunk_caches(p.tokens, p.layout);
    const kvfuse::PromptChunk& c = p.layout.chunks[1];
    const auto chunk =
        std::span(p.tokens).subspan(static_cast<std::size_t>(c.range.begin), static_cast<std::size_t>(c.range.size()));
    store.put(pipeline.isolated_key(chunk), other.chunk_kv(chunk, 0));
    const kvfuse::FusionResult foreign = pipeline.run(p.tokens, p.layout, kvfuse::NaiveReuse{});
    CHECK(foreign.rejected_entries == 1);
    CHECK(rel_error(foreign.logits, clean.logits) < 0.05);
    CHECK(kvfuse::argmax_token(foreign.logits) == kvfuse::argmax_token(clean.logits));
  }
  // The fingerprint covers what fixes the stored layout: another KV type gets other keys.
  LlamaCppFusion f32(*model, {.n_ctx = 256, .kv_type = GGML_TYPE_F32});
  CHECK(f32.model_fingerprint() != engine.model_fingerprint());
}

TEST_CASE("real model: llama.cpp: attention statistics are llama.cpp's softmax, and Cache-Craft runs on them") {
  for_each_model([](const std::filesystem::path& model) {
    const RealPrompt p = rag_prompt(model, kPassages);
    const auto n = static_cast<std::int64_t>(p.tokens.size());
    LlamaCppFusion engine(model, {.n_ctx = 2048});
    engine.begin(p.tokens);
    std::vector<kvfuse::LayerAttention> layers;
    const std::vector<float> logits = engine.prefill(
        all_rows(n), p.layout, [&](std::int64_t l, kvfuse::LayerAttention a) {
          CHECK(l == static_cast<std::int64_t>(layers.size()));
          layers.push_back(std::move(a));
        });
    REQUIRE(static_cast<std::int64_t>(layers.size()) == engine.num_layers());
    CHECK(rel_error(logits, llama_cpp_prefill(model, p.tokens)) < 1e-4);
    // Each row's weights sum to 1 per head: the mass over all groups is the same for every row and layer.
    const double heads = [&] {
      double s = 0;
      for (std::int64_t g = 0; g < layers[0].num_groups; ++g) s += layers[0].at(0, static_cast<std::size_t>(g));
      return s;
    }();
    CHECK(heads == doctest::Approx(std::round(heads)).epsilon(1e-4));
    for (const kvfuse::LayerAttention& a : layers)
      for (std::int64_t row = 0; row < n; row += 17) {
        double s = 0;
        for (std::int64_t g = 0; g < a.num_groups; ++g) s += a.at(static_cast<std::size_t>(row), static_cast<std::size_t>(g));
        CHECK(s == doctest::Approx(heads).epsilon(1e-3));
        CHECK(a.self_mass[static_cast<std::size_t>(row)] <= s + 1e-4);
      }
    // Row 0 sees only itself.
    CHECK(layers[0].self_mass[0] == doctest::Approx(heads).epsilon(1e-4));
    // Without the eval callback the statistics are refused by name.
    LlamaCppFusion plain(model, {.n_ctx = 512, .attention_statistics = false});
    plain.begin(std::span(p.tokens).first(64));
    CHECK_THROWS_WITH_AS((void)plain.prefill(all_rows(64), kvfuse::PromptLayout::from_lengths({60}, 4),
                                             [](std::int64_t, kvfuse::LayerAttention) {}),
                         doctest::Contains("LlamaCppOptions::attention_statistics"), kvfuse::error);

    // Cache-Craft: variants recorded from an earlier prompt (passages reordered), then the fixed-set run.
    std::vector<std::string> earlier = kPassages;
    std::reverse(earlier.begin() + 1, earlier.end());
    const RealPrompt warm = rag_prompt(model, earlier);
    kvfuse::InMemoryKVStore store;
    kvfuse::FusionPipeline pipeline(engine, store);
    pipeline.store_chunk_caches(p.tokens, p.layout);
    pipeline.record_context(warm.tokens, warm.layout);
    CHECK(pipeline.variants().size() == p.layout.chunks.size());
    const kvfuse::FusionResult full = pipeline.run(p.tokens, p.layout, kvfuse::FullRecompute{});
    const kvfuse::FusionResult naive = pipeline.run(p.tokens, p.layout, kvfuse::NaiveReuse{});
    const kvfuse::FusionResult craft = pipeline.run(p.tokens, p.layout, kvfuse::parse_method("cachecraft-nofocus"));
    CHECK(engine.last_prefill_rows() == craft.plan.initial);
    CHECK(craft.recompute_fraction < 0.9);
    const double kl_naive = kvfuse::eval::kl_divergence(full.logits, naive.logits);
    const double kl_craft = kvfuse::eval::kl_divergence(full.logits, craft.logits);
    MESSAGE("KL vs full prefill: naive " << kl_naive << ", cachecraft " << kl_craft);
    CHECK(kl_craft < kl_naive);
  });
}

TEST_CASE("real model: llama.cpp: teacher forcing and greedy decoding continue the prompt's KV") {
  const auto model = kvfuse_test::real_model(true, RealModel::smollm2);
  if (!model) return;
  const RealPrompt p = rag_prompt(*model, kPassages);
  LlamaCppFusion engine(*model, {.n_ctx = 2048});
  kvfuse::InMemoryKVStore store;
  kvfuse::FusionPipeline pipeline(engine, store);
  const kvfuse::FusionResult full = pipeline.run(p.tokens, p.layout, kvfuse::FullRecompute{});
  const std::vector<kvfuse::token_id> answer = engine.greedy(full.logits, 6, -1);
  REQUIRE(answer.size() == 6);
  engine.truncate_to_prompt();
  const auto forced = engine.forced_logits(full.logits, answer);
  engine.truncate_to_prompt();
  REQUIRE(forced.size() == answer.size());
  for (std::size_t i = 0; i < answer.size(); ++i) CHECK(kvfuse::argmax_token(forced[i]) == answer[i]);
  // The prompt with the first three answer tokens, prefilled by llama.cpp alone: the fourth distribution.
  std::vector<kvfuse::token_id> longer = p.tokens;
  longer.insert(longer.end(), answer.begin(), answer.begin() + 3);
  CHECK(rel_error(forced[3], llama_cpp_prefill(*model, longer)) < 1e-4);
  CHECK(engine.request_cells() == static_cast<std::int64_t>(p.tokens.size()));
}
