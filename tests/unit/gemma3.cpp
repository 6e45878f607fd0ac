// The gemma3 architecture of the reference CPU backend (backend/cpu/llama.hpp; llama.cpp LLM_ARCH_GEMMA3) on a
// tiny random-weight model: 3 layers, layers 0 and 1 local (sliding window of 4 positions) and layer 2 global,
// n_embd 32, 4 query heads / 1 KV head of dim 8, a 96-token vocabulary (the fusion prompts'). Checked against
// an independent double-precision forward pass written here, and against itself: full prefill == chunked
// prefill == the fusion loop at 100 % recompute; the window masks local layers only, wherever the rows sit;
// RoPE shifts rotate with each layer's base; from_gguf reads the gemma3.* keys and refuses what is not
// implemented. The real-model case loads Gemma 3 270M.
//
// Tolerances as in cpu_llama.cpp: "to rounding" is |a − b| <= 1e-5 · max(1, max |b|); bit-for-bit
// properties are checked with ==.
#include <doctest/doctest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <numeric>
#include <span>
#include <string>
#include <vector>

#include "kvfuse/backend/cpu_llama.hpp"
#include "kvfuse/backend/in_memory_store.hpp"
#include "kvfuse/detail/rope.hpp"
#include "kvfuse/fusion/fusion_pipeline.hpp"
#include "kvfuse/model/gguf.hpp"

#include "../../examples/paged_engine.hpp"
#include "../support/error_of.hpp"
#include "../support/fusion_prompts.hpp"
#include "../support/gguf_writer.hpp"
#include "../support/llama_kv.hpp"
#include "../support/model_path.hpp"
#include "../support/test_util.hpp"

