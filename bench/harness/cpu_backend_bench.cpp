// kvfuse-cpu-bench: throughput of the reference CPU backend (CpuLlama) on a real model, next to an Eigen GEMM
// measured in the same run, the cost of partial prefill relative to full prefill, and peak memory.
//
//   kvfuse-cpu-bench --model GGUF [--data musique_dev.json] [--repeats 3] [--threads T] [--sizes 512,2048,5632]
//
// Prompts: real text. The passages of the MuSiQue file (every question's ctxs, in order, joined by "\n") are
// tokenized with kvfuse's tokenizer and cut to n − q tokens, followed by q question tokens
// "\nQuestion: {question of the first entry}<|im_end|>\n<|im_start|>assistant\n": exactly n tokens each.
//
// Measured, each --repeats times (median reported), in this order per repeat and size n:
//   GEMM        y = x Wᵀ, x [n][n_embd], W [n_ff][n_embd] (the largest projections: ffn_gate / ffn_up; ffn_down
//               has the same size transposed), fp32 Eigen, split over output features on the backend's thread
//               count exactly as the backend splits its projections, repeated for 1 s; 2 · n · n_embd · n_ff
//               FLOPs.
//   full        CpuLlama::full_prefill of the n tokens. FLOPs counted (useful work, masked products excluded):
//                 matmuls    2 · n · P_layers + 2 · n_embd · n_vocab   (P_layers = parameters of the L blocks'
//                            projections; the output head runs for the last token only)
//                 attention  4 · head_dim · n_head · L · n(n+1)/2      (QKᵀ and PV over the causal triangle)
//   partial r   CpuLlama::partial_prefill on a copy of the full prefill's KV: layer 0 computes every row, then
//               from layer 1 on a fixed set S = round(r · (n − q)) context rows spread evenly over the context
//               plus the q question rows (CacheBlend's shape: full first layer, then the selected tokens).
//               Reported relative to `full` of the same repeat (median of the per-repeat ratios), next to the
//               ratio of counted FLOPs.
// Peak memory: getrusage(RUSAGE_SELF).ru_maxrss after loading the model and after the first full prefill at
// the largest size.
//
// The default --data is ../shared/data/musique_dev.json relative to the source tree (KVFUSE_SOURCE_DIR when
// the build defines it, else the working directory). Errors print "kvfuse-cpu-bench: <message>", exit 2.

#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <sstream>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include <Eigen/Core>
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "kvfuse/cpu.hpp"
#include "kvfuse/harness/bench_build.hpp"
#include "kvfuse/harness/metrics.hpp"

