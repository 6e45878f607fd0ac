#pragma once
// llama.cpp's sequence state (llama_state_seq_get_data), read without llama.cpp as far as checking a stored block
// needs: a magic and the sequence id, then per KV cache (two for a sliding-window model: the full layers', then the
// window's) the stream count, the cell count, per cell its position, its sequence count and sequences, then the
// layers: V transposed or not, the layer count, per layer K's type, row size and rows, then per layer V's (type
// and row size, or type, element size and width when transposed) and its values. LlamaCppContext reads its own
// measuring state with it at construction and refuses a build whose state it cannot read, so a change of layout in
// llama.cpp is an error there, never a block misread.

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <vector>

#include <fmt/format.h>

namespace kvfuse::llamacpp::detail {

// What a sequence state holds besides its K and V values.
struct SequenceStateShape {
  std::uint32_t magic = 0;
  // Per KV cache: the positions of its cells, in order.
  std::vector<std::vector<std::int32_t>> positions;
  // Per KV cache: V transposed, the layer count, then each layer's K type and row size, then each layer's V type
  // and row size (transposed: type, element size, width). Equal for every state of one context.
  std::vector<std::vector<std::uint64_t>> layers;
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
    std::vector<std::int32_t>& pos = out.positions.emplace_back();
    std::vector<std::uint64_t>& layers = out.layers.emplace_back();
    if (!why.empty() || cells == 0) continue;
    if (cells > bytes.size() / 12) return fmt::format("{} cells in a state of {} bytes", cells, bytes.size());
    for (std::uint32_t i = 0; i < cells && why.empty(); ++i) {
      pos.push_back(static_cast<std::int32_t>(u32()));
      if (const std::uint32_t seqs = u32(); why.empty() && seqs != 1)
        return fmt::format("cell {} names {} sequences, not 1", i, seqs);
      u32();  // its sequence
    }
    const std::uint32_t v_trans = u32(), n_layer = u32();
    layers = {v_trans, n_layer};
    if (why.empty() && (v_trans > 1 || n_layer == 0 || n_layer > 4096))
      return fmt::format("V transposed {} and {} layers at byte {}", v_trans, n_layer, at - 8);
    for (std::uint32_t l = 0; l < n_layer && why.empty(); ++l) {  // K: type, row size, rows
      const std::uint32_t type = u32();
      const std::uint64_t row = u64();
      layers.insert(layers.end(), {type, row});
      if (why.empty() && row > (bytes.size() - at) / cells)
        return fmt::format("layer {}'s K rows of {} bytes overrun the state", l, row);
      take(static_cast<std::size_t>(row) * cells, nullptr);
    }
    for (std::uint32_t l = 0; l < n_layer && why.empty(); ++l) {  // V: per cell rows, or per channel cells
      const std::uint32_t type = u32();
      const std::uint64_t element = v_trans != 0 ? u32() : u64();
      const std::uint64_t width = v_trans != 0 ? u32() : 1;
      layers.insert(layers.end(), {type, element, width});
      if (why.empty() && (element == 0 || width == 0 || element * width > (bytes.size() - at) / cells))
        return fmt::format("layer {}'s V of {} x {} bytes per cell overruns the state", l, width, element);
      take(static_cast<std::size_t>(element * width) * cells, nullptr);
    }
  }
  if (!why.empty()) return why;
  if (out.positions.empty()) return "holds no cache";
  return {};
}

}  // namespace kvfuse::llamacpp::detail
