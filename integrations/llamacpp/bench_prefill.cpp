// kvfuse-bench-prefill: the time of a full prefill of N tokens on kvfuse's reference CPU backend (CpuLlama) or on
// llama.cpp, same GGUF file, same tokens, same thread count; scripts/bench_llamacpp.sh runs both side by side.
//
//   kvfuse-bench-prefill --engine kvfuse|llamacpp --model GGUF --tokens N [--threads 2] [--reps 3]
//                        [--block-rows 0] [--data musique_dev.json]
//
// The prompt: the passages of the MuSiQue file (every entry's ctxs[].text in order, joined by "\n") tokenized with
// kvfuse's Tokenizer (BOS first when the vocabulary adds one, control-token text not parsed), cut to exactly N
// tokens. Both engines get these token ids.
// A prefill computes the KV of tokens 0 .. N-1 at positions 0 .. N-1 from an empty cache, and the logits of the
// last token only:
//   kvfuse    CpuLlama::full_prefill into a fresh LlamaKVCache (fp32); CpuLlamaOptions::threads = T,
//             prefill_block_rows = --block-rows (0: all rows in one pass; 512: llama.cpp's batches),
//             allow_beyond_context when N exceeds the model's trained context
//   llamacpp  llama_decode of 512-token batches (n_ctx = N, n_batch = n_ubatch = 512, n_threads = n_threads_batch
//             = T, llama.cpp's defaults otherwise: f16 KV, flash attention "auto") after
//             llama_memory_clear(llama_get_memory(ctx), true)
// Loading the model is not timed. One warm-up prefill, then R timed ones (steady_clock). Prints one JSON line:
//   {"engine", "tokens", "threads", "block_rows", "ms": [per rep], "median_ms", "tokens_per_s": N / median,
//    "peak_rss_mib"}  (block_rows: kvfuse's --block-rows; llama.cpp's n_batch, 512)
// peak_rss_mib is the process's VmHWM (/proc/self/status) at the end, so run each engine in its own process.
//
// --decode-cost (llamacpp only): what one llama_decode costs beyond its rows, the figure behind
// LlamaCppOptions::run_cost_rows. After the prefill of the N tokens (flash attention off, as LlamaCppFusion runs),
// m rows at positions N .. N+m-1 are decoded after dropping the last ones, m = 1, 4, 16, 64, 256, 512; one warm-up,
// then R timed decodes each. Prints one JSON line per m, {"engine", "context": N, "rows": m, "ms": [...],
// "median_ms"}, then {"engine", "context", "row_ms", "fixed_ms", "run_cost_rows"}: row_ms = (t(512) − t(1)) / 511
// from the medians, fixed_ms = t(1) − row_ms, run_cost_rows = fixed_ms / row_ms.
//
// The default --data is ../shared/data/musique_dev.json beside the source tree. Errors print
// "kvfuse-bench-prefill: <message>" on stderr, exit 2.

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <fstream>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <llama.h>
#include <nlohmann/json.hpp>

#include "kvfuse/cpu.hpp"
#include "kvfuse/harness/bench_build.hpp"
#include "kvfuse/harness/metrics.hpp"

#include "musique.hpp"