namespace {

using kvfuse::require;
using Clock = std::chrono::steady_clock;

#ifdef KVFUSE_SOURCE_DIR
constexpr const char* kDefaultData = KVFUSE_SOURCE_DIR "/../shared/data/musique_dev.json";
#else
constexpr const char* kDefaultData = "../shared/data/musique_dev.json";
#endif

constexpr std::string_view kUsage =
    "usage: kvfuse-cpu-bench --model GGUF [--data musique_dev.json] [--repeats 3] [--threads T] "
    "[--sizes 512,2048,5632]";


// ---------------------------------------------------------------------------------------- arguments

struct Args {
  std::string model;
  std::string data = kDefaultData;
  int repeats = 3;
  int threads = 0;
  std::vector<std::int64_t> sizes{512, 2048, 5632};
};

std::int64_t parse_int(std::string_view s, std::int64_t lo, std::int64_t hi, std::string_view what) {
  std::int64_t v = 0;
  bool ok = !s.empty() && s.size() <= 12;
  for (const char c : s) ok = ok && c >= '0' && c <= '9';
  if (ok)
    for (const char c : s) v = v * 10 + (c - '0');
  require(ok && v >= lo && v <= hi, "{} '{}' is not an integer in [{}, {}]", what, s, lo, hi);
  return v;
}

Args parse_args(int argc, char** argv) {
  Args a;
  const auto value = [&](int& i, std::string_view flag) -> std::string {
    require(i + 1 < argc, "{} needs a value\n{}", flag, kUsage);
    return argv[++i];
  };
  for (int i = 1; i < argc; ++i) {
    const std::string_view f = argv[i];
    if (f == "--model") {
      a.model = value(i, f);
    } else if (f == "--data") {
      a.data = value(i, f);
    } else if (f == "--repeats") {
      a.repeats = static_cast<int>(parse_int(value(i, f), 1, 1000, "--repeats"));
    } else if (f == "--threads") {
      a.threads = static_cast<int>(parse_int(value(i, f), 0, 1024, "--threads"));
    } else if (f == "--sizes") {
      const std::string list = value(i, f);
      a.sizes.clear();
      std::stringstream ss(list);
      for (std::string item; std::getline(ss, item, ',');)
        a.sizes.push_back(parse_int(item, 64, 1 << 20, "--sizes: item"));
      std::sort(a.sizes.begin(), a.sizes.end());
      require(!a.sizes.empty(), "--sizes '{}' names no size", list);
    } else if (f == "--help" || f == "-h") {
      fmt::print("{}\n", kUsage);
      std::exit(0);
    } else {
      require(false, "unknown flag '{}'\n{}", f, kUsage);
    }
  }
  require(!a.model.empty(), "--model is required\n{}", kUsage);
  return a;
}

// ---------------------------------------------------------------------------------------- measurement

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

using kvfuse::eval::median;

// "median (min–max)" of v with the given precision.
std::string spread(const std::vector<double>& v, int digits) {
  const auto [lo, hi] = std::minmax_element(v.begin(), v.end());
  return fmt::format("{:.{}f} ({:.{}f}–{:.{}f})", median(v), digits, *lo, digits, *hi, digits);
}

double max_rss_mib() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return static_cast<double>(u.ru_maxrss) / 1024.0;  // Linux: KiB
}

// Seconds of one y = x Wᵀ ([n][e] x [f][e]ᵀ) in Eigen, split over W's rows on `threads` threads like CpuLlama's
// projections (a thread per part, started for each product); repeated until 1 s has passed, the mean per product.
double gemm_seconds(int threads, std::int64_t n, std::int64_t e, std::int64_t f) {
  using M = kvfuse::RowMatrix;
  const M x = M::Random(n, e);
  const M w = M::Random(f, e);
  M y(n, f);
  const std::int64_t tasks = threads;
  const auto part = [&](std::int64_t t) {
    const std::int64_t c0 = f * t / tasks;
    const std::int64_t c1 = f * (t + 1) / tasks;
    y.middleCols(c0, c1 - c0).noalias() = x * w.middleRows(c0, c1 - c0).transpose();
  };
  const auto once = [&] {
    std::vector<std::thread> others;
    for (std::int64_t t = 1; t < tasks; ++t) others.emplace_back(part, t);
    part(0);
    for (std::thread& th : others) th.join();
  };
  once();  // warm-up
  int count = 0;
  const auto t0 = Clock::now();
  do {
    once();
    ++count;
  } while (seconds_since(t0) < 1.0);
  const double s = seconds_since(t0) / count;
  require(std::isfinite(y.sum()), "GEMM produced a value that is not finite");
  return s;
}

struct FlopModel {
  double layer_params = 0;  // P_layers: projection parameters of all blocks
  double head_params = 0;   // n_embd · n_vocab
  double attn_unit = 0;     // 4 · head_dim · n_head: FLOPs per (query, key) pair per layer

  explicit FlopModel(const kvfuse::LlamaConfig& c) {
    const double e = static_cast<double>(c.n_embd);
    const double per_layer = e * static_cast<double>(c.q_dim()) * 2 + e * static_cast<double>(c.kv_dim()) * 2 +
                             e * static_cast<double>(c.n_ff) * 3;
    layer_params = per_layer * static_cast<double>(c.n_layer);
    head_params = e * static_cast<double>(c.n_vocab);
    attn_unit = 4.0 * static_cast<double>(c.head_dim) * static_cast<double>(c.n_head);
  }
};

