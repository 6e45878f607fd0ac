#pragma once
// LlamaKVCache: the K and V of a run of tokens on every layer, fp32, as the CPU backend keeps them.
//
// Layout: for each layer l, k[l] and v[l] are row-major [rows][kv_dim] matrices, kv_dim = n_head_kv · head_dim,
// one row per token, head-major within a row (KV head g occupies [g · head_dim, (g + 1) · head_dim)), the
// layout kvfuse::kv_deviation expects. K is stored rotated (RoPE) at the row's position, positions[row].
// Rows need not be sorted by position; attention masks by position, not by row.
//
// As bytes (KVBlock, what a KVStore holds): for each layer l = 0 .. L-1, the K rows then the V rows of that
// layer, native-endian fp32: L · 2 · rows · kv_dim · 4 bytes. Positions are not stored: K is rotated at the
// positions the block was computed at, which the reader supplies.

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <vector>

#include "kvfuse/core/error.hpp"
#include "kvfuse/core/types.hpp"

namespace kvfuse {

struct LlamaKVCache {
  std::int64_t kv_dim = 0;
  std::vector<std::int64_t> positions;  // one per row
  std::vector<std::vector<float>> k;    // [layer] -> rows x kv_dim
  std::vector<std::vector<float>> v;    // [layer] -> rows x kv_dim

  LlamaKVCache() = default;
  // `rows` zero rows at positions 0 .. rows - 1.
  LlamaKVCache(std::int64_t num_layers, std::int64_t kv_width, std::int64_t rows) : kv_dim(kv_width) {
    detail::require(num_layers >= 1 && kv_width >= 1 && rows >= 0,
                    "LlamaKVCache: needs num_layers >= 1, kv_dim >= 1, rows >= 0; got {}, {}, {}", num_layers, kv_width,
                    rows);
    positions.resize(static_cast<std::size_t>(rows));
    for (std::int64_t r = 0; r < rows; ++r) positions[static_cast<std::size_t>(r)] = r;
    k.assign(static_cast<std::size_t>(num_layers), std::vector<float>(static_cast<std::size_t>(rows * kv_width)));
    v = k;
  }

  [[nodiscard]] std::int64_t num_layers() const noexcept { return static_cast<std::int64_t>(k.size()); }
  [[nodiscard]] std::int64_t num_rows() const noexcept { return static_cast<std::int64_t>(positions.size()); }

  [[nodiscard]] float* k_row(std::int64_t layer, std::int64_t row) noexcept {
    return k[static_cast<std::size_t>(layer)].data() + row * kv_dim;
  }
  [[nodiscard]] const float* k_row(std::int64_t layer, std::int64_t row) const noexcept {
    return k[static_cast<std::size_t>(layer)].data() + row * kv_dim;
  }
  [[nodiscard]] float* v_row(std::int64_t layer, std::int64_t row) noexcept {
    return v[static_cast<std::size_t>(layer)].data() + row * kv_dim;
  }
  [[nodiscard]] const float* v_row(std::int64_t layer, std::int64_t row) const noexcept {
    return v[static_cast<std::size_t>(layer)].data() + row * kv_dim;
  }

  // Throws unless the per-layer matrices match num_rows() x kv_dim.
  void check_shape(const char* what) const {
    detail::require(v.size() == k.size(), "{}: KV cache has {} K layers but {} V layers", what, k.size(), v.size());
    const auto expected = static_cast<std::size_t>(num_rows() * kv_dim);
    for (std::size_t l = 0; l < k.size(); ++l) {
      detail::require(k[l].size() == expected && v[l].size() == expected,
                      "{}: KV cache layer {} holds {} K and {} V floats, expected {} rows x {} = {}", what, l,
                      k[l].size(), v[l].size(), num_rows(), kv_dim, expected);
    }
  }

  // Rows [r.begin, r.end) as their own cache (positions kept).
  [[nodiscard]] LlamaKVCache slice(TokenRange r) const {
    validate_range(r, num_rows(), "LlamaKVCache::slice");
    LlamaKVCache out;
    out.kv_dim = kv_dim;
    out.positions.assign(positions.begin() + r.begin, positions.begin() + r.end);
    const auto copy = [&](const std::vector<std::vector<float>>& from, std::vector<std::vector<float>>& to) {
      to.resize(from.size());
      for (std::size_t l = 0; l < from.size(); ++l)
        to[l].assign(from[l].begin() + r.begin * kv_dim, from[l].begin() + r.end * kv_dim);
    };
    copy(k, out.k);
    copy(v, out.v);
    return out;
  }