namespace {

using kvfuse::require;
using Clock = std::chrono::steady_clock;

constexpr std::string_view kUsage =
    "usage: kvfuse-bench-prefill --engine kvfuse|llamacpp --model GGUF --tokens N [--threads 2] [--reps 3] "
    "[--block-rows 0] [--data musique_dev.json] [--decode-cost]";
constexpr std::int32_t kBatch = 512;

struct Args {
  std::string engine;
  std::string model;
  std::string data = KVFUSE_SOURCE_DIR "/../shared/data/musique_dev.json";
  std::int64_t tokens = 0;
  int threads = 2;
  int reps = 3;
  std::int64_t block_rows = 0;  // kvfuse: CpuLlamaOptions::prefill_block_rows
  bool decode_cost = false;
};

// A flag's integer in [lo, hi] (kvfuse_example::parse_int reads it).
std::int64_t parse_int(std::string_view flag, std::string_view s, std::int64_t lo, std::int64_t hi) {
  const std::int64_t v = kvfuse_example::parse_int(flag, s);
  require(v >= lo && v <= hi, "{}: {} is not in [{}, {}]", flag, v, lo, hi);
  return v;
}

Args parse_args(int argc, char** argv) {
  Args a;
  const auto value = [&](int& i, std::string_view flag) -> std::string_view {
    require(i + 1 < argc, "{} needs a value\n{}", flag, kUsage);
    return argv[++i];
  };
  for (int i = 1; i < argc; ++i) {
    const std::string_view f = argv[i];
    if (f == "--engine") {
      a.engine = value(i, f);
    } else if (f == "--model") {
      a.model = value(i, f);
    } else if (f == "--data") {
      a.data = value(i, f);
    } else if (f == "--tokens") {
      a.tokens = parse_int(f, value(i, f), 1, 1 << 20);
    } else if (f == "--threads") {
      a.threads = static_cast<int>(parse_int(f, value(i, f), 1, 1024));
    } else if (f == "--reps") {
      a.reps = static_cast<int>(parse_int(f, value(i, f), 1, 1000));
    } else if (f == "--block-rows") {
      a.block_rows = parse_int(f, value(i, f), 0, 1 << 20);
    } else if (f == "--decode-cost") {
      a.decode_cost = true;
    } else if (f == "--help" || f == "-h") {
      fmt::print("{}\n", kUsage);
      std::exit(0);
    } else {
      require(false, "unknown flag '{}'\n{}", f, kUsage);
    }
  }
  require(a.engine == "kvfuse" || a.engine == "llamacpp", "--engine must be kvfuse or llamacpp\n{}", kUsage);
  require(!a.model.empty() && a.tokens > 0, "--model and --tokens are required\n{}", kUsage);
  require(!a.decode_cost || a.engine == "llamacpp", "--decode-cost measures llama.cpp: needs --engine llamacpp");
  require(a.block_rows == 0 || a.engine == "kvfuse", "--block-rows sets kvfuse's prefill blocks: needs --engine kvfuse");
  return a;
}

// The first n tokens of the MuSiQue passages (see the header).
std::vector<kvfuse::token_id> make_prompt(const kvfuse::GGUFFile& file, const std::string& data, std::int64_t n) {
  const nlohmann::json doc = kvfuse_example::read_dataset(data);
  std::string text;
  for (const nlohmann::json& entry : doc) {
    require(entry.is_object() && entry.contains("ctxs") && entry["ctxs"].is_array(),
            "--data: an entry of '{}' has no \"ctxs\" array", data);
    for (const nlohmann::json& ctx : entry["ctxs"]) {
      require(ctx.is_object() && ctx.contains("text") && ctx["text"].is_string(),
              "--data: a ctx of '{}' has no \"text\" string", data);
      text += ctx["text"].get<std::string>();
      text += '\n';
    }
    // About 4 bytes per token: stop once the text surely holds n tokens.
    if (static_cast<std::int64_t>(text.size()) > 8 * n + 4096) break;
  }
  std::vector<kvfuse::token_id> tokens =
      kvfuse::Tokenizer::from_gguf(file).tokenize(text, /*add_special=*/true, /*parse_special=*/false);
  require(static_cast<std::int64_t>(tokens.size()) >= n, "--data: '{}' holds {} tokens, fewer than --tokens {}", data,
          tokens.size(), n);
  tokens.resize(static_cast<std::size_t>(n));
  return tokens;
}

// Milliseconds of `prefill`, once untimed, then `reps` times; `reset` (not timed) runs before each.
std::vector<double> time_reps(int reps, const std::function<void()>& reset, const std::function<void()>& prefill) {
  reset();
  prefill();
  std::vector<double> ms;
  for (int r = 0; r < reps; ++r) {
    reset();
    const auto t0 = Clock::now();
    prefill();
    ms.push_back(std::chrono::duration<double, std::milli>(Clock::now() - t0).count());
  }
  return ms;
}

std::vector<double> bench_kvfuse(const Args& a, const kvfuse::GGUFFile& file,
                                 std::span<const kvfuse::token_id> tokens) {
  const std::int64_t context = kvfuse::LlamaConfig::from_gguf(file).context_length;
  const kvfuse::CpuLlama model = kvfuse::CpuLlama::from_gguf(
      file, {.threads = a.threads,
             .allow_beyond_context = context > 0 && a.tokens > context,
             .prefill_block_rows = a.block_rows});
  return time_reps(
      a.reps, [] {},
      [&] {
        const kvfuse::LlamaPrefill out = model.full_prefill(tokens);
        require(!out.logits.empty(), "kvfuse: full_prefill returned no logits");
      });
}

// llama.cpp's log below errors is dropped.
void quiet_log(ggml_log_level level, const char* text, void* /*user_data*/) {
  if (level == GGML_LOG_LEVEL_ERROR) std::fputs(text, stderr);
}

struct Batch {
  llama_batch b = llama_batch_init(kBatch, 0, 1);
  Batch() = default;
  Batch(const Batch&) = delete;
  Batch& operator=(const Batch&) = delete;
  ~Batch() { llama_batch_free(b); }
};

// Decodes tokens [from, to) of `tokens` at their positions in sequence 0, in batches of kBatch; logits of the last.
void decode_range(llama_context* ctx, llama_batch& b, std::span<const kvfuse::token_id> tokens, std::int32_t from,
                  std::int32_t to) {
  for (std::int32_t done = from; done < to; done += b.n_tokens) {
    b.n_tokens = std::min(kBatch, to - done);
    for (std::int32_t i = 0; i < b.n_tokens; ++i) {
      b.token[i] = tokens[static_cast<std::size_t>(done + i)];
      b.pos[i] = done + i;
      b.n_seq_id[i] = 1;
      b.seq_id[i][0] = 0;
      b.logits[i] = done + i + 1 == to;
    }
    const std::int32_t rc = llama_decode(ctx, b);
    require(rc == 0, "llama_decode of tokens [{}, {}) returned {}", done, done + b.n_tokens, rc);
  }
  llama_synchronize(ctx);
}

using ModelPtr = std::unique_ptr<llama_model, decltype(&llama_model_free)>;
using ContextPtr = std::unique_ptr<llama_context, decltype(&llama_free)>;

ModelPtr load_llamacpp(const Args& a) {
  llama_log_set(quiet_log, nullptr);
  llama_backend_init();
  ModelPtr model(llama_model_load_from_file(a.model.c_str(), llama_model_default_params()), &llama_model_free);
  require(model != nullptr, "llama.cpp cannot load '{}'", a.model);
  return model;
}

ContextPtr make_context(const Args& a, llama_model* model, std::uint32_t cells, bool flash_attention_off) {
  llama_context_params cp = llama_context_default_params();
  cp.n_ctx = cells;
  cp.n_batch = kBatch;
  cp.n_ubatch = kBatch;
  cp.n_threads = a.threads;
  cp.n_threads_batch = a.threads;
  if (flash_attention_off) cp.flash_attn_type = LLAMA_FLASH_ATTN_TYPE_DISABLED;
  ContextPtr ctx(llama_init_from_model(model, cp), &llama_free);
  require(ctx != nullptr, "llama.cpp cannot make a context of {} cells for '{}'", cells, a.model);
  return ctx;
}

std::vector<double> bench_llamacpp(const Args& a, std::span<const kvfuse::token_id> tokens) {
  const ModelPtr model = load_llamacpp(a);
  const ContextPtr ctx = make_context(a, model.get(), static_cast<std::uint32_t>(a.tokens), false);
  Batch batch;
  const auto n = static_cast<std::int32_t>(tokens.size());
  return time_reps(
      a.reps, [&] { llama_memory_clear(llama_get_memory(ctx.get()), true); },
      [&] { decode_range(ctx.get(), batch.b, tokens, 0, n); });
}

using kvfuse::eval::median;

// --decode-cost (see the header): the prompt's tokens are the context, the rows decoded after it repeat its first
// tokens (their values do not change the time).
int bench_decode_cost(const Args& a, std::vector<kvfuse::token_id> tokens) {
  const ModelPtr model = load_llamacpp(a);
  const ContextPtr ctx = make_context(a, model.get(), static_cast<std::uint32_t>(a.tokens) + kBatch, true);
  Batch batch;
  const auto n = static_cast<std::int32_t>(tokens.size());
  for (std::int32_t i = 0; i < kBatch; ++i) tokens.push_back(tokens[static_cast<std::size_t>(i % n)]);
  decode_range(ctx.get(), batch.b, tokens, 0, n);
  llama_memory_t mem = llama_get_memory(ctx.get());
  std::vector<std::pair<std::int32_t, double>> medians;
  for (const std::int32_t m : {1, 4, 16, 64, 256, 512}) {
    const std::vector<double> ms = time_reps(
        a.reps, [&] { require(llama_memory_seq_rm(mem, 0, n, -1), "llama_memory_seq_rm refused"); },
        [&] { decode_range(ctx.get(), batch.b, tokens, n, n + m); });
    medians.emplace_back(m, median(ms));
    fmt::print("{{\"engine\":\"llamacpp\",\"context\":{},\"rows\":{},\"ms\":[{:.3f}],\"median_ms\":{:.3f}}}\n", n, m,
               fmt::join(ms, ","), medians.back().second);
  }
  const double row_ms = (medians.back().second - medians.front().second) / (kBatch - 1);
  const double fixed_ms = medians.front().second - row_ms;
  fmt::print("{{\"engine\":\"llamacpp\",\"context\":{},\"row_ms\":{:.3f},\"fixed_ms\":{:.3f},\"run_cost_rows\":{:.2f}}}\n",
             n, row_ms, fixed_ms, fixed_ms / row_ms);
  return 0;
}


// VmHWM of /proc/self/status in MiB.
double peak_rss_mib() {
  std::ifstream in("/proc/self/status");
  for (std::string line; std::getline(in, line);) {
    if (line.starts_with("VmHWM:")) return std::stod(line.substr(6)) / 1024.0;  // kB
  }
  throw kvfuse::error("/proc/self/status has no VmHWM line");
}

int run(const Args& a) {
  const kvfuse::GGUFFile file = kvfuse::GGUFFile::open(a.model);
  const std::vector<kvfuse::token_id> tokens = make_prompt(file, a.data, a.tokens);
  if (a.decode_cost) return bench_decode_cost(a, tokens);
  const std::vector<double> ms = a.engine == "kvfuse" ? bench_kvfuse(a, file, tokens) : bench_llamacpp(a, tokens);
  const double med = median(ms);
  fmt::print(
      "{{\"engine\":\"{}\",\"tokens\":{},\"threads\":{},\"block_rows\":{},\"ms\":[{:.3f}],\"median_ms\":{:.3f},"
      "\"tokens_per_s\":{:.2f},\"peak_rss_mib\":{:.1f}{}}}\n",
      a.engine, a.tokens, a.threads, a.engine == "kvfuse" ? a.block_rows : kBatch, fmt::join(ms, ","), med,
      static_cast<double>(a.tokens) / (med / 1000.0), peak_rss_mib(),
      // the instruction sets llama.cpp was built with (its build, not the machine's: see bench_llamacpp.sh)
      a.engine == "kvfuse" ? "" : ",\"system_info\":" + nlohmann::json(llama_print_system_info()).dump());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  kvfuse::harness::refuse_check_only_build("kvfuse-bench-prefill");
  try {
    return run(parse_args(argc, argv));
  } catch (const std::exception& e) {
    std::fflush(stdout);
    fmt::print(stderr, "kvfuse-bench-prefill: {}\n", e.what());
    return 2;
  }
}