// Each unit test file lives in its own namespace: the files are compiled together (a unity build).
namespace unit_gemma3 {

using kvfuse::CpuLlama;
using kvfuse::CpuLlamaSession;
using kvfuse::LlamaArchitecture;
using kvfuse::LlamaConfig;
using kvfuse::LlamaKVCache;
using kvfuse::LlamaWeights;
using kvfuse::RopePairing;
using kvfuse::RowMatrix;
using kvfuse::token_id;
using kvfuse::TokenSet;
using kvfuse_test::diff;
using kvfuse_test::all_rows;
using kvfuse_test::error_of;
using kvfuse_test::flat_kv;
using kvfuse_test::GGUFWriter;

namespace {

// Layers 0, 1 local and 2 global (and so on: llama.cpp's sliding-window pattern of period 3).
LlamaConfig tiny_gemma3_config(std::int64_t n_layer = 3) {
  LlamaConfig c;
  c.architecture = LlamaArchitecture::gemma3;
  c.n_layer = n_layer;
  c.n_embd = 32;
  c.n_head = 4;
  c.n_head_kv = 1;
  c.head_dim = 8;
  c.n_ff = 64;
  c.n_vocab = 96;
  c.rope_base = 1e6;
  c.rope_base_local = 1e4;
  c.rms_eps = static_cast<float>(1e-6);  // as stored in a GGUF file (float32)
  c.rope_pairing = RopePairing::half_split;
  c.sliding_window = 4;
  for (std::int64_t l = 0; l < n_layer; ++l) c.local_layers.push_back(l % 3 < 2 ? 1 : 0);
  c.embedding_scale = std::sqrt(32.0f);
  c.attention_scale = 1.0f / std::sqrt(8.0f);
  c.final_logit_softcap = 3.0;  // small enough to bend the tiny model's logits
  return c;
}

CpuLlama tiny_gemma3(const LlamaConfig& c = tiny_gemma3_config(), std::uint64_t seed = 17) {
  return CpuLlama(c, LlamaWeights::random(c, seed), kvfuse::CpuLlamaOptions{2, 4});
}

std::vector<token_id> prompt_tokens(std::size_t n, std::uint32_t seed = 1) {
  std::vector<token_id> t(n);
  for (std::size_t i = 0; i < n; ++i) t[i] = static_cast<token_id>((seed * 2654435761u + 97u * i * i + 13u * i) % 96u);
  return t;
}

// ------------------------------------------------------------------ independent reference (double precision)
// llama.cpp's gemma3 graph (models/gemma3.cpp) transcribed one token and one head at a time, from the config's
// fields, RoPE and GELU from their definitions. `ignore_window` / `one_base` get the window or the local RoPE
// base wrong on purpose, to show that the comparison would catch it.
struct Reference {
  std::vector<double> logits;             // of the last token
  std::vector<std::vector<double>> k, v;  // per layer, n x kv_dim (K rotated)
};

Reference reference_forward(const LlamaConfig& c, const LlamaWeights& w, const std::vector<token_id>& tokens,
                            bool ignore_window = false, bool one_base = false) {
  using Vec = std::vector<double>;
  const auto n = static_cast<std::int64_t>(tokens.size());
  const std::int64_t e = c.n_embd, hd = c.head_dim;
  const auto at = [](auto& v, std::int64_t i) -> auto& { return v[static_cast<std::size_t>(i)]; };
  const auto matvec = [](const kvfuse::WeightMatrix& w_m, const Vec& x) {
    const RowMatrix m = w_m.dense();
    Vec y(static_cast<std::size_t>(m.rows()), 0.0);
    for (Eigen::Index o = 0; o < m.rows(); ++o)
      for (Eigen::Index i = 0; i < m.cols(); ++i)
        y[static_cast<std::size_t>(o)] += m(o, i) * x[static_cast<std::size_t>(i)];
    return y;
  };
  // RMSNorm of x[off, off + len) in place, times g.
  const auto rmsnorm = [&](Vec& x, std::int64_t off, std::int64_t len, const Eigen::VectorXf& g) {
    double ss = 0;
    for (std::int64_t i = 0; i < len; ++i) ss += at(x, off + i) * at(x, off + i);
    const double scale = 1.0 / std::sqrt(ss / static_cast<double>(len) + c.rms_eps);
    for (std::int64_t i = 0; i < len; ++i) at(x, off + i) = at(x, off + i) * scale * g[i];
  };
  const auto rope = [&](double* x, std::int64_t pos, double base) {
    for (std::int64_t i = 0; i < hd / 2; ++i) {
      const double angle =
          static_cast<double>(pos) * std::pow(base, -2.0 * static_cast<double>(i) / static_cast<double>(hd));
      const std::int64_t a = c.rope_pairing == RopePairing::interleaved ? 2 * i : i;
      const std::int64_t b = c.rope_pairing == RopePairing::interleaved ? 2 * i + 1 : i + hd / 2;
      const double xa = x[a], xb = x[b];
      x[a] = xa * std::cos(angle) - xb * std::sin(angle);
      x[b] = xa * std::sin(angle) + xb * std::cos(angle);
    }
  };
  const auto gelu = [](double x) {
    return 0.5 * x * (1.0 + std::tanh(std::sqrt(2.0 / 3.14159265358979323846) * (x + 0.044715 * x * x * x)));
  };
  const double scale = c.attention_scale > 0 ? c.attention_scale : 1.0 / std::sqrt(static_cast<double>(hd));

  Reference ref;
  std::vector<Vec> h(static_cast<std::size_t>(n), Vec(static_cast<std::size_t>(e)));
  const RowMatrix embd = w.token_embd.dense();
  for (std::int64_t t = 0; t < n; ++t)
    for (std::int64_t i = 0; i < e; ++i) at(at(h, t), i) = embd(at(tokens, t), i) * c.embedding_scale;
  for (std::int64_t l = 0; l < c.n_layer; ++l) {
    const kvfuse::LlamaLayerWeights& lw = w.layers[static_cast<std::size_t>(l)];
    const bool local = c.is_local(l);
    const double base = local && !one_base ? c.rope_base_local : c.rope_base;
    const std::int64_t window = local && !ignore_window ? c.sliding_window : 0;
    std::vector<Vec> q(static_cast<std::size_t>(n)), k(q.size()), v(q.size());
    for (std::int64_t t = 0; t < n; ++t) {
      Vec x = at(h, t);
      rmsnorm(x, 0, e, lw.attn_norm);
      at(q, t) = matvec(lw.wq, x);
      at(k, t) = matvec(lw.wk, x);
      at(v, t) = matvec(lw.wv, x);
      for (std::int64_t hh = 0; hh < c.n_head; ++hh) {
        rmsnorm(at(q, t), hh * hd, hd, lw.attn_q_norm);
        rope(at(q, t).data() + hh * hd, t, base);
      }
      for (std::int64_t g = 0; g < c.n_head_kv; ++g) {
        rmsnorm(at(k, t), g * hd, hd, lw.attn_k_norm);
        rope(at(k, t).data() + g * hd, t, base);
      }
    }
    for (std::int64_t t = 0; t < n; ++t) {
      Vec out(static_cast<std::size_t>(c.q_dim()), 0.0);
      const std::int64_t lo = window > 0 ? std::max<std::int64_t>(0, t - window + 1) : 0;
      for (std::int64_t hh = 0; hh < c.n_head; ++hh) {
        const std::int64_t g = hh / (c.n_head / c.n_head_kv);
        Vec score(static_cast<std::size_t>(t + 1 - lo));
        double mx = -1e300;
        for (std::int64_t u = lo; u <= t; ++u) {
          double dot = 0;
          for (std::int64_t d = 0; d < hd; ++d) dot += at(at(q, t), hh * hd + d) * at(at(k, u), g * hd + d);
          at(score, u - lo) = dot * scale;
          mx = std::max(mx, at(score, u - lo));
        }
        double sum = 0;
        for (double& s : score) sum += (s = std::exp(s - mx));
        for (std::int64_t u = lo; u <= t; ++u)
          for (std::int64_t d = 0; d < hd; ++d)
            at(out, hh * hd + d) += at(score, u - lo) / sum * at(at(v, u), g * hd + d);
      }
      Vec o = matvec(lw.wo, out);
      rmsnorm(o, 0, e, lw.attn_post_norm);
      for (std::int64_t i = 0; i < e; ++i) at(at(h, t), i) += at(o, i);
      Vec x = at(h, t);
      rmsnorm(x, 0, e, lw.ffn_norm);
      const Vec gate = matvec(lw.w_gate, x), up = matvec(lw.w_up, x);
      Vec act(gate.size());
      for (std::size_t i = 0; i < gate.size(); ++i) act[i] = gelu(gate[i]) * up[i];
      Vec down = matvec(lw.w_down, act);
      rmsnorm(down, 0, e, lw.ffn_post_norm);
      for (std::int64_t i = 0; i < e; ++i) at(at(h, t), i) += at(down, i);
    }
    Vec kf, vf;
    for (std::int64_t t = 0; t < n; ++t) {
      kf.insert(kf.end(), at(k, t).begin(), at(k, t).end());
      vf.insert(vf.end(), at(v, t).begin(), at(v, t).end());
    }
    ref.k.push_back(std::move(kf));
    ref.v.push_back(std::move(vf));
  }
  Vec x = h.back();
  rmsnorm(x, 0, e, w.output_norm);
  ref.logits = matvec(w.output_head(), x);
  if (c.final_logit_softcap > 0)
    for (double& z : ref.logits) z = c.final_logit_softcap * std::tanh(z / c.final_logit_softcap);
  return ref;
}

// The tiny model as a gemma3 GGUF file (metadata as llama.cpp's converter writes it, pattern period 3);
// `edit` runs first: the metadata keys it writes replace these, the tensors it adds join them.
template <class Edit>
std::vector<std::byte> tiny_gemma3_gguf(const LlamaConfig& c, const LlamaWeights& w, Edit edit) {
  GGUFWriter g;
  edit(g);
  const auto u32 = [&g](const std::string& key, std::int64_t v) {
    if (!g.has(key)) g.u32(key, static_cast<std::uint32_t>(v));
  };
  const auto f32 = [&g](const std::string& key, double v) {
    if (!g.has(key)) g.f32(key, static_cast<float>(v));
  };
  g.str("general.architecture", "gemma3");
  u32("gemma3.block_count", c.n_layer);
  u32("gemma3.embedding_length", c.n_embd);
  u32("gemma3.feed_forward_length", c.n_ff);
  u32("gemma3.attention.head_count", c.n_head);
  u32("gemma3.attention.head_count_kv", c.n_head_kv);
  u32("gemma3.attention.key_length", c.head_dim);
  u32("gemma3.attention.value_length", c.head_dim);
  f32("gemma3.rope.freq_base", c.rope_base);
  f32("gemma3.attention.layer_norm_rms_epsilon", c.rms_eps);
  u32("gemma3.attention.sliding_window", c.sliding_window);
  u32("gemma3.attention.sliding_window_pattern", 3);
  f32("gemma3.final_logit_softcapping", c.final_logit_softcap);
  g.matrix("token_embd.weight", w.token_embd.dense());
  g.vector("output_norm.weight", w.output_norm);
  for (std::size_t l = 0; l < w.layers.size(); ++l) {
    const kvfuse::LlamaLayerWeights& lw = w.layers[l];
    const std::string p = "blk." + std::to_string(l) + ".";
    g.vector(p + "attn_norm.weight", lw.attn_norm);
    g.matrix(p + "attn_q.weight", lw.wq.dense());
    g.matrix(p + "attn_k.weight", lw.wk.dense());
    g.matrix(p + "attn_v.weight", lw.wv.dense());
    g.matrix(p + "attn_output.weight", lw.wo.dense());
    g.vector(p + "attn_q_norm.weight", lw.attn_q_norm);
    g.vector(p + "attn_k_norm.weight", lw.attn_k_norm);
    g.vector(p + "post_attention_norm.weight", lw.attn_post_norm);
    g.vector(p + "ffn_norm.weight", lw.ffn_norm);
    g.matrix(p + "ffn_gate.weight", lw.w_gate.dense());
    g.matrix(p + "ffn_up.weight", lw.w_up.dense());
    g.matrix(p + "ffn_down.weight", lw.w_down.dense());
    g.vector(p + "post_ffw_norm.weight", lw.ffn_post_norm);
  }
  return g.bytes();
}

}  // namespace

TEST_CASE("gemma3: full prefill matches an independent double-precision forward pass (window, bases, soft-cap)") {
  const CpuLlama model = tiny_gemma3();
  const std::vector<token_id> tokens = prompt_tokens(13);  // longer than the window of 4
  const kvfuse::LlamaPrefill out = model.full_prefill(tokens);
  const Reference ref = reference_forward(model.config(), model.weights(), tokens);
  const kvfuse_test::Diff logits = diff(out.logits, ref.logits);
  CAPTURE(logits.max_abs);
  CHECK(logits.rounding());
  for (std::size_t l = 0; l < 3; ++l) {
    CAPTURE(l);
    CHECK(diff(out.kv.k[l], ref.k[l]).rounding());
    CHECK(diff(out.kv.v[l], ref.v[l]).rounding());
  }
  // The comparison is sharp enough to see a missing window or one RoPE base for every layer.
  CHECK(diff(out.logits, reference_forward(model.config(), model.weights(), tokens, true).logits).max_abs > 1e-3);
  CHECK(diff(out.logits, reference_forward(model.config(), model.weights(), tokens, false, true).logits).max_abs >
        1e-3);

  // The soft-cap: the same weights without it give z with capped logits 3 · tanh(z / 3).
  LlamaConfig uncapped_config = model.config();
  uncapped_config.final_logit_softcap = 0;
  const CpuLlama uncapped(uncapped_config, model.weights(), kvfuse::CpuLlamaOptions{2, 4});
  std::vector<float> z = uncapped.full_prefill(tokens).logits;
  CHECK(diff(z, out.logits).max_abs > 1e-2);
  for (float& x : z) x = 3.0f * std::tanh(x / 3.0f);
  CHECK(diff(z, out.logits).rounding());
}

TEST_CASE("gemma3: chunked prefill and the fusion loop at 100 % recompute equal full prefill") {
  const CpuLlama model = tiny_gemma3(tiny_gemma3_config(6));  // CacheBlend checks its deviations on layer 3
  const kvfuse_test::Prompt p =
      kvfuse_test::assemble({kvfuse_test::kSystem, kvfuse_test::kA, kvfuse_test::kB, kvfuse_test::kC},
                            kvfuse_test::kQuery);
  const auto n = static_cast<std::int64_t>(p.tokens.size());
  const kvfuse::LlamaPrefill full = model.full_prefill(p.tokens);

  // Chunked prefill: extend, and CpuLlamaSession::compute_kv.
  LlamaKVCache kv = model.empty_kv();
  model.extend(kv, std::span<const token_id>(p.tokens).first(7));
  model.extend(kv, std::span<const token_id>(p.tokens).subspan(7, 1));
  const std::vector<float> last = model.extend(kv, std::span<const token_id>(p.tokens).subspan(8));
  CHECK(kv.positions == full.kv.positions);
  CHECK(diff(flat_kv(kv), flat_kv(full.kv)).rounding());
  CHECK(diff(last, full.logits).rounding());
  CpuLlamaSession session(model, p.tokens);
  for (kvfuse::TokenRange r : {kvfuse::TokenRange{0, 3}, {3, 20}, {20, n}}) session.compute_kv(r);
  CHECK(diff(flat_kv(session.kv()), flat_kv(full.kv)).rounding());
  const std::span<const float> session_logits = session.logits();
  CHECK(diff(std::vector<float>(session_logits.begin(), session_logits.end()), full.logits).rounding());

  // Every row recomputed over chunk caches moved to their prompt positions: the same computation as full prefill.
  LlamaKVCache merged = model.empty_kv();
  for (const kvfuse::PromptChunk& c : p.layout.chunks) {
    LlamaKVCache chunk = model.prefill_chunk(
        std::span<const token_id>(p.tokens).subspan(static_cast<std::size_t>(c.range.begin),
                                                    static_cast<std::size_t>(c.range.size())),
        0);
    model.rope_shift(chunk, {0, chunk.num_rows()}, c.range.begin);
    merged.append(chunk);
  }
  LlamaKVCache query(6, model.config().kv_dim(), p.layout.query.size());
  for (std::int64_t r = 0; r < query.num_rows(); ++r)
    query.positions[static_cast<std::size_t>(r)] = p.layout.query.begin + r;
  merged.append(query);
  CHECK(model.partial_prefill(p.tokens, merged, all_rows(n), {}).logits == full.logits);
  CHECK(flat_kv(merged) == flat_kv(full.kv));

  // The fusion pipeline: full and CacheBlend r = 1 are full prefill bit for bit; the paged engine (its own KV
  // layout, CpuLlama's math) runs every method exactly as CpuLlamaFusion does.
  kvfuse::InMemoryKVStore store, paged_store;
  kvfuse::CpuLlamaFusion engine(model);
  kvfuse_example::PagedEngine paged_engine(model);
  kvfuse::FusionPipeline pipeline(engine, store);
  kvfuse::FusionPipeline paged(paged_engine, paged_store);
  pipeline.store_chunk_caches(p.tokens, p.layout);
  paged.store_chunk_caches(p.tokens, p.layout);
  for (const std::string name : {"full", "cacheblend@1"}) {
    CAPTURE(name);
    CHECK(pipeline.run(p.tokens, p.layout, kvfuse::parse_method(name)).logits == full.logits);
    CHECK(flat_kv(engine.kv()) == flat_kv(full.kv));
  }
  for (const std::string name : {"naive", "cacheblend", "cachecraft"}) {
    CAPTURE(name);
    const kvfuse::FusionResult a = pipeline.run(p.tokens, p.layout, kvfuse::parse_method(name));
    const kvfuse::FusionResult b = paged.run(p.tokens, p.layout, kvfuse::parse_method(name));
    CHECK(a.logits == b.logits);
    CHECK(a.selected_per_layer == b.selected_per_layer);
    CHECK(flat_kv(paged_engine.gather()) == flat_kv(engine.kv()));
  }
}

TEST_CASE("gemma3: the query mass of a local layer is taken without its window; a global layer's is its attention") {
  const std::vector<token_id> tokens = prompt_tokens(12, 4);
  const kvfuse::TokenRange query{8, 12};
  // One group per prompt token (8 one-token chunks, then the query): the attention statistics give each query
  // row's weight on each row, from the layer's own (windowed) softmax.
  const kvfuse::PromptLayout layout = kvfuse::PromptLayout::from_lengths(std::vector<std::int64_t>(8, 1), 4);
  struct Run {
    std::vector<std::vector<float>> mass;
    std::vector<kvfuse::LayerAttention> stats;
  };
  const auto run = [&](const CpuLlama& model) {
    Run out;
    kvfuse::PartialPrefillOptions options;
    options.attention_groups = &layout;
    options.query_mass_rows = query;
    LlamaKVCache kv(3, model.config().kv_dim(), 12);
    model.partial_prefill(
        tokens, kv, all_rows(12),
        [&](const kvfuse::LayerReport& r) {
          out.mass.emplace_back(r.query_mass.begin(), r.query_mass.end());
          out.stats.push_back(*r.attention);
          return r.selected;
        },
        options);
    return out;
  };
  const auto attention_of_query = [&](const kvfuse::LayerAttention& a, std::size_t row) {
    double sum = 0.0;
    for (std::int64_t q = query.begin; q < query.end; ++q) sum += a.at(static_cast<std::size_t>(q), row);
    return sum;
  };
  const Run windowed = run(tiny_gemma3());
  LlamaConfig wide = tiny_gemma3_config();
  wide.sliding_window = 64;  // longer than the prompt: the same model with a window that masks nothing
  const Run unwindowed = run(tiny_gemma3(wide));
  REQUIRE(windowed.mass.size() == 3);
  for (std::size_t l = 0; l < 3; ++l) {
    CAPTURE(l);
    REQUIRE(windowed.mass[l].size() == 12);
    double total = 0.0;
    for (const float m : windowed.mass[l]) total += m;
    CHECK(total == doctest::Approx(4.0 * 4.0).epsilon(1e-5));  // |query| rows x 4 heads, each a softmax
  }
  for (std::size_t row = 0; row < 8; ++row) {
    CAPTURE(row);
    // Layer 0 has the same input in both models: its query mass is the attention of the model without a window.
    CHECK(windowed.mass[0][row] == doctest::Approx(attention_of_query(unwindowed.stats[0], row)).epsilon(1e-5));
    // The global layer: the query mass is the layer's own attention.
    CHECK(windowed.mass[2][row] == doctest::Approx(attention_of_query(windowed.stats[2], row)).epsilon(1e-5));
  }
  // Rows 0 .. 3 lie behind every query row's window on the local layers: the layer's attention puts no weight
  // there, the query mass does.
  for (std::size_t l = 0; l < 2; ++l)
    for (std::size_t row = 0; row < 4; ++row) {
      CAPTURE(l);
      CAPTURE(row);
      CHECK(attention_of_query(windowed.stats[l], row) == 0.0);
      CHECK(windowed.mass[l][row] > 0.0f);
    }
}

TEST_CASE("gemma3: a local layer's query never sees a key outside its window; a global layer's does") {
  const CpuLlama model = tiny_gemma3();
  const std::vector<token_id> tokens = prompt_tokens(12, 4);
  const kvfuse::LlamaPrefill full = model.full_prefill(tokens);

  // Row 11 recomputed alone over the full-prefill KV: full prefill's logits. With a window of 4 its local
  // layers see positions 8 .. 11 only.
  const auto last_row = [&](const LlamaKVCache& kv) {
    LlamaKVCache merged = kv;
    return model.partial_prefill(tokens, merged, TokenSet{11}, {}).logits;
  };
  const std::vector<float> base = last_row(full.kv);
  CHECK(diff(base, full.logits).rounding());
  const auto perturbed = [&](std::int64_t layer, std::int64_t first, std::int64_t last) {
    LlamaKVCache kv = full.kv;
    for (std::int64_t r = first; r <= last; ++r)
      for (std::int64_t i = 0; i < kv.kv_dim; ++i) {
        kv.k_row(layer, r)[i] += 0.75f;
        kv.v_row(layer, r)[i] -= 1.5f;
      }
    return kv;
  };
  // Rows 0 .. 7 on the local layers: outside the window, masked, exactly nothing changes.
  CHECK(last_row(perturbed(0, 0, 7)) == base);
  CHECK(last_row(perturbed(1, 0, 7)) == base);
  // Row 8 on a local layer is inside the window; row 0 on the global layer is seen.
  CHECK(diff(last_row(perturbed(0, 8, 8)), base).max_abs > 1e-4);
  CHECK(diff(last_row(perturbed(1, 8, 8)), base).max_abs > 1e-4);
  CHECK(diff(last_row(perturbed(2, 0, 0)), base).max_abs > 1e-4);

  // The attention statistics agree: over chunks [0, 4), [4, 8) and the query [8, 12), a query row puts
  // exactly no mass on a chunk behind its window on a local layer, and some on the global layer.
  const kvfuse::PromptLayout layout = kvfuse::PromptLayout::from_lengths({4, 4}, 4);
  std::vector<kvfuse::LayerAttention> stats;
  kvfuse::PartialPrefillOptions options;
  options.attention_groups = &layout;
  LlamaKVCache kv(3, model.config().kv_dim(), 12);
  model.partial_prefill(
      tokens, kv, all_rows(12),
      [&](const kvfuse::LayerReport& r) {
        stats.push_back(*r.attention);
        return r.selected;
      },
      options);
  REQUIRE(stats.size() == 3);
  CHECK(flat_kv(kv) == flat_kv(full.kv));
  for (std::size_t l = 0; l < 3; ++l) {
    CAPTURE(l);
    const bool local = l < 2;
    for (std::size_t q = 0; q < 12; ++q) {
      CAPTURE(q);
      // Positions q − 3 .. q are the window; chunk j covers [4j, 4j + 4).
      for (std::size_t j = 0; j < 2; ++j) {
        const bool behind_window = 4 * j + 3 + 4 <= q;  // the chunk's last position <= q − 4
        const bool later = 4 * j > q;
        if (later || (local && behind_window)) {
          CHECK(stats[l].at(q, j) == 0.0f);
        } else {
          CHECK(stats[l].at(q, j) > 0.0f);
        }
      }
      CHECK(stats[l].at(q, 0) + stats[l].at(q, 1) + stats[l].at(q, 2) == doctest::Approx(4.0).epsilon(1e-5));
    }
  }

  // Rows need not be sorted by position: the window follows positions. Reversing the row order of a full
  // prefill's input (positions travel with the rows) gives the same KV per position.
  kvfuse_test::check_reversed_rows_equal_full(model, tokens, full.kv);
}

TEST_CASE("gemma3: a RoPE shift rotates each layer with its own base, as computing the chunk at its new position") {
  const CpuLlama model = tiny_gemma3();
  const LlamaConfig& c = model.config();
  const std::vector<token_id> tokens = prompt_tokens(19, 3);
  const std::span<const token_id> chunk = std::span<const token_id>(tokens).subspan(5, 8);  // longer than the window

  // Local layers rotate with base 1e4, the global one with 1e6.
  CHECK(c.rope_theta(0) == c.rope_theta(1));
  CHECK(c.rope_theta(0)[1] == doctest::Approx(std::pow(1e4, -0.25)));
  CHECK(c.rope_theta(2)[1] == doctest::Approx(std::pow(1e6, -0.25)));

  LlamaKVCache shifted = model.prefill_chunk(chunk, 0);
  model.rope_shift(shifted, {0, 8}, 5);
  const LlamaKVCache direct = model.prefill_chunk(chunk, 5);
  CHECK(shifted.positions == direct.positions);
  for (std::size_t l = 0; l < 3; ++l) {
    CAPTURE(l);
    CHECK(diff(shifted.k[l], direct.k[l]).rounding());
    CHECK(diff(shifted.v[l], direct.v[l]).rounding());
  }
  // Layer 0's K depends on token and position only: the shift is one rotation, rounding only.
  const kvfuse_test::Diff k0 = diff(shifted.k[0], direct.k[0]);
  CHECK(k0.max_abs <= 1e-6 * k0.scale);
  // ... and the bases matter: the global layer's K rotated with the local layers' θ is wrong.
  LlamaKVCache wrong = model.prefill_chunk(chunk, 0);
  const std::vector<double> theta0 = c.rope_theta(0);
  std::vector<float> cos_d(4), sin_d(4);
  kvfuse::detail::rope_cos_sin(theta0.data(), 4, 5.0, cos_d.data(), sin_d.data());
  for (std::int64_t r = 0; r < 8; ++r)
    kvfuse::detail::rope_rotate_head(wrong.k_row(2, r), 8, c.rope_pairing, cos_d.data(), sin_d.data());
  CHECK(diff(wrong.k[2], direct.k[2]).max_abs > 1e-2);

  // The layer-pipelined loader's per-layer shift is the same rotation.
  LlamaKVCache by_layer = model.prefill_chunk(chunk, 0);
  for (std::int64_t l = 0; l < 3; ++l) model.rope_shift_layer(by_layer, l, {0, 8}, 5);
  CHECK(flat_kv(by_layer) == flat_kv(shifted));

  // Attention over the shifted chunk: [prefix 0..4 | chunk 5..12 | query 13..18], the query recomputed, gives
  // the same logits with the shifted and with the directly computed chunk cache.
  const auto run_with = [&](const LlamaKVCache& chunk_kv) {
    LlamaKVCache merged = model.full_prefill(std::span<const token_id>(tokens).first(5)).kv;
    merged.append(chunk_kv);
    LlamaKVCache tail(3, c.kv_dim(), 6);
    for (std::int64_t r = 0; r < 6; ++r) tail.positions[static_cast<std::size_t>(r)] = 13 + r;
    merged.append(tail);
    return model.partial_prefill(tokens, merged, TokenSet{13, 14, 15, 16, 17, 18}, {}).logits;
  };
  CHECK(diff(run_with(shifted), run_with(direct)).rounding());
}

TEST_CASE("gemma3: from_gguf reads the gemma3 keys and sliding-window patterns; refuses what is not implemented") {
  const LlamaConfig c = tiny_gemma3_config();
  const LlamaWeights w = LlamaWeights::random(c, 23);
  const CpuLlama direct(c, w);
  const std::vector<token_id> tokens = prompt_tokens(9);

  const auto config_of = [&](auto edit) {
    return LlamaConfig::from_gguf(kvfuse::GGUFFile::parse(tiny_gemma3_gguf(c, w, edit)));
  };
  const std::vector<std::byte> bytes = tiny_gemma3_gguf(c, w, [](GGUFWriter&) {});
  const kvfuse::GGUFFile file = kvfuse::GGUFFile::parse(bytes);
  const CpuLlama loaded = CpuLlama::from_gguf(file);
  const LlamaConfig& lc = loaded.config();
  CHECK(lc.architecture == LlamaArchitecture::gemma3);
  CHECK(lc.n_layer == 3);
  CHECK(lc.n_head_kv == 1);
  CHECK(lc.rope_pairing == RopePairing::half_split);  // llama.cpp LLAMA_ROPE_TYPE_NEOX
  CHECK(lc.local_layers == std::vector<std::uint8_t>{1, 1, 0});
  CHECK(lc.sliding_window == 4);
  CHECK(lc.rope_base == 1e6);
  CHECK(lc.rope_base_local == 1e4);  // no rope.freq_base_swa: llama.cpp's 10000
  CHECK(lc.embedding_scale == std::sqrt(32.0f));
  CHECK(lc.attention_scale == 1.0f / std::sqrt(8.0f));
  CHECK(lc.final_logit_softcap == 3.0);
  CHECK(loaded.weights().layers[2].ffn_post_norm == w.layers[2].ffn_post_norm);
  CHECK(loaded.fingerprint() == direct.fingerprint());
  CHECK(loaded.full_prefill(tokens).logits == direct.full_prefill(tokens).logits);
  // Fingerprints see the gemma3 settings.
  LlamaConfig global_only = c;
  global_only.local_layers = {0, 0, 0};
  CHECK(CpuLlama(global_only, w).fingerprint() != direct.fingerprint());

  // Sliding-window patterns: llama.cpp's default period 6, a period, a per-layer array; no window at all.
  const auto local = [&](auto edit) { return config_of(edit).local_layers; };
  using Flags = std::vector<std::uint8_t>;
  CHECK(local([](GGUFWriter& g) { g.u32("gemma3.attention.sliding_window_pattern", 6); }) == Flags{1, 1, 1});
  CHECK(local([](GGUFWriter& g) { g.u32("gemma3.attention.sliding_window_pattern", 2); }) == Flags{1, 0, 1});
  CHECK(local([](GGUFWriter& g) { g.u32("gemma3.attention.sliding_window_pattern", 1); }) == Flags{0, 0, 0});
  CHECK(local([](GGUFWriter& g) { g.u32("gemma3.attention.sliding_window_pattern", 0); }) == Flags{1, 1, 1});
  CHECK(local([](GGUFWriter& g) {
          g.array("gemma3.attention.sliding_window_pattern", std::vector<bool>{false, true, true});
        }) == Flags{0, 1, 1});
  CHECK(local([](GGUFWriter& g) {
          g.array("gemma3.attention.sliding_window_pattern", std::vector<std::int32_t>{1, 0, 7});
        }) == Flags{1, 0, 1});
  const LlamaConfig windowless = config_of([](GGUFWriter& g) { g.u32("gemma3.attention.sliding_window", 0); });
  CHECK(windowless.local_layers.empty());
  CHECK(windowless.sliding_window == 0);
  const LlamaConfig swa_base = config_of([](GGUFWriter& g) { g.f32("gemma3.rope.freq_base_swa", 5000.0f); });
  CHECK(swa_base.rope_base_local == 5000.0);
  // Linear scaling applies to the global layers only.
  const LlamaConfig scaled = config_of([](GGUFWriter& g) {
    g.str("gemma3.rope.scaling.type", "linear");
    g.f32("gemma3.rope.scaling.factor", 8.0f);
  });
  CHECK(scaled.rope_linear_factor == 8.0);
  CHECK(scaled.rope_theta(0)[1] == doctest::Approx(std::pow(1e4, -0.25)));
  CHECK(scaled.rope_theta(2)[1] == doctest::Approx(std::pow(1e6, -0.25) / 8.0));

  // The 62-layer 27B scales q · k by 1 / sqrt(n_embd / n_head), not 1 / sqrt(head_dim) (config only: no
  // block tensors are read).
  GGUFWriter big;
  big.str("general.architecture", "gemma3");
  big.u32("gemma3.block_count", 62);
  big.u32("gemma3.embedding_length", 32);
  big.u32("gemma3.feed_forward_length", 64);
  big.u32("gemma3.attention.head_count", 4);
  big.u32("gemma3.attention.head_count_kv", 2);
  big.u32("gemma3.attention.key_length", 16);
  big.u32("gemma3.vocab_size", 96);
  big.f32("gemma3.attention.layer_norm_rms_epsilon", 1e-6f);
  const LlamaConfig c27 = LlamaConfig::from_gguf(kvfuse::GGUFFile::parse(big.bytes()));
  CHECK(c27.attention_scale == 1.0f / std::sqrt(8.0f));
  CHECK(c27.local_layers.empty());

  const auto refusal = [&](auto edit) {
    const std::vector<std::byte> b = tiny_gemma3_gguf(c, w, edit);
    return error_of([&] { (void)CpuLlama::from_gguf(kvfuse::GGUFFile::parse(b)); });
  };
  CHECK(refusal([](GGUFWriter& g) {
          g.array("gemma3.attention.sliding_window_pattern", std::vector<float>{1, 1, 0});
        }).find("gemma3.attention.sliding_window_pattern is an array of float32") != std::string::npos);
  CHECK(refusal([](GGUFWriter& g) {
          g.array("gemma3.attention.sliding_window_pattern", std::vector<bool>{true, false});
        }).find("gemma3.attention.sliding_window_pattern holds 2 entries for 3 layers") != std::string::npos);
  CHECK(refusal([](GGUFWriter& g) { g.f32("gemma3.attention.sliding_window_pattern", 6.0f); })
            .find("'gemma3.attention.sliding_window_pattern' has type float32") != std::string::npos);
  CHECK(refusal([](GGUFWriter& g) { g.u32("gemma3.rope.dimension_count", 4); })
            .find("partial rotary embedding (gemma3.rope.dimension_count = 4") != std::string::npos);
  CHECK(refusal([](GGUFWriter& g) { g.u32("gemma3.attention.key_length_swa", 4); })
            .find("gemma3.attention.key_length_swa = 4 differs") != std::string::npos);
  CHECK(refusal([](GGUFWriter& g) { g.str("gemma3.rope.scaling.type", "yarn"); }).find("RoPE scaling type 'yarn'") !=
        std::string::npos);
  const float dense[32 * 4] = {};
  const std::string embedding_gemma = refusal([&](GGUFWriter& g) { g.tensor("dense_2.weight", {32, 4}, dense); });
  CHECK(embedding_gemma.find("'dense_2.weight' is not part of the supported gemma3 architecture") != std::string::npos);
  CHECK(embedding_gemma.find("EmbeddingGemma") != std::string::npos);
  CHECK(refusal([&](GGUFWriter& g) { g.tensor("rope_freqs.weight", {4}, dense); })
            .find("'rope_freqs.weight' is not part of the supported gemma3") != std::string::npos);
  CHECK(refusal([&](GGUFWriter& g) { g.tensor("blk.0.attn_q.bias", {32}, dense); })
            .find("'blk.0.attn_q.bias' is not part") != std::string::npos);
  GGUFWriter other;
  other.str("general.architecture", "gemma-embedding");
  CHECK(error_of([&] {
          (void)LlamaConfig::from_gguf(kvfuse::GGUFFile::parse(other.bytes()));
        }).find("architecture 'gemma-embedding' is not supported") != std::string::npos);

  // Config and weight checks name the setting.
  const auto config_error = [&](auto edit) {
    LlamaConfig e = c;
    edit(e);
    return error_of([&] { e.validate(); });
  };
  CHECK(config_error([](LlamaConfig& e) { e.local_layers = {1, 0}; }).find("2 local_layers flags for n_layer = 3") !=
        std::string::npos);
  CHECK(config_error([](LlamaConfig& e) { e.local_layers = {1, 2, 0}; }).find("local_layers[1] = 2") !=
        std::string::npos);
  CHECK(config_error([](LlamaConfig& e) { e.sliding_window = 0; }).find("sliding_window = 0 must be") !=
        std::string::npos);
  CHECK(config_error([](LlamaConfig& e) {
          e.rope_freq_factors = {1, 1, 1, 1};
        }).find("gemma3 has no rope_freq_factors") != std::string::npos);
  CHECK(config_error([](LlamaConfig& e) { e.final_logit_softcap = -1; }).find("final_logit_softcap = -1") !=
        std::string::npos);
  CHECK(config_error([](LlamaConfig& e) {
          e.architecture = LlamaArchitecture::llama;
        }).find("architecture llama has no sliding window") != std::string::npos);
  LlamaWeights missing = w;
  missing.layers[1].attn_k_norm.resize(0);
  CHECK(error_of([&] { CpuLlama(c, missing); }).find("layer 1 attn_k_norm has 0 values, expected 8") !=
        std::string::npos);
  // The same shapes as llama: the gemma3 norms are refused, in memory and in the file.
  LlamaConfig llama = c;
  llama.architecture = LlamaArchitecture::llama;
  llama.sliding_window = 0;
  llama.local_layers.clear();
  llama.embedding_scale = 1;
  llama.attention_scale = 0;
  llama.final_logit_softcap = 0;
  CHECK(error_of([&] { CpuLlama(llama, w); }).find("layer 0 has gemma3 norms") != std::string::npos);
  CHECK(error_of([&] { (void)LlamaWeights::from_gguf(file, llama); })
            .find("is not part of the supported Llama architecture") != std::string::npos);
}

TEST_CASE("real model: gemma3 270M loads, reads its local / global layers, and chunked prefill equals full") {
  const auto model_file = kvfuse_test::real_model(/*optimized_only=*/true, kvfuse_test::RealModel::gemma3);
  if (!model_file) return;
  const auto t0 = std::chrono::steady_clock::now();
  const kvfuse::GGUFFile file = kvfuse::GGUFFile::open(*model_file);
  const CpuLlama model = CpuLlama::from_gguf(file);
  MESSAGE("loaded " << model_file->string() << " in "
                    << std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() << " s");
  const LlamaConfig& c = model.config();
  CHECK(c.architecture == LlamaArchitecture::gemma3);
  CHECK(c.n_layer == 18);
  CHECK(c.n_embd == 640);
  CHECK(c.n_head == 4);
  CHECK(c.n_head_kv == 1);
  CHECK(c.head_dim == 256);
  CHECK(c.n_ff == 2048);
  CHECK(c.n_vocab == 262144);
  CHECK(c.sliding_window == 512);
  CHECK(c.context_length == 32768);  // gemma3.context_length
  std::vector<std::uint8_t> local(18);
  for (std::size_t l = 0; l < 18; ++l) local[l] = l % 6 < 5 ? 1 : 0;  // layers 5, 11, 17 global
  CHECK(c.local_layers == local);
  CHECK(c.rope_base == 1e6);
  CHECK(c.rope_base_local == 1e4);
  CHECK(c.rope_linear_factor == 1.0);
  CHECK(c.rope_pairing == RopePairing::half_split);
  CHECK(c.embedding_scale == std::sqrt(640.0f));
  CHECK(c.attention_scale == 1.0 / 16.0);
  CHECK(c.final_logit_softcap == 0.0);
  CHECK(model.weights().output.size() == 0);  // tied to token_embd

  // "<bos>The capital of France is Paris. The capital of Germany is Berlin. The capital of Italy is", ids
  // looked up whole-word in the file's vocabulary (tokenizer.ggml.tokens).
  const std::vector<token_id> prompt{2,     818, 5279, 529, 7001,  563, 9079, 236761, 669, 5279,
                                     529, 9405, 563,  15687, 236761, 669, 5279, 529,    11702, 563};
  const kvfuse::LlamaPrefill full = model.full_prefill(prompt);
  CHECK(std::all_of(full.logits.begin(), full.logits.end(), [](float x) { return std::isfinite(x); }));
  CHECK(kvfuse::argmax_token(full.logits) == 13706);  // "▁Rome"
  LlamaKVCache kv = model.empty_kv();
  model.extend(kv, std::span<const token_id>(prompt).first(8));
  const std::vector<float> chunked = model.extend(kv, std::span<const token_id>(prompt).subspan(8));
  CHECK(diff(chunked, full.logits).rounding());
  CHECK(diff(flat_kv(kv), flat_kv(full.kv)).rounding());
}

}  // namespace unit_gemma3
