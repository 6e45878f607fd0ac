#pragma once
// The hand-over between FusionPipeline's layer-pipelined loader (an I/O thread reading stored chunk KV one
// layer at a time) and the engine's thread (which takes layer l in its per-layer hook), following Cache-Craft
// Algorithm 2: layers 0 .. L_p − 1 are read before layer 0 computes, layer j is read once layer j − L_p − 1 is
// computed, so at most L_p + 1 layers wait in the buffer.

#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "kvfuse/core/types.hpp"

namespace kvfuse::detail {

// One stored entry read per layer: layer l is payload bytes [l · layer_bytes, (l + 1) · layer_bytes).
struct LayerStream {
  std::size_t chunk = 0;  // index of its chunk in the plan
  KVKey key;
  KVBlockInfo info;
  std::size_t layer_bytes = 0;
};

// Thrown by the per-layer hook to stop a prefill whose layer reads failed; FusionPipeline catches it.
struct LayerReadFailed {};

class LayerPipe {
 public:
  using Layer = std::vector<std::vector<std::byte>>;  // one byte string per stream

  explicit LayerPipe(std::size_t layers) : staged_(layers), ready_(layers, false), read_ms_(layers, 0.0) {}

  // I/O thread: blocks until layer l may be read (l <= the engine's layer + depth); false once stopped or failed.
  bool wait_to_read(std::int64_t l, std::int64_t depth) {
    std::unique_lock lock(m_);
    cv_.wait(lock, [&] { return stop_ || !failures_.empty() || l <= at_ + depth; });
    return !stop_ && failures_.empty();
  }

  // I/O thread: which stream it reads now (named if the engine gives up waiting for it); false once stopped or
  // failed (read nothing more).
  bool reading(std::size_t stream) {
    std::lock_guard lock(m_);
    current_ = stream;
    return !stop_ && failures_.empty();
  }

  void publish(std::int64_t l, Layer layer, double read_ms) {
    std::lock_guard lock(m_);
    staged_[static_cast<std::size_t>(l)] = std::move(layer);
    read_ms_[static_cast<std::size_t>(l)] = read_ms;
    ready_[static_cast<std::size_t>(l)] = true;
    cv_.notify_all();
  }

  // I/O thread: a read failed. Ignored once the engine stopped waiting (it already failed this stream).
  void fail(std::size_t stream, std::string why) {
    std::lock_guard lock(m_);
    if (stop_) return;
    failures_.emplace_back(stream, std::move(why));
    cv_.notify_all();
  }

  // Engine thread, before computing layer l (layers < l are computed): waits until layers up to `until` (>= l)
  // are read, then moves layer l out. False when a read failed, or none arrived within timeout_ms (> 0): the
  // stream being read is then failed.
  bool take(std::int64_t l, std::int64_t until, double timeout_ms, Layer& out) {
    std::unique_lock lock(m_);
    at_ = l;
    cv_.notify_all();
    const auto arrived = [&] { return !failures_.empty() || ready_[static_cast<std::size_t>(until)]; };
    if (timeout_ms > 0.0) {
      if (!cv_.wait_for(lock, std::chrono::duration<double, std::milli>(timeout_ms), arrived)) {
        failures_.emplace_back(current_, fmt::format("layer {} did not arrive within {} ms", until, timeout_ms));
        stop_ = true;
        cv_.notify_all();
        return false;
      }
    } else {
      cv_.wait(lock, arrived);
    }
    if (!failures_.empty()) return false;
    out = std::move(staged_[static_cast<std::size_t>(l)]);
    return true;
  }

  void stop() {
    std::lock_guard lock(m_);
    stop_ = true;
    cv_.notify_all();
  }

  // After the I/O thread has been joined.
  [[nodiscard]] std::vector<std::pair<std::size_t, std::string>>& failures() noexcept { return failures_; }
  [[nodiscard]] double read_ms(std::size_t l) const noexcept { return read_ms_[l]; }

 private:
  std::mutex m_;
  std::condition_variable cv_;
  std::vector<Layer> staged_;
  std::vector<bool> ready_;
  std::vector<double> read_ms_;
  std::int64_t at_ = 0;
  std::size_t current_ = 0;
  bool stop_ = false;
  std::vector<std::pair<std::size_t, std::string>> failures_;
};

}  // namespace kvfuse::detail
