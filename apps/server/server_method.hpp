#pragma once
// kvfuse-server's fusion method: what --method or a request's kvfuse.method names, refused by name where the batched
// engine cannot run it, and --method auto, the calibration gate's choice for the model and chunk context.

#include <algorithm>
#include <cstdint>
#include <exception>
#include <filesystem>
#include <fstream>
#include <optional>
#include <string>
#include <string_view>
#include <system_error>
#include <variant>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "kvfuse/core/error.hpp"
#include "kvfuse/fusion/calibration.hpp"
#include "kvfuse/fusion/fusion_method.hpp"
#include "kvfuse/harness/calibrate.hpp"

namespace kvfuse_server {

// A method the server runs on `engine`; kvfuse::error naming what the batched engine cannot do.
inline kvfuse::FusionMethod server_method(std::string_view text, std::string_view engine) {
  const kvfuse::FusionMethod m = kvfuse::parse_method(text);
  kvfuse::require(engine != "llamacpp" || !(std::holds_alternative<kvfuse::CacheBlend>(m) ||
                                            std::holds_alternative<kvfuse::QueryAware>(m) ||
                                            std::holds_alternative<kvfuse::QueryProbe>(m)),
                  "fusion method '{}': it changes the recomputed rows per layer, which one llama_decode per step "
                  "cannot (--engine llamacpp runs full, naive and attnlink)",
                  text);
  kvfuse::require(engine != "llamacpp" || !std::holds_alternative<kvfuse::CacheCraft>(m),
                  "fusion method '{}': Cache-Craft's variants are profiled from attention statistics, which the "
                  "llama.cpp engine does not report per request (--engine llamacpp runs full, naive and attnlink)",
                  text);
  kvfuse::require(!std::holds_alternative<kvfuse::PrefixCaching>(m),
                          "fusion method '{}': the server stores chunk caches only, no prefix-cache entries on chunk "
                          "boundaries (a prompt without content parts is prefix-cached by Cake: --prefix-cache)",
                          text);
  const auto* blend = std::get_if<kvfuse::CacheBlend>(&m);
  kvfuse::require(blend == nullptr || !blend->loading_controller,
                          "fusion method '{}': CacheBlend's loading controller runs in FusionPipeline, not in the "
                          "batched engine; give r (cacheblend@0.15)",
                          text);
  return m;
}

// --method auto: the per-model correctness gate's choice (fusion/calibration.hpp) among the families the engine
// runs (CPU: CacheBlend, AttnLink, QueryAware, QueryProbe; llama.cpp: AttnLink): per family the newest calibration
// kvfuse-rag-eval --calibrated cached for this model at the default budget and measured with chunk caches behind
// the server's chunk context (a calibration of caches computed alone says nothing of caches behind the system
// turn, and the other way round), then the admitted setting that recomputes least (cheapest_admitted).
// `dir`: <kvfuse cache>/calibration. `why` says where the choice came from.
inline kvfuse::FusionMethod auto_method(const std::filesystem::path& dir, std::uint64_t fingerprint,
                                        std::string_view engine, std::string_view chunk_context, std::string& why) {
  namespace fs = std::filesystem;
  std::vector<kvfuse::Calibration> calibrations;
  std::vector<std::string> read;
  const std::vector<std::string> families =
      engine == "llamacpp" ? std::vector<std::string>{"attnlink"}
                           : std::vector<std::string>{"cacheblend", "attnlink", "queryaware", "queryprobe"};
  for (const std::string& family : families) {
    const std::string prefix = fmt::format("{:016x}-{}-", fingerprint, family);
    std::vector<fs::path> files;
    std::error_code ec;
    for (const auto& entry : fs::directory_iterator(dir, ec)) {
      const std::string name = entry.path().filename().string();
      if (name.starts_with(prefix) && name.ends_with(".calibration")) files.push_back(entry.path());
    }
    std::sort(files.begin(), files.end(), [](const fs::path& a, const fs::path& b) {
      std::error_code e1, e2;
      return fs::last_write_time(a, e1) > fs::last_write_time(b, e2);
    });
    for (const fs::path& path : files) {
      std::ifstream in(path);
      std::string line;
      std::optional<std::uint64_t> samples;
      while (std::getline(in, line)) {
        if (!line.starts_with("samples ")) continue;
        try {
          samples = std::stoull(line.substr(8), nullptr, 16);
        } catch (const std::exception&) {
        }
        break;
      }
      if (!samples) continue;
      try {
        calibrations.push_back(
            kvfuse::eval::load_calibration(path, fingerprint, family, kvfuse::CalibrationBudget{}, *samples,
                                           chunk_context));
        read.push_back(path.string());
        break;
      } catch (const kvfuse::error&) {  // another budget or chunk context, an older version, unreadable: the next
      }
    }
  }
  if (calibrations.empty() && engine == "llamacpp") {
    why = fmt::format("no AttnLink calibration cached for this model and chunk context '{}' (kvfuse-rag-eval "
                      "--calibrated): Epic's default k = 16",
                      chunk_context);
    return kvfuse::parse_method("attnlink");
  }
  if (calibrations.empty()) {
    why = fmt::format("no calibration cached for this model and chunk context '{}' (kvfuse-rag-eval --calibrated "
                      "--chunk-context {}): CacheBlend's default r = 15 %",
                      chunk_context, chunk_context);
    return kvfuse::parse_method("cacheblend");
  }
  const std::optional<std::string> choice = kvfuse::cheapest_admitted(calibrations);
  if (!choice) {
    why = fmt::format("the calibration gate refused every family it measured for this model ({}): full prefill",
                      fmt::join(read, ", "));
    return kvfuse::FullRecompute{};
  }
  why = fmt::format("calibrated ({})", fmt::join(read, ", "));
  return server_method(*choice, engine);
}

}  // namespace kvfuse_server
