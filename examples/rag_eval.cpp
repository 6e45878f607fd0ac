// kvfuse-rag-eval: every reuse method on the real model over MuSiQue, measured against full prefill of the
// same prompt in the same run: TTFT and its ratio to full prefill, fraction of tokens recomputed, fidelity
// (KL of the first answer token's distribution; teacher-forced over the full-prefill greedy answer, whose tokens
// are fed after each method's KV: mean KL(full ‖ method) over them, their top-1 agreement, and the share of naive
// reuse's KL gap closed, gap_closed = 1 − KL / KL_naive; exact match and ROUGE-L of the greedy answer against
// the full-prefill answer) and token F1 against the gold answers. Writes results.json and results.md to --out
// and fidelity_ttft.png (gnuplot: fidelity against TTFT ratio, teacher-forced when naive reuse is among the
// methods) after each question, so that an interrupted run keeps what it measured.
//
//   kvfuse-rag-eval --data musique_dev.json [--methods full,prefix,naive,cacheblend,attnlink,cachecraft,...]
//                   [--limit 20] [--start 0] [--max-passages 10] [--max-passage-tokens 0] [--max-new-tokens 32]
//                   [--out DIR] [--cache-dir DIR] [--model smollm2|gemma3|qwen2|GGUF] [--threads 0] [--no-plot]
//                   [--store-dtype f32] [--store memory|disk|tiered|redis://HOST:PORT|redis-cluster://HOST:PORT,...]
//                   [--link-mbps X] [--link-latency-ms Y]
//                   [--pipeline on|off] [--split-tokens N] [--engine kvfuse|llamacpp] [--run-cost-rows N]
//                   [--calibrated] [--calibration-questions 3] [--calibration-kl 0.05] [--calibration-top1 0.95]
//                   [--chunk-context none|system] [--products fp32|bf16]
//
// --model smollm2 (default), gemma3 or qwen2 runs the file scripts/fetch_model.sh fetches; anything else is a GGUF
// path.
//
// --engine llamacpp runs every method inside llama.cpp (kvfuse::llamacpp::LlamaCppFusion; a build with
// -DKVFUSE_LLAMACPP=ON): full prefill, TTFT and the fidelity figures are llama.cpp's own. It is a fixed-set
// engine: methods that change the set per layer (CacheBlend, QueryAware, Cache-Craft with focus termination) are
// refused by name, and --calibrated and --store-dtype are for the kvfuse engine. Default methods there:
// full,prefix,naive,attnlink,attnlink@4,attnlink@64,cachecraft-nofocus,cachecraft@0.5-nofocus. --run-cost-rows:
// what one llama_decode costs beyond its rows (LlamaCppOptions::run_cost_rows; runs of recomputed rows closer than
// that are merged into one decode; 0: never).
//
// --calibrated: the per-model correctness gate (kvfuse/fusion/calibration.hpp) picks each method family named
// without a setting in --methods (cacheblend, attnlink, cachecraft, cachecraft-cover, queryaware, queryprobe): the
// cheapest setting whose teacher-forced KL over full prefill's answer stays within --calibration-kl with top-1
// agreement at least --calibration-top1, measured on the last --calibration-questions questions of --data (which the
// evaluated questions must not include), and no worse than naive reuse there. A family with no such setting is
// refused for the model and not run. `auto` in --methods (with --calibrated) calibrates every family this engine
// runs and runs the admitted setting that recomputes least (results.json: "auto"). Results are cached per model
// fingerprint in <kvfuse cache>/calibration; results.json records them under "calibration".
//
// --chunk-context system computes each passage's cache behind the system turn (PromptLayout::chunk_context, as
// kvfuse-server stores them; the system turn is then always computed), none (default) alone from position 0. The
// calibration files record it, and kvfuse-server's `auto` reads only those of its own chunk context. The kvfuse
// engine only.
//
// --products bf16 runs the kvfuse engine with bf16 weight products on Intel AMX (CpuLlamaOptions::products; refused
// on a CPU without AMX-BF16): every method and full prefill, the reference, with the same products. Its model
// fingerprint, and so its chunk caches and calibrations, are its own.
//
// Per question: the chunk caches are generated ahead of time and timed separately (offline_ms): each passage's
// isolated cache, and an earlier prompt with the same system prompt and first passage and the other passages
// in reverse order, whose in-context KV becomes the prefix-cache entries and the Cache-Craft variants (computed only
// when prefix or a Cache-Craft setting is among the methods). Then
// each method runs on [system, passages..., question]; TTFT counts the online work only (load, shift,
// recompute, first token). The memory tier is emptied after each question; --cache-dir adds a disk tier
// (DiskKVStore) that persists across runs. --store-dtype f16 or bf16 keeps the chunk caches at half the bytes
// (CpuLlamaFusion's storage dtype); the fidelity columns then include that rounding.
//
// Real I/O: --store memory (default; tiered when --cache-dir is given), disk (a DiskKVStore alone in --cache-dir,
// default <out>/kv-cache), tiered (memory over disk) or a Redis URI (RedisKVStore on a server or Cluster the user
// runs, as the far tier: memory → Redis, or memory → disk → Redis with --cache-dir; a server that goes away
// mid-run turns its reads into misses, recomputed, and the run completes with the same answers; results.json
// records its unavailable reads and rejected values under "redis"); --link-mbps / --link-latency-ms
// put the store (with tiers: the farthest) behind a bandwidth-limited link (ThrottledKVStore: a remote store or a
// slow SSD). With
// tiered, CacheBlend §5.1's loading controller places new chunk caches in the cheaper tier when loading from it
// does not delay the first token (tier_placement in results.json). --pipeline on (default) reads the
// chunk caches one layer at a time while the model computes (FusionPipeline's layer-pipelined loading; every
// store here has ranged reads); off loads every block whole first. The table then
// shows, per method, the load time still visible in TTFT ("load wait") next to the read time.
//
// --split-tokens N cuts every passage longer than N tokens into N-token chunks, each its own chunk cache
// (KVSplit's fixed-size chunking, Epic §5; split_long_chunks); 0 (default) keeps one chunk per passage.