  // Appends the rows of `other` (same layers and kv_dim) after this cache's rows. Appending to an empty
  // default-constructed cache adopts other's shape.
  void append(const LlamaKVCache& other) {
    if (k.empty() && positions.empty()) {
      *this = other;
      return;
    }
    detail::require(other.num_layers() == num_layers() && other.kv_dim == kv_dim,
                    "LlamaKVCache::append: shapes differ ({} layers x {} vs {} layers x {})", other.num_layers(),
                    other.kv_dim, num_layers(), kv_dim);
    positions.insert(positions.end(), other.positions.begin(), other.positions.end());
    for (std::size_t l = 0; l < k.size(); ++l) {
      k[l].insert(k[l].end(), other.k[l].begin(), other.k[l].end());
      v[l].insert(v[l].end(), other.v[l].begin(), other.v[l].end());
    }
  }

  // Bytes of a KVBlock holding `rows` rows of this shape.
  [[nodiscard]] static std::size_t block_bytes(std::int64_t num_layers, std::int64_t kv_width, std::int64_t rows) {
    return static_cast<std::size_t>(num_layers) * 2 * static_cast<std::size_t>(rows) *
           static_cast<std::size_t>(kv_width) * sizeof(float);
  }

  // Rows [r.begin, r.end) as a KVBlock (layout in the header comment); first_position = the position of row
  // r.begin (meaningful when the rows' positions are consecutive, as in a chunk).
  [[nodiscard]] KVBlock to_block(TokenRange r) const {
    validate_range(r, num_rows(), "LlamaKVCache::to_block");
    KVBlock block;
    block.num_tokens = r.size();
    block.first_position = r.empty() ? 0 : positions[static_cast<std::size_t>(r.begin)];
    block.bytes.resize(block_bytes(num_layers(), kv_dim, r.size()));
    const std::size_t part = static_cast<std::size_t>(r.size() * kv_dim) * sizeof(float);
    std::byte* out = block.bytes.data();
    for (std::size_t l = 0; l < k.size(); ++l) {
      if (part == 0) break;
      std::memcpy(out, k[l].data() + r.begin * kv_dim, part);
      out += part;
      std::memcpy(out, v[l].data() + r.begin * kv_dim, part);
      out += part;
    }
    return block;
  }

  // Writes the rows of `block` over rows [r.begin, r.end) of this cache; positions are left as they are.
  void write_block(TokenRange r, const KVBlock& block) {
    validate_range(r, num_rows(), "LlamaKVCache::write_block");
    detail::require(block.num_tokens == r.size(), "LlamaKVCache::write_block: block of {} tokens for rows {}",
                    block.num_tokens, r);
    const std::size_t expected = block_bytes(num_layers(), kv_dim, r.size());
    detail::require(block.bytes.size() == expected,
                    "LlamaKVCache::write_block: block holds {} bytes, expected {} ({} layers x K,V x {} rows x {} "
                    "floats)",
                    block.bytes.size(), expected, num_layers(), r.size(), kv_dim);
    const std::size_t part = static_cast<std::size_t>(r.size() * kv_dim) * sizeof(float);
    const std::byte* in = block.bytes.data();
    for (std::size_t l = 0; l < k.size(); ++l) {
      if (part == 0) break;
      std::memcpy(k[l].data() + r.begin * kv_dim, in, part);
      in += part;
      std::memcpy(v[l].data() + r.begin * kv_dim, in, part);
      in += part;
    }
  }

  // A cache of block.num_tokens rows at positions first_position, first_position + 1, ...
  [[nodiscard]] static LlamaKVCache from_block(const KVBlock& block, std::int64_t num_layers, std::int64_t kv_width,
                                               std::int64_t first_position) {
    detail::require(block.num_tokens >= 0, "LlamaKVCache::from_block: block of {} tokens", block.num_tokens);
    LlamaKVCache out(num_layers, kv_width, block.num_tokens);
    for (std::int64_t r = 0; r < block.num_tokens; ++r) out.positions[static_cast<std::size_t>(r)] = first_position + r;
    out.write_block({0, block.num_tokens}, block);
    return out;
  }
};

}  // namespace kvfuse
