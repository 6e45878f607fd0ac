#pragma once
// llama.cpp's sequence state (llama_state_seq_get_data), read without llama.cpp as far as checking a stored block
// needs: a magic and the sequence id, then per KV cache (two for a sliding-window model: the full layers', then the
// window's) the stream count, the cell count, per cell its position, its sequence count and sequences, then the
// layers: V transposed or not, the layer count, per layer K's type, row size and rows, then per layer V's (type
// and row size, or type, element size and width when transposed) and its values. LlamaCppContext reads its own
// measuring state with it at construction and refuses a build whose state it cannot read, so a change of layout in
// llama.cpp is an error there, never a block misread. move_sequence_state moves a state to other positions in its
// bytes (its cells' positions, K re-rotated), which LlamaCppContext::shift_block checks against llama.cpp at
// construction before it uses it.

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <ggml.h>

#include "kvfuse/core/rope.hpp"
#include "kvfuse/detail/rope.hpp"

namespace kvfuse::llamacpp::detail {

// One KV cache's part of a sequence state: what it holds besides its K and V values, and where.
struct CacheState {
  std::vector<std::int32_t> positions;  // of its cells, in order
  std::size_t cells_at = 0;             // cell i's position is the int32 at cells_at + 12 · i
  std::vector<std::size_t> k_at;        // per layer: where its K rows begin (cell by cell, one row each)
  // V transposed, the layer count, then each layer's K type and row size, then each layer's V type and row size
  // (transposed: type, element size, width). Equal for every state of one context.
  std::vector<std::uint64_t> layout;
};

struct SequenceStateShape {
  std::uint32_t magic = 0;
  std::vector<CacheState> caches;
};

// The shape of `bytes`, which must be one whole sequence state; on failure, what is wrong (empty when it read).
[[nodiscard]] inline std::string read_sequence_state(std::span<const std::byte> bytes, SequenceStateShape& out) {
  out = {};
  std::size_t at = 0;
  std::string why;
  const auto take = [&](std::size_t n, void* to) {
    if (!why.empty()) return false;
    if (bytes.size() - at < n) {
      why = fmt::format("ends at byte {} inside a field of {} bytes", bytes.size(), n);
      return false;
    }
    if (to != nullptr) std::memcpy(to, bytes.data() + at, n);
    at += n;
    return true;
  };
  const auto u32 = [&] {
    std::uint32_t v = 0;
    take(4, &v);
    return v;
  };
  const auto u64 = [&] {
    std::uint64_t v = 0;
    take(8, &v);
    return v;
  };
  out.magic = u32();
  u32();  // the sequence it was saved from
  while (why.empty() && at < bytes.size()) {
    if (const std::uint32_t streams = u32(); why.empty() && streams != 1)
      return fmt::format("a cache at byte {} has {} streams, not 1", at - 4, streams);
    const std::uint32_t cells = u32();
    CacheState& cache = out.caches.emplace_back();
    cache.cells_at = at;
    if (!why.empty() || cells == 0) continue;
    if (cells > bytes.size() / 12) return fmt::format("{} cells in a state of {} bytes", cells, bytes.size());
    for (std::uint32_t i = 0; i < cells && why.empty(); ++i) {
      cache.positions.push_back(static_cast<std::int32_t>(u32()));
      if (const std::uint32_t seqs = u32(); why.empty() && seqs != 1)
        return fmt::format("cell {} names {} sequences, not 1", i, seqs);
      u32();  // its sequence
    }
    const std::uint32_t v_trans = u32(), n_layer = u32();
    cache.layout = {v_trans, n_layer};
    if (why.empty() && (v_trans > 1 || n_layer == 0 || n_layer > 4096))
      return fmt::format("V transposed {} and {} layers at byte {}", v_trans, n_layer, at - 8);
    for (std::uint32_t l = 0; l < n_layer && why.empty(); ++l) {  // K: type, row size, rows
      const std::uint32_t type = u32();
      const std::uint64_t row = u64();
      cache.layout.insert(cache.layout.end(), {type, row});
      if (why.empty() && row > (bytes.size() - at) / cells)
        return fmt::format("layer {}'s K rows of {} bytes overrun the state", l, row);
      cache.k_at.push_back(at);
      take(static_cast<std::size_t>(row) * cells, nullptr);
    }
    for (std::uint32_t l = 0; l < n_layer && why.empty(); ++l) {  // V: per cell rows, or per channel cells
      const std::uint32_t type = u32();
      const std::uint64_t element = v_trans != 0 ? u32() : u64();
      const std::uint64_t width = v_trans != 0 ? u32() : 1;
      cache.layout.insert(cache.layout.end(), {type, element, width});
      if (why.empty() && (element == 0 || width == 0 || element * width > (bytes.size() - at) / cells))
        return fmt::format("layer {}'s V of {} x {} bytes per cell overruns the state", l, width, element);
      take(static_cast<std::size_t>(element * width) * cells, nullptr);
    }
  }
  if (!why.empty()) return why;
  if (out.caches.empty()) return "holds no cache";
  return {};
}

// One layer's RoPE as llama.cpp applies it: θ_i = base^(−2i/d), divided by the layer's frequency factor, times
// freq_scale (1 / the linear scaling factor).
struct LayerRope {
  float base = 10000.0f, freq_scale = 1.0f;
  std::vector<float> freq_factors;  // head_dim / 2 divisors, or empty
};

// How the K rows of a context's states are rotated: the cache type (f16 or f32), the heads of a row, and per cache
// per layer (in the state's order) its RoPE.
struct StateRope {
  ggml_type k_type = GGML_TYPE_F16;
  std::int64_t n_head_kv = 0, head_dim = 0;
  RopePairing pairing = RopePairing::interleaved;
  std::vector<std::vector<LayerRope>> layers;  // [cache][layer]
};

// cos / sin of a rotation by `delta` positions formed as ggml's CPU RoPE forms them (ggml_rope_cache_init, no
// YaRN): in float, θ starting at delta and multiplied by base^(−2/d) pair by pair, the angle freq_scale · θ / ff_i.
// Not kvfuse's double-angle table (detail::rope_cos_sin): llama.cpp rotated the rows of its full prefill with
// these very angles, so a chunk computed at position 0 and moved by delta gets K as llama.cpp computes it at delta.
inline void ggml_rope_angles(const LayerRope& rope, std::int64_t head_dim, std::int64_t delta, float* cos_out,
                             float* sin_out) {
  const float theta_scale = std::pow(rope.base, -2.0f / static_cast<float>(head_dim));
  float theta = static_cast<float>(delta);
  for (std::int64_t i = 0; i < head_dim / 2; ++i) {
    const float ff = rope.freq_factors.empty() ? 1.0f : rope.freq_factors[static_cast<std::size_t>(i)];
    const float angle = rope.freq_scale * (theta / ff);
    cos_out[i] = std::cos(angle);
    sin_out[i] = std::sin(angle);
    theta *= theta_scale;
  }
}

// `count` K values of type f16 or f32 at `k` as floats, and back.
inline void load_values(const std::byte* k, ggml_type type, std::size_t count, std::vector<float>& out,
                        std::vector<ggml_fp16_t>& halves) {
  out.resize(count);
  if (type == GGML_TYPE_F32) {
    std::memcpy(out.data(), k, count * 4);
    return;
  }
  halves.resize(count);
  std::memcpy(halves.data(), k, count * 2);
  ggml_fp16_to_fp32_row(halves.data(), out.data(), static_cast<std::int64_t>(count));
}
inline void store_values(std::byte* k, ggml_type type, const std::vector<float>& values,
                         std::vector<ggml_fp16_t>& halves) {
  if (type == GGML_TYPE_F32) {
    std::memcpy(k, values.data(), values.size() * 4);
    return;
  }
  halves.resize(values.size());
  ggml_fp32_to_fp16_row(values.data(), halves.data(), static_cast<std::int64_t>(values.size()));
  std::memcpy(k, halves.data(), values.size() * 2);
}

// Moves the sequence state `bytes` (read into `shape`) by delta positions: every cell's position, and every layer's
// K rotated by delta's angles on each head. RoPE composes (R(φ + δ) = R(δ) R(φ)), so K at position p becomes K at
// p + delta up to the rounding of one rotation, as llama.cpp's own K shift computes it (the same angles, the
// rotation in float, then rounded to the cache type).
inline void move_sequence_state(std::span<std::byte> bytes, const SequenceStateShape& shape, const StateRope& rope,
                                std::int64_t delta) {
  const std::int64_t width = rope.n_head_kv * rope.head_dim;
  std::vector<float> cos_phi(static_cast<std::size_t>(rope.head_dim / 2)), sin_phi(cos_phi.size());
  std::vector<float> rows;
  std::vector<ggml_fp16_t> halves;
  for (std::size_t c = 0; c < shape.caches.size(); ++c) {
    const CacheState& cache = shape.caches[c];
    const auto n = static_cast<std::int64_t>(cache.positions.size());
    for (std::int64_t i = 0; i < n; ++i) {
      const auto pos = static_cast<std::int32_t>(cache.positions[static_cast<std::size_t>(i)] + delta);
      std::memcpy(bytes.data() + cache.cells_at + 12 * static_cast<std::size_t>(i), &pos, 4);
    }
    if (n == 0) continue;
    for (std::size_t l = 0; l < cache.k_at.size(); ++l) {
      ggml_rope_angles(rope.layers[c][l], rope.head_dim, delta, cos_phi.data(), sin_phi.data());
      std::byte* k = bytes.data() + cache.k_at[l];
      load_values(k, rope.k_type, static_cast<std::size_t>(n * width), rows, halves);
      for (std::int64_t h = 0; h < n * rope.n_head_kv; ++h)
        kvfuse::detail::rope_rotate_head(rows.data() + h * rope.head_dim, rope.head_dim, rope.pairing, cos_phi.data(),
                                         sin_phi.data());
      store_values(k, rope.k_type, rows, halves);
    }
  }
}

}  // namespace kvfuse::llamacpp::detail