#include <algorithm>
#include <array>
#include <charconv>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include "kvfuse/backend/any_kv_store.hpp"
#include "kvfuse/backend/disk_kv_store.hpp"
#include "kvfuse/backend/in_memory_store.hpp"
#include "kvfuse/backend/throttled_kv_store.hpp"
#include "kvfuse/backend/tiered_kv_store.hpp"
#include "kvfuse/cpu.hpp"
#if KVFUSE_WITH_REDIS
#include "kvfuse/backend/redis_kv_store.hpp"
#endif
#include "kvfuse/harness/calibrate.hpp"
#include "kvfuse/harness/metrics.hpp"
#include "kvfuse/harness/rag_prompt.hpp"
#include "kvfuse/fusion/fusion_pipeline.hpp"

#if KVFUSE_WITH_LLAMACPP
#include "kvfuse/llamacpp.hpp"
#endif

#include "musique.hpp"

namespace {

namespace fs = std::filesystem;
using kvfuse_example::load_questions;
using kvfuse_example::parse_int;
using kvfuse_example::Question;
using kvfuse_example::split;

constexpr std::string_view kDefaultMethods =
    "full,prefix,naive,cacheblend,queryaware,attnlink,cachecraft,cacheblend@0.05,cacheblend@0.3,cacheblend@0.5,"
    "queryaware@0.15:0.5,attnlink@4,attnlink@64,cachecraft@0.5,cachecraft@2";
// On llama.cpp (a fixed-set engine: no per-layer selection, so no CacheBlend, QueryAware or focus termination).
constexpr std::string_view kDefaultLlamaCppMethods =
    "full,prefix,naive,attnlink,attnlink@4,attnlink@64,cachecraft-nofocus,cachecraft@0.5-nofocus";
// --store names a Redis server or Cluster.
bool is_redis_uri(std::string_view store) {
  return store.starts_with("redis://") || store.starts_with("redis-cluster://");
}

constexpr std::string_view kSystem = "You are a helpful assistant. Answer the question using the documents, in a few words.";

struct Options {
  std::string data, model, out = "rag-eval", cache_dir, store, engine = "kvfuse";
  double link_mbps = 0.0, link_latency_ms = 0.0;
  bool pipeline = true;
  std::int64_t split_tokens = 0;
  kvfuse::DType store_dtype = kvfuse::DType::f32;
  std::vector<std::string> methods;
  std::int64_t limit = 20, start = 0, max_passages = 10, max_passage_tokens = 0, max_new_tokens = 32, threads = 0;
  std::optional<std::int64_t> run_cost_rows;  // --run-cost-rows (the llama.cpp engine)
  bool plot = true;
  bool calibrated = false;
  bool system_context = false;  // --chunk-context system
  kvfuse::CpuProducts products = kvfuse::CpuProducts::fp32;
  std::int64_t calibration_questions = 3;
  kvfuse::CalibrationBudget calibration_budget;
};

kvfuse::DType parse_dtype(std::string_view v) {
  for (kvfuse::DType t : {kvfuse::DType::f32, kvfuse::DType::f16, kvfuse::DType::bf16})
    if (v == kvfuse::dtype_name(t)) return t;
  throw kvfuse::error(fmt::format("--store-dtype: '{}' is not f32, f16 or bf16", v));
}

Options parse(int argc, char** argv) {
  Options o;
  std::string methods;
  for (int i = 1; i < argc; ++i) {
    const std::string_view flag = argv[i];
    if (flag == "--no-plot") {
      o.plot = false;
      continue;
    }
    if (flag == "--calibrated") {
      o.calibrated = true;
      continue;
    }
    kvfuse::require(i + 1 < argc, "{} needs a value", flag);
    const std::string_view v = argv[++i];
    if (flag == "--data") o.data = v;
    else if (flag == "--model") o.model = v;
    else if (flag == "--engine") o.engine = v;
    else if (flag == "--methods") methods = v;
    else if (flag == "--out") o.out = v;
    else if (flag == "--cache-dir") o.cache_dir = v;
    else if (flag == "--store-dtype") o.store_dtype = parse_dtype(v);
    else if (flag == "--limit") o.limit = parse_int(flag, v);
    else if (flag == "--start") o.start = parse_int(flag, v);
    else if (flag == "--max-passages") o.max_passages = parse_int(flag, v);
    else if (flag == "--max-passage-tokens") o.max_passage_tokens = parse_int(flag, v);
    else if (flag == "--max-new-tokens") o.max_new_tokens = parse_int(flag, v);
    else if (flag == "--threads") o.threads = parse_int(flag, v);
    else if (flag == "--run-cost-rows") o.run_cost_rows = parse_int(flag, v);
    else if (flag == "--store") o.store = v;
    else if (flag == "--split-tokens") o.split_tokens = parse_int(flag, v);
    else if (flag == "--calibration-questions") o.calibration_questions = parse_int(flag, v);
    else if (flag == "--calibration-kl") o.calibration_budget.max_kl_answer = kvfuse_example::parse_real(flag, v);
    else if (flag == "--calibration-top1") o.calibration_budget.min_top1_agreement = kvfuse_example::parse_real(flag, v);
    else if (flag == "--products") o.products = kvfuse::parse_products(v);
    else if (flag == "--link-mbps") o.link_mbps = kvfuse_example::parse_real(flag, v);
    else if (flag == "--link-latency-ms") o.link_latency_ms = kvfuse_example::parse_real(flag, v);
    else if (flag == "--chunk-context") {
      kvfuse::require(v == "none" || v == "system", "--chunk-context: '{}' is not none or system", v);
      o.system_context = v == "system";
    }
    else if (flag == "--pipeline") {
      kvfuse::require(v == "on" || v == "off", "--pipeline: '{}' is not on or off", v);
      o.pipeline = v == "on";
    }
    else throw kvfuse::error(fmt::format("unknown flag '{}'", flag));
  }
  kvfuse::require(!o.data.empty(), "--data FILE is required (MuSiQue JSON: ctxs[].text, question, answers)");
  kvfuse::require(o.engine == "kvfuse" || o.engine == "llamacpp", "--engine: '{}' is not kvfuse or llamacpp",
                          o.engine);
#if !KVFUSE_WITH_LLAMACPP
  kvfuse::require(o.engine != "llamacpp",
                          "--engine llamacpp: this kvfuse-rag-eval was built without the llama.cpp integration "
                          "(configure with -DKVFUSE_LLAMACPP=ON after scripts/fetch_llamacpp.sh)");
#endif
  kvfuse::require(o.engine == "kvfuse" || o.products == kvfuse::CpuProducts::fp32,
                  "--products bf16: the kvfuse engine's option (llama.cpp computes its products its own way)");
  if (methods.empty()) methods = o.engine == "llamacpp" ? kDefaultLlamaCppMethods : kDefaultMethods;
  kvfuse::require(o.limit >= 1, "--limit: {} must be >= 1", o.limit);
  kvfuse::require(o.max_passages >= 1, "--max-passages: {} must be >= 1", o.max_passages);
  if (o.store.empty()) o.store = o.cache_dir.empty() ? "memory" : "tiered";
  const bool redis_store = is_redis_uri(o.store);
  kvfuse::require(o.store == "memory" || o.store == "disk" || o.store == "tiered" || redis_store,
                          "--store: '{}' is not memory, disk, tiered or a redis:// / redis-cluster:// URI", o.store);
#if KVFUSE_WITH_REDIS
  if (redis_store) (void)kvfuse::parse_redis_uri(o.store);  // a bad URI is refused before the model is read
#else
  kvfuse::require(!redis_store, "--store {}: this build has no Redis support (hiredis; -DKVFUSE_REDIS=ON)",
                          o.store);
#endif
  kvfuse::require(o.store != "memory" || o.cache_dir.empty(),
                          "--cache-dir '{}' needs --store disk, tiered or a Redis URI", o.cache_dir);
  if ((o.store == "disk" || o.store == "tiered") && o.cache_dir.empty())
    o.cache_dir = (fs::path(o.out) / "kv-cache").string();
  kvfuse::require(std::isfinite(o.link_mbps) && o.link_mbps >= 0, "--link-mbps: {} must be >= 0 (0: no link)",
                          o.link_mbps);
  kvfuse::require(std::isfinite(o.link_latency_ms) && o.link_latency_ms >= 0,
                          "--link-latency-ms: {} must be >= 0", o.link_latency_ms);
  o.model = kvfuse_example::resolve_model(o.model.empty() ? "smollm2" : o.model);
  kvfuse::require(fs::exists(o.model),
                          "--model: '{}' does not exist (smollm2, gemma3, qwen2 or a GGUF path; fetch the three "
                          "with scripts/fetch_model.sh all)",
                          o.model);
  o.methods = split(methods);
  // Full prefill is the reference every other number is measured against: always run, first.
  std::erase(o.methods, std::string("full"));
  o.methods.insert(o.methods.begin(), "full");
  for (const std::string& m : o.methods) {  // refuse bad names, and methods the engine cannot run, before any work
    if (m == "auto") {
      kvfuse::require(o.calibrated, "--methods: 'auto' is the calibration gate's choice and needs --calibrated");
      continue;
    }
    const kvfuse::FusionMethod method = kvfuse::parse_method(m);
    const auto* craft = std::get_if<kvfuse::CacheCraft>(&method);
    const bool per_layer = std::holds_alternative<kvfuse::CacheBlend>(method) ||
                           std::holds_alternative<kvfuse::QueryAware>(method) ||
                           std::holds_alternative<kvfuse::QueryProbe>(method) ||
                           (craft != nullptr && craft->focus_termination);
    kvfuse::require(o.engine != "llamacpp" || !per_layer,
                            "--methods: '{}' changes the recomputed set per layer, which llama.cpp cannot (one set for "
                            "every layer: full, prefix, naive, attnlink[@k], cachecraft[@alpha]-nofocus[-cover])",
                            m);
  }
  kvfuse::require(o.engine != "llamacpp" || (!o.calibrated && o.store_dtype == kvfuse::DType::f32),
                          "--engine llamacpp: {} is for the kvfuse engine (llama.cpp keeps its own KV type)",
                          o.calibrated ? "--calibrated" : "--store-dtype");
  kvfuse::require(o.engine != "llamacpp" || !o.system_context,
                  "--chunk-context system: chunk caches behind a chunk context are for the kvfuse engine");
  o.calibration_budget.validate();
  kvfuse::require(o.calibration_questions >= 1, "--calibration-questions: {} must be >= 1",
                          o.calibration_questions);
  return o;
}

// Whether a method reads what record_context stores (prefix-cache entries, Cache-Craft variants).
bool reads_context(const kvfuse::FusionMethod& m) {
  return std::holds_alternative<kvfuse::PrefixCaching>(m) || std::holds_alternative<kvfuse::CacheCraft>(m);
}

// `text` up to its first byte that is not valid UTF-8: a cut through a SentencePiece byte-fallback
// sequence leaves a partial character at the end.
std::string valid_utf8_prefix(std::string text) {
  text.resize(kvfuse::utf8_invalid_offset(text));
  return text;
}

// A passage cut to its first `max_tokens` tokens (0: whole), for short test prompts.
std::string truncate_passage(const kvfuse::Tokenizer& tok, const std::string& text, std::int64_t max_tokens) {
  if (max_tokens == 0) return text;
  auto ids = tok.encode(text, false);
  if (static_cast<std::int64_t>(ids.size()) <= max_tokens) return text;
  ids.resize(static_cast<std::size_t>(max_tokens));
  return valid_utf8_prefix(tok.decode(ids, false));
}

std::string answer_text(const kvfuse::Tokenizer& tok, std::vector<kvfuse::token_id> ids) {
  while (!ids.empty() && tok.is_end_of_generation(ids.back())) ids.pop_back();
  return valid_utf8_prefix(tok.decode(ids, false));  // a 32-token answer can end inside a character
}

// Means over questions of one method's metrics.
struct Sums {
  std::map<std::string, double> sum;
  std::map<std::string, std::int64_t> count;  // per key: some keys only occur in some questions
  std::vector<double> ratios;
  void add(const std::map<std::string, double>& m) {
    for (const auto& [k, v] : m) {
      sum[k] += v;
      ++count[k];
    }
    ratios.push_back(m.at("ttft_ratio_vs_full"));
  }
  [[nodiscard]] nlohmann::json mean() const {
    nlohmann::json j;
    for (const auto& [k, v] : sum) j[k] = v / static_cast<double>(count.at(k));
    j["ttft_ratio_vs_full_median"] = kvfuse::eval::median(ratios);
    return j;
  }
};

std::string markdown_table(const nlohmann::json& results, const std::vector<std::string>& methods) {
  // "load ms (wait / read)": load time still visible in TTFT / time the store spent reading; with --pipeline on
  // the difference was hidden behind compute.
  // "KL answer / top-1": teacher-forced over the full-prefill answer (- when every full answer was empty).
  std::string s = fmt::format(
      "| method | TTFT ms | × full (mean / median) | recomputed | load ms (wait / read) | KL first token | "
      "KL answer / top-1 | EM vs full | ROUGE-L vs full | F1 vs gold |\n"
      "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n");
  for (const std::string& m : methods) {
    const nlohmann::json& r = results["methods"][m];
    const std::string forced = r.contains("kl_answer_mean")
                                   ? fmt::format("{:.4f} / {:.2f}", r["kl_answer_mean"].get<double>(),
                                                 r["top1_answer_agreement"].get<double>())
                                   : std::string("-");
    s += fmt::format("| {} | {:.0f} | {:.3f} / {:.3f} | {:.1f} % | {:.0f} / {:.0f} | {:.4f} | {} | {:.2f} | {:.3f} | {:.3f} |\n",
                     m, r["ttft_ms"].get<double>(), r["ttft_ratio_vs_full"].get<double>(),
                     r["ttft_ratio_vs_full_median"].get<double>(), 100.0 * r["recompute_fraction"].get<double>(),
                     r["load_wait_ms"].get<double>(), r["load_read_ms"].get<double>(),
                     r["kl_first_token"].get<double>(), forced, r["exact_match_vs_full"].get<double>(),
                     r["rouge_l_vs_full"].get<double>(), r["f1_vs_gold"].get<double>());
  }
  // The methods whose teacher-forced KL is above naive reuse's are named, with why (docs/fidelity.md).
  const nlohmann::json& all = results["methods"];
  if (!all.contains("naive") || !all["naive"].contains("kl_answer_mean")) return s;
  const double naive = all["naive"]["kl_answer_mean"].get<double>();
  std::vector<std::string> worse;
  for (const std::string& m : methods)
    if (m != "naive" && all[m].contains("kl_answer_mean") && all[m]["kl_answer_mean"].get<double>() > naive)
      worse.push_back(fmt::format("{} {:.4f}", m, all[m]["kl_answer_mean"].get<double>()));
  if (!worse.empty())
    s += fmt::format(
        "\nAbove naive reuse's teacher-forced KL ({:.4f}) on these questions: {}. Recomputing a subset of the rows "
        "can be worse than recomputing none on a given prompt: fresh rows next to stale ones, and on these models the "
        "per-passage attention sinks, once recomputed, stop absorbing attention that then reaches stale rows "
        "(docs/fidelity.md, \"Why a partial recompute can be worse than none\"). `--calibrated` and the server's "
        "`auto` refuse a setting that is worse than naive reuse on their calibration questions.\n",
        naive, fmt::join(worse, ", "));
  return s;
}

// Fidelity vs TTFT: ROUGE-L (left) and KL (right, log scale; values below 1e-4 drawn at 1e-4) against the TTFT
// ratio, one labelled point per method and setting, one colour per method family.
void write_plot(const fs::path& out, const nlohmann::json& results, const std::vector<std::string>& methods) {
  // Teacher-forced figures (share of naive reuse's gap closed, KL over the answer) when the run has them (naive
  // among the methods), else ROUGE-L and the first token's KL.
  const bool forced = std::all_of(methods.begin(), methods.end(),
                                  [&](const std::string& m) { return results["methods"][m].contains("gap_closed"); });
  const fs::path dat = out / "fidelity_ttft.dat";
  {
    std::ofstream d(dat);
    for (const std::string& m : methods) {
      const nlohmann::json& r = results["methods"][m];
      constexpr std::array<std::string_view, 7> families{"full",     "prefix",     "naive",     "cacheblend",
                                                         "attnlink", "cachecraft", "queryaware"};
      const auto colour = std::find(families.begin(), families.end(), m.substr(0, m.find_first_of("@-"))) -
                          families.begin() + 1;
      d << fmt::format("\"{}\" {} {} {} {}\n", m, r["ttft_ratio_vs_full"].get<double>(),
                       r[forced ? "gap_closed" : "rouge_l_vs_full"].get<double>(),
                       std::max(1e-4, r[forced ? "kl_answer_mean" : "kl_first_token"].get<double>()), colour);
    }
  }
  const fs::path gp = out / "fidelity_ttft.gp";
  {
    std::ofstream g(gp);
    g << "set terminal pngcairo size 1400,560 font 'sans,10' noenhanced\n"
      << "set output '" << (out / "fidelity_ttft.png").string() << "'\n"
      << "set multiplot layout 1,2 title '" << results["model"].get<std::string>() << ", "
      << results["questions"].get<int>() << " MuSiQue questions (means)'\n"
      << "set logscale x\nset xlabel 'TTFT / full prefill TTFT (log)'\nset grid\nunset key\n"
      << (forced ? "set ylabel 'share of naive reuse''s teacher-forced KL gap closed'\nset yrange [-0.5:1.05]\n"
                 : "set ylabel 'ROUGE-L of the answer vs full prefill'\nset yrange [0:1.05]\n")
      << "plot '" << dat.string() << "' using 2:3:5 with points pt 7 ps 1.4 lc variable, "
      << "'' using 2:3:1 with labels offset 0,1 font ',8'\n"
      << "set logscale y\nset ylabel 'KL(full || method), "
      << (forced ? "mean over the teacher-forced answer" : "first answer token") << " (log; < 1e-4 drawn at 1e-4)'\n"
      << "set yrange [5e-5:1]\n"
      << "plot '" << dat.string() << "' using 2:4:5 with points pt 7 ps 1.4 lc variable, "
      << "'' using 2:4:1 with labels offset 0,1 font ',8'\n"
      << "unset multiplot\n";
  }
  const std::string cmd = fmt::format("gnuplot '{}'", gp.string());
  kvfuse::require(std::system(cmd.c_str()) == 0,
                          "plot: '{}' failed (is gnuplot installed? scripts/deps.sh installs gnuplot-nox); "
                          "results.json and results.md are written",
                          cmd);
}

}  // namespace

