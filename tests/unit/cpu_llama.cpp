// backend/cpu_llama.hpp: the reference CPU Llama forward pass and the fusion loop's operations, on a tiny
// random-weight model (2 layers, n_embd 32, 4 query heads / 2 KV heads of dim 8, vocab 64), against an
// independent double-precision forward pass written here, and against each other (exact properties).
//
// Tolerances: "float rounding" comparisons use |a - b| <= 1e-5 · max(1, max |b|) over all compared values.
// Measured (GCC 12, x86-64): at most 3e-7 relative, against the double reference and between chunked and
// full prefill, so 1e-5 leaves a 30x margin for other compilers and vector widths, while a wrong mask,
// position or head mapping changes values at the 1e-2 .. 1e-1 level (checked explicitly where it matters).
// Properties that hold bit for bit are checked with ==.
#include <doctest/doctest.h>

#include "../support/error_of.hpp"
#include "../support/llama_kv.hpp"
#include "../support/gguf_writer.hpp"
#include "../support/model_path.hpp"
#include "../support/test_util.hpp"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <limits>
#include <numeric>
#include <span>
#include <string>
#include <vector>

#include "kvfuse/backend/cpu_llama.hpp"
#include "kvfuse/model/gguf.hpp"

// Each unit test file lives in its own namespace: the files are compiled together (a unity build).
namespace unit_cpu_llama {

using kvfuse::CpuLlama;
using kvfuse::CpuLlamaSession;
using kvfuse::LayerReport;
using kvfuse::LlamaConfig;
using kvfuse::LlamaKVCache;
using kvfuse::LlamaWeights;
using kvfuse::RopePairing;
using kvfuse::RowMatrix;
using kvfuse::token_id;
using kvfuse::TokenSet;

using kvfuse_test::diff;
using kvfuse_test::GGUFWriter;

namespace {

LlamaConfig tiny_config(RopePairing pairing = RopePairing::interleaved) {
  LlamaConfig c;
  c.n_layer = 2;
  c.n_embd = 32;
  c.n_head = 4;
  c.n_head_kv = 2;
  c.head_dim = 8;
  c.n_ff = 64;
  c.n_vocab = 64;
  c.rope_base = 10000.0;
  c.rms_eps = 1e-5;
  c.rope_pairing = pairing;
  return c;
}

CpuLlama tiny_model(RopePairing pairing = RopePairing::interleaved, std::uint64_t seed = 7, int threads = 2) {
  const LlamaConfig c = tiny_config(pairing);
  return CpuLlama(c, LlamaWeights::random(c, seed), kvfuse::CpuLlamaOptions{threads, 4});
}

std::vector<token_id> prompt_tokens(std::size_t n, std::uint32_t seed = 1) {
  std::vector<token_id> t(n);
  for (std::size_t i = 0; i < n; ++i) t[i] = static_cast<token_id>((seed * 2654435761u + 97u * i * i + 13u * i) % 64u);
  return t;
}

// max |a - b| and max |b| over two float ranges of equal size.
// ------------------------------------------------------------------ independent reference (double precision)
// A direct transcription of the Llama forward pass, one token and one head at a time, RoPE from its
// definition. `modulo_heads` maps query head h to KV head h % n_head_kv (a wrong GQA mapping, to show the
// comparison would catch it).
struct Reference {
  std::vector<double> logits;             // of the last token
  std::vector<std::vector<double>> attn;  // per layer, n x n, softmax weights summed over heads
  std::vector<std::vector<double>> k, v;  // per layer, n x kv_dim (K rotated)
};

Reference reference_forward(const LlamaConfig& c, const LlamaWeights& w, const std::vector<token_id>& tokens,
                            bool modulo_heads = false) {
  using Vec = std::vector<double>;
  const auto n = static_cast<std::int64_t>(tokens.size());
  const std::int64_t e = c.n_embd, hd = c.head_dim;
  const auto matvec = [](const kvfuse::WeightMatrix& w_m, const Vec& x) {
    const RowMatrix m = w_m.dense();
    Vec y(static_cast<std::size_t>(m.rows()), 0.0);
    for (Eigen::Index o = 0; o < m.rows(); ++o)
      for (Eigen::Index i = 0; i < m.cols(); ++i)
        y[static_cast<std::size_t>(o)] += m(o, i) * x[static_cast<std::size_t>(i)];
    return y;
  };
  const auto rmsnorm = [&](const Vec& x, const Eigen::VectorXf& g) {
    double ss = 0;
    for (double xi : x) ss += xi * xi;
    const double scale = 1.0 / std::sqrt(ss / static_cast<double>(x.size()) + c.rms_eps);
    Vec y(x.size());
    for (std::size_t i = 0; i < x.size(); ++i) y[i] = x[i] * scale * g[static_cast<Eigen::Index>(i)];
    return y;
  };
  const auto rope = [&](double* x, std::int64_t pos) {
    for (std::int64_t i = 0; i < hd / 2; ++i) {
      const double angle =
          static_cast<double>(pos) * std::pow(c.rope_base, -2.0 * static_cast<double>(i) / static_cast<double>(hd));
      const std::int64_t a = c.rope_pairing == RopePairing::interleaved ? 2 * i : i;
      const std::int64_t b = c.rope_pairing == RopePairing::interleaved ? 2 * i + 1 : i + hd / 2;
      const double xa = x[a], xb = x[b];
      x[a] = xa * std::cos(angle) - xb * std::sin(angle);
      x[b] = xa * std::sin(angle) + xb * std::cos(angle);
    }
  };

  Reference ref;
  std::vector<Vec> h(static_cast<std::size_t>(n));
  const RowMatrix embd = w.token_embd.dense();
  for (std::int64_t t = 0; t < n; ++t) {
    h[static_cast<std::size_t>(t)].resize(static_cast<std::size_t>(e));
    for (std::int64_t i = 0; i < e; ++i)
      h[static_cast<std::size_t>(t)][static_cast<std::size_t>(i)] = embd(tokens[static_cast<std::size_t>(t)], i);
  }
  for (std::int64_t l = 0; l < c.n_layer; ++l) {
    const kvfuse::LlamaLayerWeights& lw = w.layers[static_cast<std::size_t>(l)];
    std::vector<Vec> q(static_cast<std::size_t>(n)), k(q.size()), v(q.size());
    for (std::int64_t t = 0; t < n; ++t) {
      const Vec x = rmsnorm(h[static_cast<std::size_t>(t)], lw.attn_norm);
      q[static_cast<std::size_t>(t)] = matvec(lw.wq, x);
      k[static_cast<std::size_t>(t)] = matvec(lw.wk, x);
      v[static_cast<std::size_t>(t)] = matvec(lw.wv, x);
      for (std::int64_t hh = 0; hh < c.n_head; ++hh) rope(q[static_cast<std::size_t>(t)].data() + hh * hd, t);
      for (std::int64_t g = 0; g < c.n_head_kv; ++g) rope(k[static_cast<std::size_t>(t)].data() + g * hd, t);
    }
    Vec attn(static_cast<std::size_t>(n * n), 0.0);
    for (std::int64_t t = 0; t < n; ++t) {
      Vec out(static_cast<std::size_t>(c.q_dim()), 0.0);
      for (std::int64_t hh = 0; hh < c.n_head; ++hh) {
        const std::int64_t g = modulo_heads ? hh % c.n_head_kv : hh / (c.n_head / c.n_head_kv);
        Vec score(static_cast<std::size_t>(t + 1));
        double mx = -1e300;
        for (std::int64_t u = 0; u <= t; ++u) {
          double dot = 0;
          for (std::int64_t d = 0; d < hd; ++d)
            dot += q[static_cast<std::size_t>(t)][static_cast<std::size_t>(hh * hd + d)] *
                   k[static_cast<std::size_t>(u)][static_cast<std::size_t>(g * hd + d)];
          score[static_cast<std::size_t>(u)] = dot / std::sqrt(static_cast<double>(hd));
          mx = std::max(mx, score[static_cast<std::size_t>(u)]);
        }
        double sum = 0;
        for (double& s : score) sum += (s = std::exp(s - mx));
        for (std::int64_t u = 0; u <= t; ++u) {
          const double p = score[static_cast<std::size_t>(u)] / sum;
          attn[static_cast<std::size_t>(t * n + u)] += p;
          for (std::int64_t d = 0; d < hd; ++d)
            out[static_cast<std::size_t>(hh * hd + d)] +=
                p * v[static_cast<std::size_t>(u)][static_cast<std::size_t>(g * hd + d)];
        }
      }
      const Vec o = matvec(lw.wo, out);
      for (std::int64_t i = 0; i < e; ++i)
        h[static_cast<std::size_t>(t)][static_cast<std::size_t>(i)] += o[static_cast<std::size_t>(i)];
      const Vec x = rmsnorm(h[static_cast<std::size_t>(t)], lw.ffn_norm);
      const Vec gate = matvec(lw.w_gate, x), up = matvec(lw.w_up, x);
      Vec act(gate.size());
      for (std::size_t i = 0; i < gate.size(); ++i) act[i] = gate[i] / (1.0 + std::exp(-gate[i])) * up[i];
      const Vec down = matvec(lw.w_down, act);
      for (std::int64_t i = 0; i < e; ++i)
        h[static_cast<std::size_t>(t)][static_cast<std::size_t>(i)] += down[static_cast<std::size_t>(i)];
    }
    ref.attn.push_back(std::move(attn));
    Vec kf, vf;
    for (std::int64_t t = 0; t < n; ++t) {
      kf.insert(kf.end(), k[static_cast<std::size_t>(t)].begin(), k[static_cast<std::size_t>(t)].end());
      vf.insert(vf.end(), v[static_cast<std::size_t>(t)].begin(), v[static_cast<std::size_t>(t)].end());
    }
    ref.k.push_back(std::move(kf));
    ref.v.push_back(std::move(vf));
  }
  const Vec x = rmsnorm(h.back(), w.output_norm);
  ref.logits = matvec(w.output_head(), x);
  return ref;
}

// Keeps every row on every layer, recording the reports.
struct Recorder {
  std::vector<std::vector<float>> k_dev, v_dev;
  std::vector<kvfuse::LayerAttention> attention;
  std::vector<TokenSet> selected;