// Counted FLOPs of a prefill where layer l computes the rows rows_of(l) (their positions = row indices).
double prefill_flops(const FlopModel& fm, std::int64_t n_layer, std::int64_t n, const kvfuse::TokenSet& later_rows) {
  const auto dn = static_cast<double>(n);
  const double full_pairs = dn * (dn + 1) / 2;
  double later_pairs = 0;
  for (const std::int64_t r : later_rows) later_pairs += static_cast<double>(r + 1);
  const double per_layer = fm.layer_params / static_cast<double>(n_layer);
  const double layer0 = 2 * dn * per_layer + fm.attn_unit * full_pairs;
  const double later = 2 * static_cast<double>(later_rows.size()) * per_layer + fm.attn_unit * later_pairs;
  return layer0 + static_cast<double>(n_layer - 1) * later + 2 * fm.head_params;
}

// ---------------------------------------------------------------------------------------- prompts

struct Corpus {
  std::vector<kvfuse::token_id> context;   // every passage, tokenized as one text
  std::vector<kvfuse::token_id> question;  // the question tail
};

Corpus load_corpus(const std::string& path, const kvfuse::Tokenizer& tok, std::int64_t max_context) {
  require(std::filesystem::is_regular_file(path),
          "--data: '{}' is not a file (the MuSiQue dev set: ../shared/data/musique_dev.json from the repository "
          "root; pass --data PATH)",
          path);
  std::ifstream in(path);
  nlohmann::json doc;
  try {
    doc = nlohmann::json::parse(in);
  } catch (const nlohmann::json::exception& e) {
    throw kvfuse::error(fmt::format("--data: '{}' is not valid JSON: {}", path, e.what()));
  }
  require(doc.is_array() && !doc.empty(), "--data: '{}' is not a non-empty JSON array", path);
  Corpus c;
  std::string text;
  for (const nlohmann::json& entry : doc) {
    require(entry.is_object() && entry.contains("ctxs") && entry["ctxs"].is_array(),
            "--data: an entry of '{}' has no \"ctxs\" array", path);
    for (const nlohmann::json& ctx : entry["ctxs"]) {
      require(ctx.is_object() && ctx.contains("text") && ctx["text"].is_string(),
              "--data: a ctx of '{}' has no \"text\" string", path);
      text += ctx["text"].get<std::string>();
      text += '\n';
    }
    // Tokens per byte is ~0.25; stop once the text surely holds enough tokens.
    if (static_cast<std::int64_t>(text.size()) > 8 * max_context + 4096) break;
  }
  c.context = tok.encode(text, /*parse_special=*/false);
  const nlohmann::json& first = doc.front();
  require(first.contains("question") && first["question"].is_string(),
          "--data: the first entry of '{}' has no \"question\"", path);
  c.question = tok.encode(
      fmt::format("\nQuestion: {}<|im_end|>\n<|im_start|>assistant\n", first["question"].get<std::string>()));
  require(static_cast<std::int64_t>(c.context.size() + c.question.size()) >= max_context,
          "--data: '{}' holds {} context tokens, fewer than the {} a prompt needs", path, c.context.size(),
          max_context);
  return c;
}

std::vector<kvfuse::token_id> make_prompt(const Corpus& c, std::int64_t n) {
  const auto q = static_cast<std::int64_t>(c.question.size());
  require(n > q, "--sizes: {} tokens leave no room for the {}-token question", n, q);
  std::vector<kvfuse::token_id> p(c.context.begin(), c.context.begin() + (n - q));
  p.insert(p.end(), c.question.begin(), c.question.end());
  return p;
}

// round(r · ctx) context rows spread evenly over [0, ctx), then the question rows [ctx, n).
kvfuse::TokenSet selected_rows(std::int64_t n, std::int64_t q, double r) {
  const std::int64_t ctx = n - q;
  const auto k = static_cast<std::int64_t>(std::llround(r * static_cast<double>(ctx)));
  kvfuse::TokenSet s;
  for (std::int64_t j = 0; j < k; ++j)
    s.push_back(
        static_cast<std::int64_t>((static_cast<double>(j) + 0.5) * static_cast<double>(ctx) / static_cast<double>(k)));
  for (std::int64_t row = ctx; row < n; ++row) s.push_back(row);
  return s;
}