int main(int argc, char** argv) try {
  Options o = parse(argc, argv);
  const std::vector<Question> questions = load_questions(o.data, o.start, o.limit, o.max_passages);
  const kvfuse::GGUFFile file = kvfuse::GGUFFile::open(o.model);
  const kvfuse::Tokenizer tok = kvfuse::Tokenizer::from_gguf(file);
  fs::create_directories(o.out);

  kvfuse::InMemoryKVStore memory;
  std::optional<kvfuse::DiskKVStore> disk;
  if (!o.cache_dir.empty()) disk.emplace(o.cache_dir);
#if KVFUSE_WITH_REDIS
  std::optional<kvfuse::RedisKVStore> redis;
  if (is_redis_uri(o.store)) redis.emplace(o.store);
#endif
  const kvfuse::LinkConfig link{o.link_mbps, o.link_latency_ms};
  const bool linked = o.link_mbps > 0.0 || o.link_latency_ms > 0.0;
  kvfuse::LoadConfig load;
  load.layerwise = o.pipeline;

  std::map<std::string, Sums> sums;
  nlohmann::json per_question = nlohmann::json::array();
  nlohmann::json tiers;  // a tiered store's tiers as the loading controller saw them at the end of the run
  double offline_ms = 0.0;
  std::int64_t total_tokens = 0;
  std::int64_t chunk_caches_computed = 0;  // isolated chunk caches the store did not hold yet

  // A question's prompt [system, passages..., question] and an earlier prompt whose in-context KV becomes the
  // prefix-cache entries and the Cache-Craft variants (first passage kept, the rest reversed).
  struct QuestionPrompts {
    std::vector<kvfuse::token_id> tokens, warm_tokens;
    kvfuse::PromptLayout layout, warm_layout;
  };
  const auto prompts_of = [&](const Question& q) {
    std::vector<std::string> passages;
    for (const std::string& p : q.passages) passages.push_back(truncate_passage(tok, p, o.max_passage_tokens));
    const auto chunked = [&o](const kvfuse::PromptLayout& l) {
      return o.split_tokens > 0 ? kvfuse::split_long_chunks(l, kvfuse::KVSplit({o.split_tokens})) : l;
    };
    const kvfuse::RagPrompt prompt = kvfuse::build_rag_prompt(tok, kSystem, passages, q.question);
    std::vector<std::string> earlier = passages;
    std::reverse(earlier.begin() + 1, earlier.end());
    const kvfuse::RagPrompt warm = kvfuse::build_rag_prompt(tok, kSystem, earlier, q.question);
    return QuestionPrompts{prompt.tokens, warm.tokens, chunked(prompt.layout(o.system_context)),
                           chunked(warm.layout(o.system_context))};
  };
  const std::string chunk_context = o.system_context ? "system" : "none";  // in results.json and calibration files
  std::string table;  // results.md's table, printed at the end
  // Everything after the model is loaded, on either engine: kvfuse's CPU backend (CpuLlamaFusion, with `model`)
  // or llama.cpp (LlamaCppFusion).
  const auto run_engine = [&](auto& engine, const kvfuse::CpuLlama* model, int threads) {
    constexpr bool kCpu = std::is_same_v<std::remove_cvref_t<decltype(engine)>, kvfuse::CpuLlamaFusion>;
    // The per-model correctness gate: each family named without a setting runs at its calibrated setting.
    nlohmann::json calibration = nlohmann::json::object();
    if constexpr (kCpu) {
      if (o.calibrated) {
        const std::int64_t first = kvfuse_example::question_count(o.data) - o.calibration_questions;
        kvfuse::require(first >= o.start + o.limit,
                                "--calibrated: the last {} questions of '{}' (from {}) calibrate, and --start {} --limit {} "
                                "overlaps them",
                                o.calibration_questions, o.data, first, o.start, o.limit);
        kvfuse::InMemoryKVStore calibration_store;
        kvfuse::FusionPipeline calibration_pipeline(engine, calibration_store);
        std::vector<kvfuse::eval::CalibrationPrompt> samples;
        for (const Question& q : load_questions(o.data, first, o.calibration_questions, o.max_passages)) {
          const QuestionPrompts p = prompts_of(q);
          calibration_pipeline.store_chunk_caches(p.tokens, p.layout);
          calibration_pipeline.record_context(p.warm_tokens, p.warm_layout);
          samples.push_back({p.tokens, p.layout});
        }
        kvfuse::eval::TeacherForcedEvaluator evaluator(*model, calibration_pipeline, samples, o.max_new_tokens, tok.eos());
        const fs::path dir = kvfuse_example::cache_dir() / "calibration";
        const std::vector<std::string> families(kvfuse::kCalibrationFamilies.begin(),
                                                kvfuse::kCalibrationFamilies.end());
        const bool want_auto = std::find(o.methods.begin(), o.methods.end(), "auto") != o.methods.end();
        std::vector<std::string> kept, to_calibrate;
        for (const std::string& name : o.methods) {
          if (std::find(families.begin(), families.end(), name) != families.end()) to_calibrate.push_back(name);
          else if (name != "auto") kept.push_back(name);
        }
        if (want_auto)  // every family, the named ones first
          for (const std::string& f : families)
            if (std::find(to_calibrate.begin(), to_calibrate.end(), f) == to_calibrate.end()) to_calibrate.push_back(f);
        std::vector<kvfuse::Calibration> calibrations;
        const auto run_chosen = [&](const std::string& chosen) {
          if (std::find(kept.begin(), kept.end(), chosen) == kept.end()) kept.push_back(chosen);
        };
        for (const std::string& name : to_calibrate) {
          const bool named = std::find(o.methods.begin(), o.methods.end(), name) != o.methods.end();
          const fs::path path = kvfuse::eval::calibration_file(dir, engine.model_fingerprint(), name,
                                                               o.calibration_budget, evaluator.samples_hash());
          std::optional<kvfuse::Calibration> c;
          if (fs::exists(path)) {
            try {
              c = kvfuse::eval::load_calibration(path, engine.model_fingerprint(), name, o.calibration_budget,
                                                 evaluator.samples_hash(), chunk_context);
            } catch (const kvfuse::error& e) {
              fmt::print(stderr, "calibration: recalibrating, the cached result is unusable: {}\n", e.what());
            }
          }
          const bool cached = c.has_value();
          if (!c) {
            c = kvfuse::calibrate(engine.model_fingerprint(), name, o.calibration_budget, evaluator);
            kvfuse::eval::save_calibration(path, *c, evaluator.samples_hash(), chunk_context);
          }
          nlohmann::json points = nlohmann::json::array();
          for (const kvfuse::CalibrationPoint& p : c->points)
            points.push_back({{"method", p.method}, {"recompute_fraction", p.measure.recompute_fraction},
                              {"kl_answer_mean", p.measure.kl_answer_mean}, {"top1_answer_agreement", p.measure.top1_agreement},
                              {"admitted", p.admitted}});
          calibration[name] = {{"chosen", c->chosen ? nlohmann::json(*c->chosen) : nlohmann::json()},
                               {"cached", cached}, {"points", points},
                               {"naive", {{"recompute_fraction", c->naive.recompute_fraction},
                                          {"kl_answer_mean", c->naive.kl_answer_mean},
                                          {"top1_answer_agreement", c->naive.top1_agreement}}}};
          if (c->chosen) {
            fmt::print(stderr, "calibration: {} -> {}{}\n", name, *c->chosen, cached ? " (cached)" : "");
            if (named) run_chosen(*c->chosen);
          } else {
            try {
              (void)c->method();
            } catch (const kvfuse::error& e) {
              fmt::print(stderr, "calibration: {}; not run\n", e.what());
            }
          }
          calibrations.push_back(std::move(*c));
        }
        if (want_auto) {
          const std::optional<std::string> choice = kvfuse::cheapest_admitted(calibrations);
          calibration["auto"] = choice ? nlohmann::json(*choice) : nlohmann::json();
          fmt::print(stderr, "calibration: auto -> {}\n", choice ? *choice : "every family refused: not run");
          if (choice) run_chosen(*choice);
        }
        o.methods = kept;
      }
    }

    std::vector<kvfuse::FusionMethod> methods;
    for (const std::string& m : o.methods) methods.push_back(kvfuse::parse_method(m));
    const bool uses_context = std::any_of(methods.begin(), methods.end(), reads_context);

    // results.json and results.md over the questions done so far: written after each question, so that an
    // interrupted run keeps what it measured.
    nlohmann::json results;
    const auto write_results = [&] {
      results = nlohmann::json();
      results["model"] = fs::path(o.model).filename().string();
      results["store_dtype"] = kCpu ? kvfuse::dtype_name(o.store_dtype) : "f16";  // llama.cpp's KV cache type
      results["questions"] = per_question.size();
      results["passages_per_question"] = o.max_passages;
      results["mean_prompt_tokens"] = static_cast<double>(total_tokens) / static_cast<double>(per_question.size());
      results["offline_ms_mean"] = offline_ms / static_cast<double>(per_question.size());
      results["chunk_caches_computed"] = chunk_caches_computed;
      results["engine"] = o.engine;
      results["threads"] = threads;
      results["products"] = kvfuse::products_name(o.products);
      if constexpr (kvfuse::RunCostBackend<std::remove_cvref_t<decltype(engine)>>)
        results["run_cost_rows"] = engine.run_cost_rows();
      results["store"] = o.store;
      if (!tiers.empty()) results["tiers"] = tiers;
#if KVFUSE_WITH_REDIS
      if (redis) {
        results["redis"] = {{"unavailable_reads", redis->unavailable()},
                            {"rejected_values", redis->rejected()},
                            {"last_error", redis->last_error()},
                            {"last_rejection", redis->last_rejection()}};
      }
#endif
      results["link_mbps"] = o.link_mbps;
      results["link_latency_ms"] = o.link_latency_ms;
      results["pipeline"] = o.pipeline;
      results["split_tokens"] = o.split_tokens;
      results["chunk_context"] = chunk_context;
      if (o.calibrated) {
        results["calibration"] = calibration;
        results["calibration_budget"] = {{"max_kl_answer", o.calibration_budget.max_kl_answer},
                                         {"min_top1_agreement", o.calibration_budget.min_top1_agreement},
                                         {"questions", o.calibration_questions}};
      }
      for (const std::string& m : o.methods) results["methods"][m] = sums[m].mean();
      // Share of naive reuse's KL gap to full prefill that a method closes (from the means): 1 − KL_m / KL_naive.
      if (results["methods"].contains("naive") && results["methods"]["naive"]["kl_first_token"].get<double>() > 0.0) {
        const double naive_kl = results["methods"]["naive"]["kl_first_token"].get<double>();
        for (const std::string& m : o.methods)
          results["methods"][m]["kl_gap_recovered_vs_naive"] =
              1.0 - results["methods"][m]["kl_first_token"].get<double>() / naive_kl;
      }
      // The same over the teacher-forced answer: gap_closed = 1 − KL_answer(method) / KL_answer(naive).
      if (results["methods"].contains("naive") && results["methods"]["naive"].contains("kl_answer_mean") &&
          results["methods"]["naive"]["kl_answer_mean"].get<double>() > 0.0) {
        const double naive_kl = results["methods"]["naive"]["kl_answer_mean"].get<double>();
        for (const std::string& m : o.methods)
          results["methods"][m]["gap_closed"] = 1.0 - results["methods"][m]["kl_answer_mean"].get<double>() / naive_kl;
      }
      results["per_question"] = per_question;
      {
        std::ofstream js(fs::path(o.out) / "results.json");
        js << results.dump(2) << "\n";
        kvfuse::require(js.good(), "--out: cannot write '{}'", (fs::path(o.out) / "results.json").string());
      }
      table = markdown_table(results, o.methods);
      {
        std::ofstream md(fs::path(o.out) / "results.md");
        md << fmt::format("{} on {} MuSiQue questions ({} passages, {:.0f} prompt tokens on average); means over "
                          "questions, TTFT ratio measured against full prefill in the same run.\n\n",
                          results["model"].get<std::string>(), per_question.size(), o.max_passages,
                          results["mean_prompt_tokens"].get<double>())
           << table;
      }
      if (o.plot) write_plot(o.out, results, o.methods);
    };

    const auto evaluate = [&](auto& pipeline) {
      for (std::size_t qi = 0; qi < questions.size(); ++qi) {
        const Question& q = questions[qi];
        const QuestionPrompts prompt = prompts_of(q);
        const kvfuse::PromptLayout& layout = prompt.layout;
        const auto n = static_cast<std::int64_t>(prompt.tokens.size());
        total_tokens += n;

        // Offline: isolated chunk caches, and the earlier prompt's in-context KV when a method reads it (prefix
        // caching's entries, Cache-Craft's variants).
        auto t0 = std::chrono::steady_clock::now();
        const std::int64_t computed = pipeline.store_chunk_caches(prompt.tokens, layout);
        chunk_caches_computed += computed;
        if (uses_context) pipeline.record_context(prompt.warm_tokens, prompt.warm_layout);
        const double q_offline = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
        offline_ms += q_offline;

        nlohmann::json qj{{"index", o.start + static_cast<std::int64_t>(qi)}, {"tokens", n},
                          {"question", q.question}, {"gold", q.answers}, {"offline_ms", q_offline},
                          {"chunk_caches_computed", computed}};
        std::vector<float> full_logits;
        std::vector<kvfuse::token_id> full_ids;         // the full-prefill greedy answer
        std::vector<std::vector<float>> full_forced;   // full prefill's distributions over it
        std::string full_answer;
        double full_ms = 0.0;
        std::string progress;
        for (std::size_t mi = 0; mi < methods.size(); ++mi) {
          kvfuse::FusionResult r = pipeline.run(prompt.tokens, layout, methods[mi]);
          const double ttft = r.time.ttft_ms();
          // The greedy answer, then teacher forcing: the full-prefill answer's tokens fed after this method's KV
          // (and after full prefill's), each from the prompt's KV.
          std::vector<kvfuse::token_id> ids;
          std::vector<std::vector<float>> forced;
          const auto answer_of = [&](std::span<const kvfuse::token_id> prompt_answer) {
            if constexpr (kCpu) {
              const kvfuse::LlamaKVCache prompt_kv = engine.kv();
              ids = model->greedy_decode(engine.kv(), r.logits, o.max_new_tokens, tok.eos());
              kvfuse::LlamaKVCache forced_kv = prompt_kv;
              forced = model->forced_logits(forced_kv, r.logits, prompt_answer.empty() ? ids : prompt_answer);
            } else {
              ids = engine.greedy(r.logits, o.max_new_tokens, tok.eos());
              engine.truncate_to_prompt();
              forced = engine.forced_logits(r.logits, prompt_answer.empty() ? ids : prompt_answer);
              engine.truncate_to_prompt();
            }
          };
          answer_of(full_ids);
          const std::string answer = answer_text(tok, ids);
          if (mi == 0) {
            full_logits = r.logits;
            full_answer = answer;
            full_ms = ttft;
            full_ids = ids;
          }
          if (mi == 0) full_forced = forced;
          std::map<std::string, double> m{
              {"ttft_ms", ttft},
              {"ttft_ratio_vs_full", ttft / full_ms},
              {"recompute_fraction", r.recompute_fraction},
              {"kl_first_token", kvfuse::eval::kl_divergence(full_logits, r.logits)},
              {"exact_match_vs_full", kvfuse::eval::exact_match(answer, full_answer) ? 1.0 : 0.0},
              {"rouge_l_vs_full", kvfuse::eval::rouge_l(answer, full_answer)},
              {"f1_vs_gold", kvfuse::eval::max_token_f1(answer, q.answers)},
              {"plan_ms", r.time.plan_ms},
              {"load_ms", r.time.load_ms},
              {"shift_ms", r.time.shift_ms},
              {"prefill_ms", r.time.prefill_ms},
              {"rejected_entries", static_cast<double>(r.rejected_entries)},
              {"load_read_ms", r.load.layerwise ? r.load.read_ms() : r.time.load_ms},
              {"load_wait_ms", r.load.layerwise ? r.load.wait_ms() + r.time.load_ms : r.time.load_ms},
              {"layerwise", r.load.layerwise ? 1.0 : 0.0},
          };
          if (r.load.layerwise) m["preload_depth"] = static_cast<double>(r.load.depth);
          if (r.controller) m["controller_ratio"] = r.controller->ratio;
          if (r.tier) m["tier_placement"] = static_cast<double>(r.tier->device.value_or(0));  // index into "tiers"
          if (r.focus) m["focus_cutoff_layer"] = static_cast<double>(r.focus->cutoff_layer);
          if (!full_ids.empty()) {
            const kvfuse::eval::TeacherForced tf = kvfuse::eval::teacher_forced(full_forced, forced);
            m["kl_answer_mean"] = tf.kl_mean;
            m["top1_answer_agreement"] = tf.top1_agreement;
          }
          sums[o.methods[mi]].add(m);
          nlohmann::json mj(m);
          mj["answer"] = answer;
          if (qi == 0 && r.load.layerwise) {  // the per-layer trace of the first question's request
            for (const kvfuse::LayerLoadTiming& t : r.load.layers)
              mj["layers"].push_back({{"read_ms", t.read_ms}, {"wait_ms", t.wait_ms}, {"install_ms", t.install_ms},
                                      {"compute_ms", t.compute_ms}, {"policy_ms", t.policy_ms}});
          }
          qj["methods"][o.methods[mi]] = mj;
          progress += fmt::format(" {} {:.2f}x", o.methods[mi], m["ttft_ratio_vs_full"]);
        }
        per_question.push_back(qj);
        fmt::print(stderr, "[{}/{}] question {}: {} tokens, full {:.1f} s, offline {:.1f} s;{}\n", qi + 1,
                   questions.size(), o.start + static_cast<std::int64_t>(qi), n, full_ms / 1000.0, q_offline / 1000.0,
                   progress);
        memory.clear();  // bound memory: the disk tier (if any) keeps the entries
        write_results();
      }
    };
    // The pipeline runs on the store behind one type (AnyKVStore, or AnyTieredKVStore for tiers): compiled twice
    // per engine rather than once per combination of --store, --redis and --link.
    const auto run_on = [&](auto& store) {
      if constexpr (kvfuse::MeasuredTierStore<std::remove_cvref_t<decltype(store)>>) {
        kvfuse::AnyTieredKVStore any(store);
        kvfuse::FusionPipeline pipeline(engine, any, {}, load);
        evaluate(pipeline);
        for (const kvfuse::StorageDevice& d : any.tier_devices())
          tiers.push_back({{"name", d.name}, {"cost_per_gb", d.cost_per_gb},
                           {"measured_read_mb_per_s", d.bandwidth_bytes_per_s / 1e6}});
        write_results();
      } else {
        kvfuse::AnyKVStore any(store);
        kvfuse::FusionPipeline pipeline(engine, any, {}, load);
        evaluate(pipeline);
      }
    };
    // The link stands in front of the store, or of its farthest tier only (memory stays local).
    const auto with_link = [&](auto& store, auto&& then) {
      if (linked) {
        kvfuse::ThrottledKVStore slow(store, link);
        then(slow);
      } else {
        then(store);
      }
    };
#if KVFUSE_WITH_REDIS
    if (redis) {
      // CacheBlend §5.1's C_store per GB: local DRAM, local disk, and a share of a remote server's DRAM.
      with_link(*redis, [&](auto& far) {
        if (disk) {
          kvfuse::TieredKVStore tiered(kvfuse::TieredConfig{{{"memory", 1.0}, {"disk", 0.1}, {"redis", 0.3}}}, memory,
                                       *disk, far);
          run_on(tiered);
        } else {
          kvfuse::TieredKVStore tiered(kvfuse::TieredConfig{{{"memory", 1.0}, {"redis", 0.3}}}, memory, far);
          run_on(tiered);
        }
      });
      return;
    }
#endif
    if (o.store == "tiered") {
      with_link(*disk, [&](auto& slow) {
        kvfuse::TieredKVStore tiered(kvfuse::TieredConfig{{{"memory", 1.0}, {"disk", 0.1}}}, memory, slow);
        run_on(tiered);
      });
    } else if (disk) {
      with_link(*disk, run_on);
    } else {
      with_link(memory, run_on);
    }
  };
  if (o.engine == "kvfuse") {
    kvfuse::CpuLlamaOptions model_options;
    model_options.threads = static_cast<int>(o.threads);
    model_options.products = o.products;
    const kvfuse::CpuLlama model = kvfuse::CpuLlama::from_gguf(file, model_options);
    kvfuse::CpuLlamaFusion engine(model, o.store_dtype);
    run_engine(engine, &model, model.threads());
  }
#if KVFUSE_WITH_LLAMACPP
  if (o.engine == "llamacpp") {
    // The context holds the longest prompt, a chunk cache computed while a request is assembled, and the answer.
    std::size_t cells = 0;
    for (const Question& q : questions) {
      const QuestionPrompts p = prompts_of(q);
      std::int64_t longest_chunk = 0;
      for (const kvfuse::PromptChunk& c : p.layout.chunks) longest_chunk = std::max(longest_chunk, c.range.size());
      cells = std::max(cells, p.tokens.size() + static_cast<std::size_t>(longest_chunk + o.max_new_tokens));
    }
    kvfuse::llamacpp::LlamaCppOptions options;
    options.threads = static_cast<int>(o.threads);
    if (o.run_cost_rows) options.run_cost_rows = *o.run_cost_rows;
    options.n_ctx = static_cast<std::uint32_t>((cells + 64 + 255) / 256 * 256);
    // The eval callback behind the attention statistics slows every decode: only when prefix or Cache-Craft runs.
    options.attention_statistics = std::any_of(o.methods.begin(), o.methods.end(), [](const std::string& m) {
      return reads_context(kvfuse::parse_method(m));
    });
    kvfuse::llamacpp::LlamaCppFusion engine(o.model, options);
    run_engine(engine, nullptr, engine.threads());
  }
#endif

  fmt::print("{}", table);
  fmt::print("wrote {}/results.json, results.md{}\n", o.out, o.plot ? ", fidelity_ttft.png" : "");
  return 0;
} catch (const std::exception& e) {
  fmt::print(stderr, "kvfuse-rag-eval: {}\n", e.what());
  return 2;
}