  kvfuse::SelectionPolicy policy() {
    return [this](const LayerReport& r) {
      selected.push_back(r.selected);
      k_dev.emplace_back(r.k_deviation.begin(), r.k_deviation.end());
      v_dev.emplace_back(r.v_deviation.begin(), r.v_deviation.end());
      if (r.attention != nullptr) attention.push_back(*r.attention);
      return r.selected;
    };
  }
};

// The tiny model as a GGUF file; `edit` may change the writer before the tensors are added.
template <class Edit>
std::vector<std::byte> tiny_gguf(const LlamaConfig& c, const LlamaWeights& w, Edit edit, bool untied = false) {
  GGUFWriter g;
  g.str("general.architecture", "llama");
  g.u32("llama.block_count", static_cast<std::uint32_t>(c.n_layer));
  g.u32("llama.embedding_length", static_cast<std::uint32_t>(c.n_embd));
  g.u32("llama.feed_forward_length", static_cast<std::uint32_t>(c.n_ff));
  g.u32("llama.attention.head_count", static_cast<std::uint32_t>(c.n_head));
  g.u32("llama.attention.head_count_kv", static_cast<std::uint32_t>(c.n_head_kv));
  g.f32("llama.rope.freq_base", static_cast<float>(c.rope_base));
  g.f32("llama.attention.layer_norm_rms_epsilon", static_cast<float>(c.rms_eps));
  g.u32("llama.rope.dimension_count", static_cast<std::uint32_t>(c.head_dim));
  edit(g);
  g.matrix("token_embd.weight", w.token_embd.dense());
  g.vector("output_norm.weight", w.output_norm);
  if (untied) g.matrix("output.weight", w.output_head().dense());
  for (std::size_t l = 0; l < w.layers.size(); ++l) {
    const kvfuse::LlamaLayerWeights& lw = w.layers[l];
    const std::string p = "blk." + std::to_string(l) + ".";
    g.vector(p + "attn_norm.weight", lw.attn_norm);
    g.matrix(p + "attn_q.weight", lw.wq.dense());
    g.matrix(p + "attn_k.weight", lw.wk.dense());
    g.matrix(p + "attn_v.weight", lw.wv.dense());
    g.matrix(p + "attn_output.weight", lw.wo.dense());
    g.vector(p + "ffn_norm.weight", lw.ffn_norm);
    g.matrix(p + "ffn_gate.weight", lw.w_gate.dense());
    g.matrix(p + "ffn_up.weight", lw.w_up.dense());
    g.matrix(p + "ffn_down.weight", lw.w_down.dense());
  }
  return g.bytes();
}

using kvfuse_test::all_rows;
using kvfuse_test::error_of;
using kvfuse_test::flat_kv;

}  // namespace

TEST_CASE("full prefill matches an independent double-precision forward pass (both RoPE pairings, GQA)") {
  for (RopePairing pairing : {RopePairing::interleaved, RopePairing::half_split}) {
    CAPTURE(static_cast<int>(pairing));
    const CpuLlama model = tiny_model(pairing);
    const std::vector<token_id> tokens = prompt_tokens(13);
    const kvfuse::LlamaPrefill out = model.full_prefill(tokens);
    const Reference ref = reference_forward(model.config(), model.weights(), tokens);
    const kvfuse_test::Diff logits = diff(out.logits, ref.logits);
    CAPTURE(logits.max_abs);
    CHECK(logits.rounding());
    for (std::size_t l = 0; l < 2; ++l) {
      CHECK(diff(out.kv.k[l], ref.k[l]).rounding());
      CHECK(diff(out.kv.v[l], ref.v[l]).rounding());
    }
    // The comparison is sharp enough to see a wrong GQA mapping (query head h -> KV head h % n_head_kv).
    const Reference wrong = reference_forward(model.config(), model.weights(), tokens, true);
    CHECK(diff(out.logits, wrong.logits).max_abs > 1e-2);
  }
}

TEST_CASE("chunked prefill equals full prefill (CpuLlamaSession::compute_kv and CpuLlama::extend)") {
  const CpuLlama model = tiny_model();
  const std::vector<token_id> tokens = prompt_tokens(20);
  const kvfuse::LlamaPrefill full = model.full_prefill(tokens);

  CpuLlamaSession session(model, tokens);
  for (kvfuse::TokenRange r : {kvfuse::TokenRange{0, 5}, {5, 6}, {6, 13}, {13, 20}}) session.compute_kv(r);
  CHECK(session.resident_prefix() == 20);
  CHECK(diff(flat_kv(session.kv()), flat_kv(full.kv)).rounding());
  const std::span<const float> logits = session.logits();
  CHECK(diff(std::vector<float>(logits.begin(), logits.end()), full.logits).rounding());

  LlamaKVCache kv = model.empty_kv();
  model.extend(kv, std::span<const token_id>(tokens).first(7));
  const std::vector<float> last = model.extend(kv, std::span<const token_id>(tokens).subspan(7));
  CHECK(kv.positions == full.kv.positions);
  CHECK(diff(flat_kv(kv), flat_kv(full.kv)).rounding());
  CHECK(diff(last, full.logits).rounding());
}

TEST_CASE("chunked prefill whose chunks end on attention query blocks equals full prefill bit for bit") {
  const CpuLlama model = tiny_model();  // query_block 4
  REQUIRE(model.query_block() == 4);
  const std::vector<token_id> tokens = prompt_tokens(22);
  const kvfuse::LlamaPrefill full = model.full_prefill(tokens);
  LlamaKVCache kv = model.empty_kv();
  std::vector<float> last;
  for (kvfuse::TokenRange r : {kvfuse::TokenRange{0, 8}, {8, 12}, {12, 20}, {20, 22}})  // the last chunk: any length
    last = model.extend(kv, std::span<const token_id>(tokens).subspan(static_cast<std::size_t>(r.begin),
                                                                      static_cast<std::size_t>(r.size())));
  CHECK(flat_kv(kv) == flat_kv(full.kv));
  CHECK(last == full.logits);
}

TEST_CASE("full_prefill and prefill_chunk in row blocks (CpuLlamaOptions::prefill_block_rows) equal one pass to "
          "float rounding") {
  const CpuLlama one_pass = tiny_model();
  const LlamaConfig c = tiny_config(RopePairing::interleaved);
  const CpuLlama blocks(c, LlamaWeights::random(c, 7), kvfuse::CpuLlamaOptions{2, 4, false, 6});  // 6-row blocks
  const std::vector<token_id> tokens = prompt_tokens(20);
  const kvfuse::LlamaPrefill a = one_pass.full_prefill(tokens);
  const kvfuse::LlamaPrefill b = blocks.full_prefill(tokens);
  CHECK(b.kv.positions == a.kv.positions);
  CHECK(diff(flat_kv(b.kv), flat_kv(a.kv)).rounding());
  CHECK(diff(b.logits, a.logits).rounding());
  const auto chunk = std::span<const token_id>(tokens).first(13);
  CHECK(diff(flat_kv(blocks.prefill_chunk(chunk, 4)), flat_kv(one_pass.prefill_chunk(chunk, 4))).rounding());
  CHECK(error_of([&] { (void)CpuLlama(c, LlamaWeights::random(c, 7), kvfuse::CpuLlamaOptions{2, 4, false, -1}); })
            .find("prefill_block_rows = -1") != std::string::npos);
}

TEST_CASE("partial prefill with every row selected on every layer equals full prefill") {
  const CpuLlama model = tiny_model();
  const std::vector<token_id> tokens = prompt_tokens(16);
  const kvfuse::LlamaPrefill full = model.full_prefill(tokens);
  // Merged KV as a fusion method builds it: chunks [0,6) and [6,12) computed in isolation at position 0 and
  // moved to their prompt positions; the query [12,16) has no cached rows yet.
  LlamaKVCache merged = model.prefill_chunk(std::span<const token_id>(tokens).first(6), 0);
  LlamaKVCache second = model.prefill_chunk(std::span<const token_id>(tokens).subspan(6, 6), 0);
  model.rope_shift(second, {0, 6}, 6);
  merged.append(second);
  merged.append(LlamaKVCache(2, model.config().kv_dim(), 4));
  for (std::int64_t r = 12; r < 16; ++r) merged.positions[static_cast<std::size_t>(r)] = r;

  Recorder rec;
  const kvfuse::PartialPrefillResult out = model.partial_prefill(tokens, merged, all_rows(16), rec.policy());
  CHECK(out.selected_per_layer == std::vector<std::int64_t>{16, 16});
  CHECK(out.logits == full.logits);  // the same computation, bit for bit
  CHECK(flat_kv(merged) == flat_kv(full.kv));

  // KV deviation (CacheBlend 4.1): the first chunk sees no other context, so its cached KV is the full-prefill
  // KV on every layer (to rounding); the second chunk's layer-0 K / V depend only on token and position
  // (to rounding too), but from layer 1 on it attended to the first chunk, so it deviates.
  REQUIRE(rec.k_dev.size() == 2);
  for (std::size_t l = 0; l < 2; ++l)
    for (std::size_t i = 0; i < 6; ++i) {
      CHECK(rec.k_dev[l][i] <= 1e-8f);
      CHECK(rec.v_dev[l][i] <= 1e-8f);
    }
  for (std::size_t i = 6; i < 12; ++i) {
    CHECK(rec.k_dev[0][i] <= 1e-8f);
    CHECK(rec.v_dev[0][i] <= 1e-8f);
  }
  const double later = std::accumulate(rec.v_dev[1].begin() + 6, rec.v_dev[1].begin() + 12, 0.0);
  CHECK(later > 1e-3);
}

TEST_CASE("RoPE shift of a chunk cache equals computing the chunk at its new positions") {
  const CpuLlama model = tiny_model();
  const std::vector<token_id> tokens = prompt_tokens(18, 3);
  const std::span<const token_id> chunk = std::span<const token_id>(tokens).subspan(5, 8);

  LlamaKVCache shifted = model.prefill_chunk(chunk, 0);
  model.rope_shift(shifted, {0, 8}, 5);
  const LlamaKVCache direct = model.prefill_chunk(chunk, 5);
  CHECK(shifted.positions == direct.positions);
  // Layer 0: K depends on the token and its position only; the shift is one rotation, rounding only.
  const kvfuse_test::Diff k0 = diff(shifted.k[0], direct.k[0]);
  CAPTURE(k0.max_abs);
  CHECK(k0.max_abs <= 1e-6 * k0.scale);
  // Later layers: attention inside the chunk depends only on relative positions, which the shift keeps.
  CHECK(diff(flat_kv(shifted), flat_kv(direct)).rounding());
  // ... and the shift is not a no-op: the chunk cache at position 0 differs from the one at 5.
  CHECK(diff(model.prefill_chunk(chunk, 0).k[0], direct.k[0]).max_abs > 1e-2);

  // Attention over the shifted chunk: a merged prompt [prefix 0..4 | chunk 5..12 | query 13..17], the query
  // recomputed, gives the same logits with the shifted and with the directly computed chunk cache.
  const auto run_with = [&](const LlamaKVCache& chunk_kv) {
    LlamaKVCache merged = model.full_prefill(std::span<const token_id>(tokens).first(5)).kv;
    merged.append(chunk_kv);
    LlamaKVCache tail(2, model.config().kv_dim(), 5);
    for (std::int64_t r = 0; r < 5; ++r) tail.positions[static_cast<std::size_t>(r)] = 13 + r;
    merged.append(tail);
    return model.partial_prefill(tokens, merged, TokenSet{13, 14, 15, 16, 17}, {}).logits;
  };
  CHECK(diff(run_with(shifted), run_with(direct)).rounding());
}

TEST_CASE("exact causal mask by position: a selected row never sees later rows, selected or not") {
  const CpuLlama model = tiny_model();
  const std::vector<token_id> a = prompt_tokens(14, 5);
  std::vector<token_id> b = a;
  for (std::size_t i = 7; i < b.size(); ++i) b[i] = (b[i] + 11) % 64;  // later tokens differ

  const LlamaKVCache cached = model.full_prefill(prompt_tokens(14, 9)).kv;  // unrelated cached KV
  LlamaKVCache merged_a = cached;
  LlamaKVCache merged_b = cached;
  for (std::size_t l = 0; l < 2; ++l)  // later rows' cached KV differ as well
    for (std::size_t i = 8 * merged_b.kv_dim; i < merged_b.k[l].size(); ++i) {
      merged_b.k[l][i] += 0.5f;
      merged_b.v[l][i] -= 0.25f;
    }
  // Rows 6.. are selected; row 6 at position 6 must be computed exactly alike in both prompts.
  const TokenSet selected{6, 7, 8, 9, 10, 11, 12, 13};
  const auto out_a = model.partial_prefill(a, merged_a, selected, {});
  const auto out_b = model.partial_prefill(b, merged_b, selected, {});
  for (std::int64_t l = 0; l < 2; ++l) {
    CHECK(std::equal(merged_a.k_row(l, 6), merged_a.k_row(l, 6) + merged_a.kv_dim, merged_b.k_row(l, 6)));
    CHECK(std::equal(merged_a.v_row(l, 6), merged_a.v_row(l, 6) + merged_a.kv_dim, merged_b.v_row(l, 6)));
  }
  // A later selected row does see the differences.
  CHECK(diff(out_a.logits, out_b.logits).max_abs > 1e-3);

  // Rows need not be sorted by position: the mask follows positions. Reversing the row order of a full
  // prefill's input (positions travel with the rows) gives the same KV per position.
  const std::vector<token_id> tokens = prompt_tokens(9, 4);
  kvfuse_test::check_reversed_rows_equal_full(model, tokens, model.full_prefill(tokens).kv);
}

TEST_CASE("a policy narrows the selected set layer by layer; statistics match the reference attention") {
  const CpuLlama model = tiny_model();
  const std::vector<token_id> tokens = prompt_tokens(15, 8);
  const kvfuse::PromptLayout layout =
      kvfuse::PromptLayout::from_lengths({5, 6}, 4);  // chunks [0,5) [5,11), query [11,15)
  const Reference ref = reference_forward(model.config(), model.weights(), tokens);

  // Full selection with statistics: per (row, group) mass equals the reference attention summed by group.
  LlamaKVCache kv(2, model.config().kv_dim(), 15);
  Recorder rec;
  kvfuse::PartialPrefillOptions options;
  options.attention_groups = &layout;
  model.partial_prefill(tokens, kv, all_rows(15), rec.policy(), options);
  REQUIRE(rec.attention.size() == 2);
  const auto group_of = [](std::int64_t r) { return r < 5 ? 0 : r < 11 ? 1 : 2; };
  for (std::size_t l = 0; l < 2; ++l) {
    const kvfuse::LayerAttention& a = rec.attention[l];
    CHECK(a.num_groups == 3);
    for (std::int64_t q = 0; q < 15; ++q) {
      double want[3] = {0, 0, 0};
      for (std::int64_t k = 0; k <= q; ++k) want[group_of(k)] += ref.attn[l][static_cast<std::size_t>(q * 15 + k)];
      double row_sum = 0;
      for (std::size_t g = 0; g < 3; ++g) {
        CHECK(a.at(static_cast<std::size_t>(q), g) == doctest::Approx(want[g]).epsilon(1e-5));
        row_sum += a.at(static_cast<std::size_t>(q), g);
      }
      CHECK(row_sum == doctest::Approx(4.0).epsilon(1e-5));  // one softmax per query head
      CHECK(a.self_mass[static_cast<std::size_t>(q)] ==
            doctest::Approx(ref.attn[l][static_cast<std::size_t>(q * 15 + q)]).epsilon(1e-5));
    }
    // Cache-Craft eq. 15 term: the question's attention on each chunk.
    const std::vector<float> qa = kvfuse::question_attention(a, rec.selected[l], layout);
    for (std::size_t j = 0; j < 2; ++j) {
      double want = 0;
      for (std::int64_t q = 11; q < 15; ++q)
        for (std::int64_t k = 0; k < 15; ++k)
          if (group_of(k) == static_cast<int>(j)) want += ref.attn[l][static_cast<std::size_t>(q * 15 + k)];
      CHECK(qa[j] == doctest::Approx(want).epsilon(1e-5));
    }
  }
  // Cache-Craft eq. 3, 4, 14 via chunk_attention == ChunkAttention::from_token_attention on the reference.
  const kvfuse::ChunkAttention mine = kvfuse::chunk_attention({11, 22}, layout, rec.attention);
  const kvfuse::ChunkAttention theirs = kvfuse::ChunkAttention::from_token_attention({11, 22}, layout, ref.attn);
  for (std::size_t l = 0; l < 2; ++l)
    for (std::size_t i = 0; i < 4; ++i)
      CHECK(mine.layer_mass[l][i] == doctest::Approx(theirs.layer_mass[l][i]).epsilon(1e-5));
  for (std::size_t c = 0; c < 2; ++c)
    for (std::size_t t = 0; t < mine.token_prefix_attention[c].size(); ++t)
      CHECK(mine.token_prefix_attention[c][t] == doctest::Approx(theirs.token_prefix_attention[c][t]).epsilon(1e-5));

  // A narrowing policy: layer 0 computes every row, layer 1 only the query. Over a merged KV that already
  // holds the right KV of the other rows (here: their full-prefill KV), the query's logits are full prefill's.
  const kvfuse::LlamaPrefill full = model.full_prefill(tokens);
  LlamaKVCache narrowed = full.kv;
  for (std::vector<float>& layer : narrowed.v)  // rows the policy recomputes get overwritten anyway
    std::fill(layer.begin() + 11 * narrowed.kv_dim, layer.end(), 0.0f);
  Recorder seen;
  const auto query_only = [&](const LayerReport& r) {
    (void)seen.policy()(r);
    CHECK(r.k_deviation.size() == r.selected.size());
    return TokenSet{11, 12, 13, 14};
  };
  const auto out = model.partial_prefill(tokens, narrowed, all_rows(15), query_only, options);
  CHECK(out.selected_per_layer == std::vector<std::int64_t>{15, 4});
  REQUIRE(seen.selected.size() == 2);
  CHECK(seen.selected[1] == TokenSet{11, 12, 13, 14});
  CHECK(diff(out.logits, full.logits).rounding());
  CHECK(diff(flat_kv(narrowed), flat_kv(full.kv)).rounding());
  // Layer 1's statistics cover the 4 query rows: enough for eq. 15, not for the per-chunk profile.
  const std::vector<float> qa1 = kvfuse::question_attention(seen.attention[1], seen.selected[1], layout);
  CHECK(qa1[0] ==
        doctest::Approx(kvfuse::question_attention(rec.attention[1], rec.selected[1], layout)[0]).epsilon(1e-5));
  CHECK(error_of([&] {
          (void)kvfuse::chunk_attention({11, 22}, layout, seen.attention);
        }).find("layer 1 holds statistics of 4 rows x 3 groups; it selected 15 rows") != std::string::npos);
  // With the rows each layer selected, the statistics are read, but no chunk was computed on every layer.
  (void)kvfuse::chunk_attention({11, 22}, layout, seen.attention, seen.selected);
  for (const kvfuse::PromptChunk& c : layout.chunks)
    CHECK_FALSE(kvfuse::computed_on_every_layer(c.range, seen.selected));
  CHECK(kvfuse::computed_on_every_layer(layout.query, seen.selected));
  CHECK(error_of([&] {
          (void)kvfuse::question_attention(seen.attention[1], TokenSet{11, 12, 13}, layout);
        }).find("12 mass values for 3 selected rows") != std::string::npos);
}

TEST_CASE("the query mass is softmax(QK^T) summed over the query rows and the heads, from the same attention") {
  const CpuLlama model = tiny_model();  // query blocks of 4: the query rows [11, 15) straddle two blocks
  const std::vector<token_id> tokens = prompt_tokens(15, 8);
  const Reference ref = reference_forward(model.config(), model.weights(), tokens);
  const auto reference_mass = [&](std::size_t l, std::int64_t row) {
    double want = 0;
    for (std::int64_t q = 11; q < 15; ++q) want += ref.attn[l][static_cast<std::size_t>(q * 15 + row)];
    return want;
  };
  kvfuse::PartialPrefillOptions options;
  options.query_mass_rows = {11, 15};
  std::vector<TokenSet> selected;
  std::vector<std::vector<float>> mass;
  const auto record = [&](const LayerReport& r) {
    selected.push_back(r.selected);
    mass.emplace_back(r.query_mass.begin(), r.query_mass.end());
    CHECK(r.attention == nullptr);  // only what was asked for
  };

  // Every row on every layer: one value per row, Σ = |query| x heads (one softmax per query row and head).
  LlamaKVCache kv(2, model.config().kv_dim(), 15);
  model.partial_prefill(tokens, kv, all_rows(15), [&](const LayerReport& r) { record(r); return r.selected; },
                        options);
  REQUIRE(mass.size() == 2);
  for (std::size_t l = 0; l < 2; ++l) {
    REQUIRE(mass[l].size() == 15);
    double total = 0;
    for (std::int64_t row = 0; row < 15; ++row) {
      CHECK(mass[l][static_cast<std::size_t>(row)] == doctest::Approx(reference_mass(l, row)).epsilon(1e-5));
      total += mass[l][static_cast<std::size_t>(row)];
    }
    CHECK(total == doctest::Approx(4.0 * 4.0).epsilon(1e-5));
  }

  // A narrowed layer 1 over exact KV (full prefill's): the query rows still attend to every row, so the mass on
  // the rows it computes is the reference's.
  const kvfuse::LlamaPrefill full = model.full_prefill(tokens);
  LlamaKVCache narrowed = full.kv;
  selected.clear();
  mass.clear();
  model.partial_prefill(
      tokens, narrowed, all_rows(15), [&](const LayerReport& r) { record(r); return TokenSet{3, 7, 11, 12, 13, 14}; },
      options);
  REQUIRE(mass.size() == 2);
  REQUIRE(mass[1].size() == 6);
  for (std::size_t i = 0; i < 6; ++i)
    CHECK(mass[1][i] == doctest::Approx(reference_mass(1, selected[1][i])).epsilon(1e-5));
  // Without a request the report carries no query mass; a layer without every query row is refused by name.
  LlamaKVCache plain(2, model.config().kv_dim(), 15);
  model.partial_prefill(tokens, plain, all_rows(15), [](const LayerReport& r) {
    CHECK(r.query_mass.empty());
    return r.selected;
  });
  LlamaKVCache dropped(2, model.config().kv_dim(), 15);
  CHECK(error_of([&] {
          model.partial_prefill(tokens, dropped, all_rows(15), [](const LayerReport&) { return TokenSet{11, 12, 14}; },
                                options);
        }).find("layer 1 computes 3 of the query rows [11, 15)") != std::string::npos);
}

TEST_CASE("greedy decoding from an assembled KV equals argmax of full prefill step by step") {
  const CpuLlama model = tiny_model(RopePairing::interleaved, 11);
  std::vector<token_id> tokens = prompt_tokens(6, 2);
  kvfuse::LlamaPrefill pre = model.full_prefill(tokens);
  const std::vector<token_id> generated = model.greedy_decode(pre.kv, pre.logits, 5, -1);
  REQUIRE(generated.size() == 5);
  CHECK(pre.kv.num_rows() == 10);  // the prompt and every generated token but the last
  for (token_id t : generated) {
    CHECK(t == kvfuse::argmax_token(model.full_prefill(tokens).logits));
    tokens.push_back(t);
  }
  // eos stops decoding at its first occurrence and is not returned; max_new_tokens = 0 returns nothing.
  kvfuse::LlamaPrefill again = model.full_prefill(prompt_tokens(6, 2));
  const auto first_eos = std::find(generated.begin(), generated.end(), generated[2]);
  CHECK(model.greedy_decode(again.kv, again.logits, 5, generated[2]) ==
        std::vector<token_id>(generated.begin(), first_eos));
  CHECK(model.greedy_decode(again.kv, again.logits, 0, -1).empty());

  CpuLlamaSession session(model, prompt_tokens(6, 2));
  session.compute_kv({0, 6});
  CHECK(session.generate(5, -1) == generated);
  CHECK(session.kv().num_rows() == 6);  // generate decodes on a copy
}

TEST_CASE("teacher forcing: forced_logits gives the distribution before each given token, as full prefill does") {
  const CpuLlama model = tiny_model(RopePairing::interleaved, 11);
  const std::vector<token_id> prompt = prompt_tokens(6, 2);
  const std::vector<token_id> forced = {3, 17, 5, 9};  // not the model's greedy choices
  kvfuse::LlamaPrefill pre = model.full_prefill(prompt);
  const std::vector<std::vector<float>> logits = model.forced_logits(pre.kv, pre.logits, forced);
  REQUIRE(logits.size() == forced.size());
  CHECK(pre.kv.num_rows() == 9);  // the prompt and every forced token but the last
  std::vector<token_id> seen = prompt;
  for (std::size_t i = 0; i < forced.size(); ++i) {
    CAPTURE(i);
    CHECK(kvfuse_test::diff(logits[i], model.full_prefill(seen).logits).rounding());
    seen.push_back(forced[i]);
  }
  CHECK(model.forced_logits(pre.kv, pre.logits, {}).empty());
  CHECK_THROWS_WITH_AS((void)model.forced_logits(pre.kv, std::vector<float>(3), forced),
                       doctest::Contains("3 logits for a vocabulary of"), kvfuse::error);
}

TEST_CASE("CpuLlamaSession models ComputeBackend: install, export, and Cake's compute-front / load-back split") {
  const CpuLlama model = tiny_model();
  const std::vector<token_id> tokens = prompt_tokens(12, 6);
  CpuLlamaSession producer(model, tokens);
  producer.compute_kv({0, 12});
  const kvfuse::KVBlock back = producer.export_kv({5, 12});
  CHECK(back.num_tokens == 7);
  CHECK(back.bytes.size() == 2u * 2u * 7u * 16u * sizeof(float));
  // Byte layout: layer 0 K rows, layer 0 V rows, layer 1 K rows, layer 1 V rows.
  float first_v1 = 0;
  std::memcpy(&first_v1, back.bytes.data() + (2 * 7 * 16 + 7 * 16) * sizeof(float), sizeof(float));
  CHECK(first_v1 == producer.kv().v_row(1, 5)[0]);

  // A stored block read back as a chunk cache at its positions (what a fusion method does with a store hit).
  const LlamaKVCache chunk = LlamaKVCache::from_block(back, 2, 16, 5);
  CHECK(chunk.positions == std::vector<std::int64_t>{5, 6, 7, 8, 9, 10, 11});
  CHECK(flat_kv(chunk) == flat_kv(producer.kv().slice({5, 12})));

  CpuLlamaSession consumer(model, tokens);
  consumer.compute_kv({0, 5});
  consumer.install_kv({5, 12}, back);
  CHECK(consumer.resident_prefix() == 12);
  const std::span<const float> a = producer.logits();
  const std::span<const float> b = consumer.logits();  // last token installed: recomputed against the KV
  CHECK(diff(std::vector<float>(b.begin(), b.end()), std::vector<float>(a.begin(), a.end())).rounding());

  // Load first, compute after: install the back, then compute the front.
  CpuLlamaSession late(model, tokens);
  late.install_kv({5, 12}, back);
  CHECK(late.resident_prefix() == 0);
  late.compute_kv({0, 5});
  CHECK(late.resident_prefix() == 12);
  CHECK(diff(flat_kv(late.kv()), flat_kv(producer.kv())).rounding());

  // Fingerprints tell models apart.
  CHECK(producer.model_fingerprint() == model.fingerprint());
  CHECK(tiny_model(RopePairing::interleaved, 8).fingerprint() != model.fingerprint());
  CHECK(tiny_model(RopePairing::half_split).fingerprint() != model.fingerprint());
  CHECK(tiny_model().fingerprint() == model.fingerprint());

  // One thread gives the same results as two, to rounding.
  const CpuLlama single = tiny_model(RopePairing::interleaved, 7, 1);
  CHECK(single.threads() == 1);
  CHECK(diff(single.full_prefill(tokens).logits, model.full_prefill(tokens).logits).rounding());
}

TEST_CASE("the CPU backend refuses bad inputs with a message naming them") {
  const CpuLlama model = tiny_model();
  const std::vector<token_id> tokens = prompt_tokens(8);

  CHECK(error_of([&] {
          (void)model.full_prefill(std::vector<token_id>{1, 64});
        }).find("token 64 at index 1") != std::string::npos);
  CHECK(error_of([&] { (void)model.full_prefill(std::vector<token_id>{}); }).find("no tokens") != std::string::npos);
  CHECK(error_of([&] { (void)model.prefill_chunk(tokens, -1); }).find("first_position -1") != std::string::npos);
  CHECK(model.prefill_chunk({}, 3).num_rows() == 0);

  LlamaKVCache kv = model.full_prefill(tokens).kv;
  CHECK(error_of([&] { model.rope_shift(kv, {2, 4}, -3); }).find("position 2 would move to -1") != std::string::npos);
  CHECK(error_of([&] { model.rope_shift(kv, {2, 9}, 1); }).find("[2, 9)") != std::string::npos);

  const auto partial = [&](const TokenSet& initial, kvfuse::SelectionPolicy policy) {
    LlamaKVCache merged = kv;
    return error_of([&] { (void)model.partial_prefill(tokens, merged, initial, policy); });
  };
  CHECK(partial({0, 1}, {}).find("must contain the last row 7") != std::string::npos);
  CHECK(partial({3, 2, 7}, {}).find("row 2 (entry 1) is not above") != std::string::npos);
  CHECK(partial({0, 8}, {}).find("row 8 (entry 1) is outside [0, 8)") != std::string::npos);
  CHECK(partial({1, 7}, [](const LayerReport&) {
          return TokenSet{0, 7};
        }).find("selected row 0 after layer 0") != std::string::npos);
  CHECK(partial({1, 7}, [](const LayerReport&) { return TokenSet{1}; }).find("dropped the last row 7") !=
        std::string::npos);
  {
    LlamaKVCache short_kv = kv.slice({0, 5});
    CHECK(error_of([&] {
            (void)model.partial_prefill(tokens, short_kv, {7}, {});
          }).find("8 tokens but the merged KV holds 5 rows") != std::string::npos);
    LlamaKVCache wrong(3, 16, 8);
    CHECK(error_of([&] { (void)model.partial_prefill(tokens, wrong, {7}, {}); }).find("3 layers x 16") !=
          std::string::npos);
    const kvfuse::PromptLayout small = kvfuse::PromptLayout::from_lengths({3}, 2);
    kvfuse::PartialPrefillOptions options;
    options.attention_groups = &small;
    LlamaKVCache merged = kv;
    CHECK(error_of([&] {
            (void)model.partial_prefill(tokens, merged, {7}, {}, options);
          }).find("cover 5 tokens, the prompt has 8") != std::string::npos);
  }

  CpuLlamaSession session(model, tokens);
  CHECK(error_of([&] {
          session.compute_kv({2, 4});
        }).find("needs the KV of [0, 2) but only [0, 0)") != std::string::npos);
  CHECK(error_of([&] { session.compute_kv({0, 9}); }).find("[0, 9)") != std::string::npos);
  CHECK(error_of([&] { session.compute_kv({3, 3}); }).find("empty range") != std::string::npos);
  CHECK(error_of([&] { (void)session.logits(); }).find("only [0, 0) of 8") != std::string::npos);
  CHECK(error_of([&] {
          (void)session.export_kv({0, 2});
        }).find("token 0 of [0, 2) is not resident") != std::string::npos);
  kvfuse::KVBlock block = kv.to_block({0, 3});
  CHECK(error_of([&] { session.install_kv({0, 2}, block); }).find("expected") != std::string::npos);
  const float nan = std::numeric_limits<float>::quiet_NaN();
  std::memcpy(block.bytes.data() + 5 * sizeof(float), &nan, sizeof nan);
  CHECK(error_of([&] { session.install_kv({0, 3}, block); }).find("at float 5") != std::string::npos);
  CHECK(session.resident_prefix() == 0);
  CHECK(error_of([&] { CpuLlamaSession(model, {}); }).find("empty prompt") != std::string::npos);
  CHECK(error_of([&] { CpuLlamaSession(model, {0, -1}); }).find("token -1 at index 1") != std::string::npos);
  CHECK(error_of([&] {
          (void)model.greedy_decode(kv, std::vector<float>(3), 1, 0);
        }).find("3 logits for a vocabulary of 64") != std::string::npos);
}

TEST_CASE("a prompt beyond the model's trained context is refused with its length and the limit, unless allowed") {
  LlamaConfig c = tiny_config();
  c.context_length = 12;
  const CpuLlama model(c, LlamaWeights::random(c, 7), kvfuse::CpuLlamaOptions{2, 4});
  const std::vector<token_id> fits = prompt_tokens(12);
  CHECK(model.full_prefill(fits).logits.size() == 64);  // positions 0 .. 11: within the context
  const std::vector<token_id> longer = prompt_tokens(13);
  const std::string why = error_of([&] { (void)model.full_prefill(longer); });
  CHECK(why.find("reaches position 12 (13 tokens), beyond the model's trained context of 12 tokens") !=
        std::string::npos);
  CHECK(why.find("allow_beyond_context") != std::string::npos);
  // Every way of reaching such a position is refused: extending a full context, a chunk placed past it.
  kvfuse::LlamaPrefill full = model.full_prefill(fits);
  const std::vector<token_id> more{5};
  CHECK(error_of([&] { (void)model.extend(full.kv, more); }).find("trained context of 12 tokens") !=
        std::string::npos);
  CHECK(full.kv.num_rows() == 12);  // refused before the cache grew
  CHECK(error_of([&] { (void)model.prefill_chunk(fits, 1); }).find("reaches position 12") != std::string::npos);
  // Opted in, the same prompt runs and equals the model without a limit.
  kvfuse::CpuLlamaOptions allow{2, 4};
  allow.allow_beyond_context = true;
  const CpuLlama allowed(c, LlamaWeights::random(c, 7), allow);
  LlamaConfig unlimited_config = c;
  unlimited_config.context_length = 0;
  const CpuLlama unlimited(unlimited_config, LlamaWeights::random(c, 7), kvfuse::CpuLlamaOptions{2, 4});
  CHECK(allowed.full_prefill(longer).logits == unlimited.full_prefill(longer).logits);
  c.context_length = -1;
  CHECK(error_of([&] { c.validate(); }).find("context_length = -1 must be >= 0") != std::string::npos);
}

TEST_CASE("LlamaConfig and LlamaWeights refuse what is not implemented or inconsistent") {
  const auto config_error = [](auto edit) {
    LlamaConfig c = tiny_config();
    edit(c);
    return error_of([&] { c.validate(); });
  };
  CHECK(config_error([](LlamaConfig& c) { c.n_head_kv = 3; }).find("n_head = 4 is not a multiple of n_head_kv = 3") !=
        std::string::npos);
  CHECK(config_error([](LlamaConfig& c) { c.head_dim = 7; }).find("head_dim = 7 must be even") != std::string::npos);
  CHECK(config_error([](LlamaConfig& c) { c.n_layer = 0; }).find("n_layer = 0") != std::string::npos);
  CHECK(config_error([](LlamaConfig& c) { c.rms_eps = 0; }).find("rms_eps = 0") != std::string::npos);
  CHECK(config_error([](LlamaConfig& c) { c.rope_base = -1; }).find("rope_base = -1") != std::string::npos);
  CHECK(config_error([](LlamaConfig& c) {
          c.rope_freq_factors = {1, 2};
        }).find("2 rope_freq_factors for head_dim / 2 = 4") != std::string::npos);
  CHECK(config_error([](LlamaConfig& c) {
          c.rope_freq_factors = {1, 2, 0, 1};
        }).find("rope_freq_factors[2] = 0") != std::string::npos);
  CHECK(config_error([](LlamaConfig& c) { c.rope_linear_factor = 0; }).find("rope_linear_factor = 0") !=
        std::string::npos);

  const LlamaConfig c = tiny_config();
  LlamaWeights w = LlamaWeights::random(c, 1);
  w.layers[1].wk = RowMatrix::Zero(8, 32);
  CHECK(error_of([&] { CpuLlama(c, w); }).find("layer 1 wk is 8 x 32, expected 16 x 32") != std::string::npos);
  w = LlamaWeights::random(c, 1);
  w.output_norm[3] = std::numeric_limits<float>::infinity();
  CHECK(error_of([&] { CpuLlama(c, w); }).find("output_norm holds a value that is not finite") != std::string::npos);
  CHECK(error_of([&] {
          CpuLlama(c, LlamaWeights::random(c, 1), kvfuse::CpuLlamaOptions{-1, 4});
        }).find("threads = -1") != std::string::npos);

  // Linear scaling and frequency factors are implemented: a factor-2 linear scale at position 2p equals no
  // scale at p for layer-0 K.
  LlamaConfig scaled = tiny_config();
  scaled.rope_linear_factor = 2.0;
  const CpuLlama plain(c, LlamaWeights::random(c, 3));
  const CpuLlama stretched(scaled, LlamaWeights::random(scaled, 3));
  const std::vector<token_id> one{5};
  CHECK(diff(stretched.prefill_chunk(one, 10).k[0], plain.prefill_chunk(one, 5).k[0]).max_abs <= 1e-6);
}

TEST_CASE("the fingerprint covers every weight byte: one changed byte inside a tensor of the GGUF file changes it") {
  LlamaConfig c = tiny_config();
  c.rms_eps = static_cast<float>(1e-5);
  const std::vector<std::byte> bytes = tiny_gguf(c, LlamaWeights::random(c, 21), [](GGUFWriter&) {});
  const kvfuse::GGUFFile file = kvfuse::GGUFFile::parse(bytes);
  const std::uint64_t original = CpuLlama::from_gguf(file).fingerprint();
  CHECK(CpuLlama::from_gguf(kvfuse::GGUFFile::parse(bytes)).fingerprint() == original);  // deterministic
  // The lowest mantissa bit of a value in the middle of each tensor (a fine-tune's change, a damaged file); a
  // fingerprint of the first and last values of each tensor once missed these.
  for (const char* name : {"token_embd.weight", "blk.1.attn_k.weight", "blk.0.ffn_down.weight", "blk.1.ffn_norm.weight"}) {
    CAPTURE(name);
    const std::span<const std::byte> tensor = file.raw(file.tensor(name));  // in place: inside `bytes`
    const auto at = static_cast<std::size_t>(tensor.data() - bytes.data()) + tensor.size() / 2 / 4 * 4;
    std::vector<std::byte> changed = bytes;
    changed[at] ^= std::byte{0x01};
    CHECK(CpuLlama::from_gguf(kvfuse::GGUFFile::parse(changed)).fingerprint() != original);
  }
}

TEST_CASE("LlamaConfig / LlamaWeights from a GGUF file: [ne0 = in, ne1 = out] weights, refusals") {
  LlamaConfig c = tiny_config();
  c.rms_eps = static_cast<float>(1e-5);  // as stored in the file (float32)
  const LlamaWeights w = LlamaWeights::random(c, 21);
  const CpuLlama direct(c, w);
  const std::vector<token_id> tokens = prompt_tokens(7);

  const std::vector<std::byte> bytes = tiny_gguf(c, w, [](GGUFWriter&) {});
  const kvfuse::GGUFFile file = kvfuse::GGUFFile::parse(bytes);
  const CpuLlama loaded = CpuLlama::from_gguf(file);
  CHECK(loaded.config().n_layer == 2);
  CHECK(loaded.config().n_head_kv == 2);
  CHECK(loaded.config().head_dim == 8);
  CHECK(loaded.config().n_vocab == 64);  // from token_embd.weight: no llama.vocab_size key
  CHECK(loaded.config().rope_pairing == RopePairing::interleaved);
  CHECK(loaded.weights().output.size() == 0);  // tied
  CHECK(loaded.weights().layers[1].wk.dense() == w.layers[1].wk.dense());
  CHECK(loaded.fingerprint() == direct.fingerprint());
  CHECK(loaded.full_prefill(tokens).logits == direct.full_prefill(tokens).logits);

  const std::vector<std::byte> untied = tiny_gguf(
      c, w, [](GGUFWriter&) {}, true);
  const kvfuse::GGUFFile untied_file = kvfuse::GGUFFile::parse(untied);
  CHECK(LlamaWeights::from_gguf(untied_file, c).output.dense() == w.token_embd.dense());

  // Linear scaling and rope_freqs factors are read.
  const float factors[4] = {1, 1, 2, 4};
  const std::vector<std::byte> scaled = tiny_gguf(c, w, [&](GGUFWriter& g) {
    g.str("llama.rope.scaling.type", "linear");
    g.f32("llama.rope.scaling.factor", 4.0f);
    g.tensor("rope_freqs.weight", {4}, factors);
  });
  const LlamaConfig sc = LlamaConfig::from_gguf(kvfuse::GGUFFile::parse(scaled));
  CHECK(sc.rope_linear_factor == 4.0);
  CHECK(sc.rope_freq_factors == std::vector<float>{1, 1, 2, 4});

  const auto refusal = [&](auto edit) {
    const std::vector<std::byte> b = tiny_gguf(c, w, edit);
    return error_of([&] {
      const kvfuse::GGUFFile f = kvfuse::GGUFFile::parse(b);
      (void)CpuLlama::from_gguf(f);
    });
  };
  CHECK(refusal([](GGUFWriter& g) { g.str("llama.rope.scaling.type", "yarn"); }).find("RoPE scaling type 'yarn'") !=
        std::string::npos);
  CHECK(refusal([](GGUFWriter& g) { g.u32("llama.expert_count", 8); }).find("mixture of experts") != std::string::npos);
  CHECK(refusal([](GGUFWriter& g) { g.u32("llama.attention.key_length", 4); }).find("partial rotary embedding") !=
        std::string::npos);
  const float bias[16] = {};
  CHECK(refusal([&](GGUFWriter& g) {
          g.tensor("blk.0.attn_k.bias", {16}, bias);
        }).find("'blk.0.attn_k.bias' is not part") != std::string::npos);
  CHECK(refusal([&](GGUFWriter& g) { g.tensor("rope_freqs.weight", {3}, bias); }).find("rope_freqs.weight holds 3") !=
        std::string::npos);

  // A file whose header says 3 KV heads for 4 query heads, another architecture, a missing and a transposed tensor.
  LlamaConfig odd = c;
  odd.n_head_kv = 3;
  GGUFWriter g;
  g.str("general.architecture", "phi3");
  CHECK(error_of([&] {
          (void)LlamaConfig::from_gguf(kvfuse::GGUFFile::parse(g.bytes()));
        }).find("architecture 'phi3'") != std::string::npos);
  const std::vector<std::byte> gqa = tiny_gguf(odd, w, [](GGUFWriter&) {});
  CHECK(error_of([&] {
          (void)LlamaConfig::from_gguf(kvfuse::GGUFFile::parse(gqa));
        }).find("n_head = 4 is not a multiple of n_head_kv = 3") != std::string::npos);
  LlamaWeights broken = w;
  broken.layers[1].w_up = w.layers[1].w_up.dense().transpose();
  const std::vector<std::byte> transposed = tiny_gguf(c, broken, [](GGUFWriter&) {});
  CHECK(error_of([&] {
          (void)LlamaWeights::from_gguf(kvfuse::GGUFFile::parse(transposed), c);
        }).find("'blk.1.ffn_up.weight' has dims [64, 32], expected [32, 64] (in, out)") != std::string::npos);
  LlamaConfig three = c;
  three.n_layer = 3;
  CHECK(error_of([&] {
          (void)LlamaWeights::from_gguf(kvfuse::GGUFFile::parse(bytes), three);
        }).find("blk.2.attn_norm.weight") != std::string::npos);
}

TEST_CASE("real model: SmolLM2-135M-Instruct answers a ChatML question (Release builds with the model file)") {
  const auto model_file = kvfuse_test::real_model(/*optimized_only=*/true);
  if (!model_file) return;
  const std::filesystem::path& path = *model_file;
  const kvfuse::GGUFFile file = kvfuse::GGUFFile::open(path);
  const CpuLlama model = CpuLlama::from_gguf(file);
  const LlamaConfig& c = model.config();
  if (c.n_layer != 30 || c.n_embd != 576 || c.n_head != 9 || c.n_head_kv != 3 || c.n_vocab != 49152) {
    kvfuse_test::skip(path.string() + " is not SmolLM2-135M");
    return;
  }
  CHECK(c.context_length == 8192);  // llama.context_length
  // "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n", token ids from
  // the Hugging Face `tokenizers` BPE built from the file's vocabulary and merges.
  const std::vector<token_id> prompt{1, 4093, 198, 1780, 314, 260, 3575, 282, 4649, 47, 2, 198, 1, 520, 9531, 198};
  CpuLlamaSession session(model, prompt);
  session.compute_kv({0, 9});
  session.compute_kv({9, 16});
  // "The capital of France is Paris." then <|im_end|> (id 2): the greedy answer of an independent numpy
  // forward pass over the `gguf` package's dequantized tensors.
  CHECK(session.generate(16, 2) == std::vector<token_id>{504, 3575, 282, 4649, 314, 7042, 30});
}

TEST_CASE("edge cases: one-token prompt and chunks, empty chunks and shifts, one thread or many") {
  const CpuLlama model = tiny_model();
  const std::vector<token_id> one{9};
  const kvfuse::LlamaPrefill single = model.full_prefill(one);
  CHECK(diff(single.logits, reference_forward(model.config(), model.weights(), one).logits).rounding());

  // A prompt of one-token chunks and an empty chunk, fused with every row recomputed, is full prefill.
  const std::vector<token_id> tokens = prompt_tokens(5, 12);
  LlamaKVCache merged = model.empty_kv();
  for (std::int64_t i = 0; i < 4; ++i) {
    LlamaKVCache chunk =
        model.prefill_chunk(std::span<const token_id>(tokens).subspan(static_cast<std::size_t>(i), 1), 0);
    model.rope_shift(chunk, {0, 1}, i);
    merged.append(chunk);
    merged.append(model.prefill_chunk({}, 0));  // empty chunk: nothing to append
  }
  model.rope_shift(merged, {2, 2}, 100);  // empty range: no-op
  merged.append(LlamaKVCache(2, model.config().kv_dim(), 1));
  merged.positions.back() = 4;
  CHECK(merged.num_rows() == 5);
  const std::vector<float> logits = model.partial_prefill(tokens, merged, all_rows(5), {}).logits;
  CHECK(logits == model.full_prefill(tokens).logits);
  // Reusing the one-token chunk caches and recomputing only the last token computes one row per layer.
  LlamaKVCache reused = merged;
  CHECK(model.partial_prefill(tokens, reused, TokenSet{4}, {}).selected_per_layer == std::vector<std::int64_t>{1, 1});
}

TEST_CASE("detail::WorkerPool runs every iteration once, rethrows, and runs nested loops serially") {
  kvfuse::detail::WorkerPool pool(3);
  CHECK(pool.size() == 3);
  std::vector<int> hits(100, 0);
  pool.parallel_for(100, [&](std::int64_t i) { ++hits[static_cast<std::size_t>(i)]; });
  CHECK(std::all_of(hits.begin(), hits.end(), [](int h) { return h == 1; }));

  std::vector<int> nested(16, 0);
  pool.parallel_for(4, [&](std::int64_t i) {
    pool.parallel_for(4, [&](std::int64_t j) { ++nested[static_cast<std::size_t>(i * 4 + j)]; });
  });
  CHECK(std::all_of(nested.begin(), nested.end(), [](int h) { return h == 1; }));

  std::atomic<int> ran{0};
  CHECK_THROWS_AS(pool.parallel_for(10,
                                    [&](std::int64_t i) {
                                      ++ran;
                                      if (i == 3) throw kvfuse::error("iteration 3");
                                    }),
                  kvfuse::error);
  CHECK(ran.load() == 10);
  pool.parallel_for(0, [](std::int64_t) { FAIL("no iterations"); });
  kvfuse::detail::WorkerPool lone(1);
  CHECK(lone.size() == 1);
}

}  // namespace unit_cpu_llama