// ---------------------------------------------------------------------------------------- main

std::string load_average() {
  double l[3] = {0, 0, 0};
  if (getloadavg(l, 3) != 3) return "unknown";
  return fmt::format("{:.2f} {:.2f} {:.2f}", l[0], l[1], l[2]);
}

int run(const Args& a) {
  const std::string load_before = load_average();
  const double rss_start = max_rss_mib();
  const auto t_load = Clock::now();
  const kvfuse::GGUFFile file = kvfuse::GGUFFile::open(a.model);
  const kvfuse::Tokenizer tok = kvfuse::Tokenizer::from_gguf(file);
  const kvfuse::CpuLlama model = kvfuse::CpuLlama::from_gguf(file, {.threads = a.threads});
  const double load_s = seconds_since(t_load);
  const double rss_loaded = max_rss_mib();

  const kvfuse::LlamaConfig& cfg = model.config();
  const FlopModel fm(cfg);
  const Corpus corpus = load_corpus(a.data, tok, a.sizes.back());
  const auto q = static_cast<std::int64_t>(corpus.question.size());
  const std::vector<double> ratios{0.05, 0.15, 0.30};

  std::map<std::int64_t, std::vector<double>> gemm_s, full_s;
  std::map<std::pair<std::int64_t, int>, std::vector<double>> part_s, part_ratio;
  double rss_prefill = 0;

  for (int rep = 0; rep < a.repeats; ++rep) {
    for (const std::int64_t n : a.sizes) {
      const std::vector<kvfuse::token_id> prompt = make_prompt(corpus, n);
      gemm_s[n].push_back(gemm_seconds(model.threads(), n, cfg.n_embd, cfg.n_ff));
      fmt::print(stderr, "repeat {} n {}: GEMM {:.1f} GFLOP/s\n", rep, n,
                 2.0 * static_cast<double>(n * cfg.n_embd * cfg.n_ff) / gemm_s[n].back() / 1e9);

      auto t0 = Clock::now();
      kvfuse::LlamaPrefill full = model.full_prefill(prompt);
      const double tf = seconds_since(t0);
      full_s[n].push_back(tf);
      if (rep == 0 && n == a.sizes.back()) rss_prefill = max_rss_mib();
      fmt::print(stderr, "repeat {} n {}: full prefill {:.2f} s\n", rep, n, tf);

      kvfuse::TokenSet all(static_cast<std::size_t>(n));
      for (std::int64_t i = 0; i < n; ++i) all[static_cast<std::size_t>(i)] = i;
      for (std::size_t k = 0; k < ratios.size(); ++k) {
        const kvfuse::TokenSet later = selected_rows(n, q, ratios[k]);
        kvfuse::LlamaKVCache merged = full.kv;
        const kvfuse::SelectionPolicy policy = [&later](const kvfuse::LayerReport&) { return later; };
        t0 = Clock::now();
        const kvfuse::PartialPrefillResult r = model.partial_prefill(prompt, merged, all, policy);
        const double tp = seconds_since(t0);
        require(r.logits.size() == full.logits.size(), "partial prefill returned {} logits", r.logits.size());
        part_s[{n, static_cast<int>(k)}].push_back(tp);
        part_ratio[{n, static_cast<int>(k)}].push_back(tp / tf);
        fmt::print(stderr, "repeat {} n {}: partial {:.0f} % {:.2f} s\n", rep, n, 100 * ratios[k], tp);
      }
    }
  }

  const std::string simd = Eigen::SimdInstructionSetsInUse();
  fmt::print(
      "kvfuse-cpu-bench: {} ({} layers, n_embd {}, n_ff {}, {} / {} heads, vocab {}), {} threads, "
      "Eigen {}.{}.{} ({}), median of {} repeats\n",
      std::filesystem::path(a.model).filename().string(), cfg.n_layer, cfg.n_embd, cfg.n_ff, cfg.n_head, cfg.n_head_kv,
      cfg.n_vocab, model.threads(), EIGEN_WORLD_VERSION, EIGEN_MAJOR_VERSION, EIGEN_MINOR_VERSION, simd, a.repeats);
  fmt::print(
      "prompt: MuSiQue passages + a {}-token question tail; model load {:.2f} s; load average {} before, "
      "{} after\n\n",
      q, load_s, load_before, load_average());

  fmt::print(
      "| tokens | full prefill s, median (min–max) | tokens/s | GFLOP (matmul + attention) | GFLOP/s | Eigen GEMM "
      "{}x{}x{} "
      "GFLOP/s, median (min–max) | prefill / GEMM |\n",
      "n", cfg.n_embd, cfg.n_ff);
  fmt::print("|---:|---:|---:|---:|---:|---:|---:|\n");
  for (const std::int64_t n : a.sizes) {
    const auto dn = static_cast<double>(n);
    const double matmul = 2 * dn * fm.layer_params + 2 * fm.head_params;
    const double attn = fm.attn_unit * static_cast<double>(cfg.n_layer) * dn * (dn + 1) / 2;
    const double tf = median(full_s[n]);
    const double gemm_flops = 2 * dn * static_cast<double>(cfg.n_embd * cfg.n_ff);
    std::vector<double> gemm_gflops, per_rep;
    for (std::size_t r = 0; r < full_s[n].size(); ++r) {
      gemm_gflops.push_back(gemm_flops / gemm_s[n][r] / 1e9);
      per_rep.push_back(((matmul + attn) / full_s[n][r]) / (gemm_flops / gemm_s[n][r]));
    }
    fmt::print("| {} | {} | {:.0f} | {:.1f} + {:.1f} | {:.1f} | {} | {:.2f} |\n", n, spread(full_s[n], 2), dn / tf,
               matmul / 1e9, attn / 1e9, (matmul + attn) / tf / 1e9, spread(gemm_gflops, 1), median(per_rep));
  }

  fmt::print(
      "\n| tokens | selected from layer 1 on | partial prefill s, median (min–max) | time / full prefill, median "
      "(min–max) | "
      "FLOPs / full prefill |\n");
  fmt::print("|---:|---:|---:|---:|---:|\n");
  for (const std::int64_t n : a.sizes) {
    kvfuse::TokenSet all(static_cast<std::size_t>(n));
    for (std::int64_t i = 0; i < n; ++i) all[static_cast<std::size_t>(i)] = i;
    const double full_flops = prefill_flops(fm, cfg.n_layer, n, all);
    for (std::size_t k = 0; k < ratios.size(); ++k) {
      const kvfuse::TokenSet later = selected_rows(n, q, ratios[k]);
      fmt::print("| {} | {:.0f} % of context ({} rows + {} question) | {} | {} | {:.3f} |\n", n, 100 * ratios[k],
                 later.size() - static_cast<std::size_t>(q), q, spread(part_s[{n, static_cast<int>(k)}], 2),
                 spread(part_ratio[{n, static_cast<int>(k)}], 3),
                 prefill_flops(fm, cfg.n_layer, n, later) / full_flops);
    }
  }

  fmt::print(
      "\nPeak memory (ru_maxrss): {:.0f} MiB at start, {:.0f} MiB after loading, {:.0f} MiB after the "
      "{}-token full prefill\n",
      rss_start, rss_loaded, rss_prefill, a.sizes.back());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  kvfuse::harness::refuse_check_only_build("kvfuse-cpu-bench");
  try {
    return run(parse_args(argc, argv));
  } catch (const kvfuse::error& e) {
    std::fflush(stdout);
    fmt::print(stderr, "kvfuse-cpu-bench: {}\n", e.what());
    return 2;
  } catch (const std::exception& e) {
    std::fflush(stdout);
    fmt::print(stderr, "kvfuse-cpu-bench: {}\n", e.what());
    return 1;
  }
}
