// kvfuse-cake-run: Cake on real compute and real I/O. Each request is the first --prefix-tokens tokens (on the
// fetch-chunk grid) of a MuSiQue RAG prompt followed by its question: the question's passages, then, while they are
// shorter than the prefix, the passages of the questions after it in the file (ten passages are about 1000 SmolLM2
// tokens, so --prefix-tokens 2048 and 4096 take about three and five questions' passages). That prefix is made offline by a
// full prefill and put in a store behind a link of --link-mbps and --link-latency-ms; then the time until the first
// token's logits (TTFT) is measured on the reference CPU backend and the real store: static splits on the fetch grid
// once each, coarse to fine (split_sweep.hpp: about 15 of 1K's 65 splits, none whose load alone is slower than the
// best so far), to find the best; then Cake (LoaderMode::adaptive: compute from the front, load from the back),
// compute-only (in 512-token chunks: no race keeps them small), load-only and that best split, --repeats times each,
// interleaved. A load-only run whose bytes take longer at the link's nominal speed than every compute-only run of the
// prompt so far is not run: it cannot be the better single resource, and that nominal time stands in for it (so the
// ratio to the better single resource is, if anything, overstated). The medians are what is compared (the sweep's
// minimum over many noisy runs is biased low; it is reported beside them). Every run's first-token logits are
// checked against full prefill (equal up to float rounding).
//
// Chunk sizes and the adaptive mode's estimate come from speeds kept for this engine and link (CakeSpeedMeter):
// the compute side's fixed cost per forward pass and cost per token, timed once at start on passes of 16, 64 and
// 256 rows, the link's latency and cost per token from its nominal speed; every run's chunks and fetches then update
// them. For each prompt choose_chunk_sizes picks the compute and fetch chunks for its stored prefix (one chunk at
// most 2 % of the ideal TTFT, its fixed cost at most 10 % of its time, the compute chunk's at most half the link's
// share of the throughput); --compute-chunk / --fetch-chunk override.
//
//   kvfuse-cake-run --data musique_dev.json [--model GGUF] [--prefix-tokens 2048] [--store memory|disk]
//                   [--cache-dir DIR] [--link-mbps 20] [--link-latency-ms 1] [--limit 1] [--start 0]
//                   [--compute-chunk N] [--fetch-chunk N] [--threads 0] [--out DIR] [--method cacheblend]
//                   [--serve N] [--decode-tokens 8] [--repeats 3] [--composed 1]
//
// Prints one JSON object: means over the prompts of each run's median TTFT (and of the sweep's minimum), the meeting
// point, the best split, the link's nominal and measured speed, the prompt and stored-prefix lengths, each prompt's
// chunk sizes and predicted TTFT, each prompt's own figures ("prompts"), and the speeds measured by the end. Then
// (unless --composed 0) one composed request (run_composed) on the
// first question's prompt with its first four passages: system prompt + passage 1 stored as the exact prefix and
// prepared by Cake, passages 2-4 reused from their chunk caches by --method, then the
// question; a second JSON object gives its TTFT next to full prefill's, the first token's KL and agreement, and
// how much of the chunk caches' load stayed visible with layer-pipelined loading. With --serve N, N requests (the
// N questions from --start, each request as above; every other one has its stored prefix, the rest are plain) run
// together in one CpuBatchEngine (continuous batching under Cake's TokenBudgetScheduler with a budget of
// --compute-chunk tokens per step, else Cake's 512: decode first, then chunked prefill, then the Cake requests' compute sides while
// their prefixes load from the back) and each decodes --decode-tokens greedy tokens; a third JSON object gives, per
// request, its stored prefix, meeting point, first-token step and time and whether its tokens equal serving it
// alone. With --out DIR, writes cake_timeline.png
// (gnuplot): one request's compute chunks (forward) and loads (backward) and where they met.

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <charconv>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "kvfuse/backend/any_kv_store.hpp"
#include "kvfuse/cpu.hpp"
#include "kvfuse/harness/metrics.hpp"
#include "kvfuse/harness/rag_prompt.hpp"
#include "kvfuse/runtime.hpp"

#include "musique.hpp"
#include "split_sweep.hpp"

namespace {

namespace fs = std::filesystem;
using namespace kvfuse_example;

constexpr std::string_view kSystem = "You are a helpful assistant. Answer the question using the documents, in a few words.";

struct Options {
  std::string data, model, store = "memory", cache_dir, out, method = "cacheblend";
  std::int64_t prefix_tokens = 2048, limit = 1, start = 0, threads = 0;
  std::int64_t compute_chunk = 0, fetch_chunk = 0;  // 0: chosen from the measured speeds
  std::int64_t serve = 0, decode_tokens = 8, repeats = 3, composed = 1;
  kvfuse::LinkConfig link{20.0, 1.0};
};

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string_view flag = argv[i];
    kvfuse::require(i + 1 < argc, "{} needs a value", flag);
    const std::string_view v = argv[++i];
    if (flag == "--data") o.data = v;
    else if (flag == "--model") o.model = v;
    else if (flag == "--store") o.store = v;
    else if (flag == "--cache-dir") o.cache_dir = v;
    else if (flag == "--out") o.out = v;
    else if (flag == "--method") o.method = v;
    else if (flag == "--prefix-tokens") o.prefix_tokens = parse_int(flag, v);
    else if (flag == "--limit") o.limit = parse_int(flag, v);
    else if (flag == "--start") o.start = parse_int(flag, v);
    else if (flag == "--compute-chunk") o.compute_chunk = parse_int(flag, v);
    else if (flag == "--fetch-chunk") o.fetch_chunk = parse_int(flag, v);
    else if (flag == "--threads") o.threads = parse_int(flag, v);
    else if (flag == "--serve") o.serve = parse_int(flag, v);
    else if (flag == "--decode-tokens") o.decode_tokens = parse_int(flag, v);
    else if (flag == "--repeats") o.repeats = parse_int(flag, v);
    else if (flag == "--composed") o.composed = parse_int(flag, v);
    else if (flag == "--link-mbps") o.link.megabytes_per_s = parse_real(flag, v);
    else if (flag == "--link-latency-ms") o.link.latency_ms = parse_real(flag, v);
    else throw kvfuse::error(fmt::format("unknown flag '{}'", flag));
  }
  kvfuse::require(!o.data.empty(), "--data FILE is required (MuSiQue JSON: ctxs[].text, question, answers)");
  kvfuse::require(o.store == "memory" || o.store == "disk", "--store: '{}' is neither memory nor disk", o.store);
  kvfuse::require(o.limit >= 1, "--limit: {} must be >= 1", o.limit);
  kvfuse::require(o.repeats >= 1, "--repeats: {} must be >= 1", o.repeats);
  kvfuse::require(o.composed == 0 || o.composed == 1, "--composed: {} is neither 0 nor 1", o.composed);
  kvfuse::require(o.compute_chunk >= 0, "--compute-chunk: {} must be >= 0 (0: chosen from measured speeds)",
                  o.compute_chunk);
  kvfuse::require(o.fetch_chunk >= 0, "--fetch-chunk: {} must be >= 0 (0: chosen from measured speeds)", o.fetch_chunk);
  (void)kvfuse::parse_method(o.method);  // refuse a bad name before any work
  o.link.validate();
  o.model = kvfuse_example::resolve_model(o.model.empty() ? "smollm2" : o.model);
  kvfuse::require(fs::exists(o.model),
                          "--model: '{}' does not exist (smollm2, gemma3 or a GGUF path; fetch the two with "
                          "scripts/fetch_model.sh all)",
                          o.model);
  return o;
}

// One run of the loader on a fresh request; checks the result against full prefill.
template <class Store>
kvfuse::LoaderTrace run_once(const kvfuse::CpuLlama& model, Store& store, const std::vector<kvfuse::token_id>& tokens,
                             kvfuse::LoaderConfig config, const kvfuse::LoaderEstimate& estimate,
                             const kvfuse::LlamaPrefill& full, bool& exact) {
  kvfuse::CpuLlamaSession session(model, tokens);
  kvfuse::LoaderTrace t = kvfuse::run_threaded(
      kvfuse::BidirectionalLoader<kvfuse::CpuLlamaSession, Store>(config, estimate), session, store, tokens);
  // Full prefill's logits up to float rounding (chunked prefill groups rows differently): |Δ| ≤ 1e-5 · max |logit|.
  const std::span<const float> logits = session.logits();
  double diff = 0, scale = 1;
  for (std::size_t i = 0; i < logits.size(); ++i) {
    diff = std::max(diff, static_cast<double>(std::fabs(logits[i] - full.logits[i])));
    scale = std::max(scale, static_cast<double>(std::fabs(full.logits[i])));
  }
  exact = exact && t.load_failure.empty() && logits.size() == full.logits.size() && diff <= 1e-5 * scale;
  return t;
}

// The link's nominal seconds per stored token (0: an unlimited link): a token's KV bytes over its bandwidth.
double nominal_token_s(const kvfuse::CpuLlama& model, const kvfuse::LinkConfig& link) {
  const double token_bytes =
      static_cast<double>(kvfuse::LlamaKVCache::block_bytes(model.config().n_layer, model.config().kv_dim(), 1));
  return link.megabytes_per_s > 0 ? token_bytes / (link.megabytes_per_s * 1e6) : 0.0;
}

// The speeds the chunk rule starts from: the engine's compute line measured (measure_cake_speeds); the link's from its
// nominal latency and bandwidth.
kvfuse::CakeSpeedMeter calibrate(const kvfuse::CpuLlama& model, const std::vector<kvfuse::token_id>& tokens,
                                 const kvfuse::LinkConfig& link) {
  return kvfuse::CakeSpeedMeter(
      kvfuse::measure_cake_speeds(model, tokens, link.latency_ms / 1e3, nominal_token_s(model, link)));
}

// The chunks for a stored prefix of `prefix` tokens: chosen from the speeds, unless given on the command line.
kvfuse::ChunkSizes chunks_for(const Options& o, const kvfuse::CakeSpeeds& speeds, std::int64_t prefix) {
  kvfuse::ChunkSizes c = kvfuse::choose_chunk_sizes(speeds, prefix);
  if (o.compute_chunk > 0) c.compute_chunk = o.compute_chunk;
  if (o.fetch_chunk > 0) c.fetch_chunk = o.fetch_chunk;
  return c;
}

void write_timeline(const fs::path& out, const kvfuse::LoaderTrace& t, const Options& o) {
  fs::create_directories(out);
  const fs::path dat = out / "cake_timeline.dat";
  {
    std::ofstream d(dat);
    for (const kvfuse::LoaderStep& s : t.steps)  // start end first last lane (1 compute, 2 load) used
      d << fmt::format("{} {} {} {} {} {}\n", s.start_s, s.end_s, s.tokens.begin, s.tokens.end,
                       s.source == kvfuse::KVSource::compute ? 1 : 2, s.used ? 1 : 0);
  }
  const fs::path gp = out / "cake_timeline.gp";
  std::ofstream(gp) << "set terminal pngcairo size 1000,420 font 'sans,10' noenhanced\n"
                    << "set output '" << (out / "cake_timeline.png").string() << "'\n"
                    << fmt::format("set title 'Cake on SmolLM2 (CPU), {} MB/s link: met at token {} of {}'\n",
                                   o.link.megabytes_per_s, t.meet_token, t.num_tokens)
                    << "set xlabel 'seconds'\nset ylabel 'token'\nset grid\nset key top left\n"
                    << fmt::format("set arrow from graph 0, first {0} to graph 1, first {0} nohead dt 2\n", t.meet_token)
                    << "plot '" << dat.string() << "' using 1:3:($2-$1):($4-$3):($5==1?1:2) with vectors nohead lw 3 "
                    << "lc variable title 'compute (purple) / load (green) chunks'\n";
  const std::string cmd = fmt::format("gnuplot '{}'", gp.string());
  kvfuse::require(std::system(cmd.c_str()) == 0, "plot: '{}' failed (is gnuplot installed?)", cmd);
}

// Question qi's RAG prompt for a stored prefix of `prefix_tokens`: its passages, then those of the questions after
// it in the file (wrapping) while the passages end before the prefix does.
kvfuse::RagPrompt prompt_for(const kvfuse::Tokenizer& tok, const std::vector<Question>& all, std::size_t qi,
                             std::int64_t prefix_tokens) {
  std::vector<std::string> passages = all.at(qi).passages;
  kvfuse::RagPrompt prompt = kvfuse::build_rag_prompt(tok, kSystem, passages, all[qi].question);
  for (std::size_t k = 1; prompt.layout().query.begin < prefix_tokens; ++k) {
    kvfuse::require(k < all.size(), "--prefix-tokens {}: every passage of the file's {} questions makes {} tokens",
                    prefix_tokens, all.size(), prompt.layout().query.begin);
    const std::vector<std::string>& more = all[(qi + k) % all.size()].passages;
    passages.insert(passages.end(), more.begin(), more.end());
    prompt = kvfuse::build_rag_prompt(tok, kSystem, passages, all[qi].question);
  }
  return prompt;
}

}  // namespace

int main(int argc, char** argv) try {
  const Options o = parse(argc, argv);
  // Every question: a prefix longer than a question's passages continues with those of the questions after it in the
  // file (prompt_for), which may be questions measured too.
  const std::vector<Question> all = load_questions(o.data, 0, question_count(o.data), 10);
  kvfuse::require(o.start + o.limit <= static_cast<std::int64_t>(all.size()),
                  "--data: '{}' has {} questions; --start {} --limit {} asks for more", o.data, all.size(), o.start,
                  o.limit);
  const std::vector<Question> questions(all.begin() + o.start, all.begin() + o.start + o.limit);
  const kvfuse::GGUFFile file = kvfuse::GGUFFile::open(o.model);
  const kvfuse::Tokenizer tok = kvfuse::Tokenizer::from_gguf(file);
  kvfuse::CpuLlamaOptions model_options;
  model_options.threads = static_cast<int>(o.threads);
  const kvfuse::CpuLlama model = kvfuse::CpuLlama::from_gguf(file, model_options);
  kvfuse::CakeSpeedMeter meter = calibrate(
      model, kvfuse::build_rag_prompt(tok, kSystem, questions.front().passages, questions.front().question).tokens,
      o.link);

  std::optional<fs::path> temp_dir;
  fs::path dir = o.cache_dir;
  if (o.store == "disk" && dir.empty()) {
    temp_dir = fs::temp_directory_path() / fmt::format("kvfuse-cake-run-{}", ::getpid());
    dir = *temp_dir;
  }
  kvfuse::InMemoryKVStore memory;
  std::optional<kvfuse::DiskKVStore> disk;
  if (o.store == "disk") disk.emplace(dir);
  // The runs below over one store type, whichever --store named: each compiled once.
  std::optional<kvfuse::AnyKVStore> store;
  if (disk) {
    store.emplace(*disk);
  } else {
    store.emplace(memory);
  }

  const auto measure = [&](kvfuse::AnyKVStore& inner) {
    kvfuse::ThrottledKVStore link(inner, o.link);
    double cake = 0, compute_only = 0, io_only = 0, best = 0, sweep_min = 0, meet = 0, best_token = 0, tokens_sum = 0;
    double stored_sum = 0;
    double predicted = 0;
    nlohmann::json chunks = nlohmann::json::array();
    bool exact = true;
    nlohmann::json per_prompt = nlohmann::json::array();
    bool io_bounded = false;
    // The link's nominal time per token: ThrottledKVStore holds every load to it, so it bounds a split's load time.
    const double load_token_s = nominal_token_s(model, o.link);
    for (std::size_t qi = 0; qi < questions.size(); ++qi) {
      // The request: the first --prefix-tokens tokens of the RAG prompt (system + passages), then its question.
      const kvfuse::RagPrompt prompt = prompt_for(tok, all, static_cast<std::size_t>(o.start) + qi, o.prefix_tokens);
      const std::int64_t query_begin = prompt.layout().query.begin;
      // The chunks and the adaptive mode's estimate from the speeds measured so far (before this request).
      const kvfuse::CakeSpeeds speeds = meter.speeds();
      const kvfuse::ChunkSizes sizes = chunks_for(o, speeds, std::min(o.prefix_tokens, query_begin));
      const std::int64_t fetch_chunk = sizes.fetch_chunk;
      const std::int64_t stored = std::min(o.prefix_tokens, query_begin) / fetch_chunk * fetch_chunk;
      const kvfuse::LoaderEstimate estimate = speeds.estimate(sizes.compute_chunk, fetch_chunk);
      predicted += speeds.predicted_ttft_s(stored, sizes.compute_chunk, fetch_chunk);
      chunks.push_back({{"compute_chunk", sizes.compute_chunk}, {"fetch_chunk", fetch_chunk}});
      std::vector<kvfuse::token_id> tokens(prompt.tokens.begin(), prompt.tokens.begin() + stored);
      tokens.insert(tokens.end(), prompt.tokens.begin() + query_begin, prompt.tokens.end());
      // Offline: what an earlier request left in the store, the prompt's first `stored` tokens (and the reference).
      const kvfuse::LlamaPrefill full = model.full_prefill(tokens);
      const auto keys = kvfuse::prefix_chunk_keys(model.fingerprint(), tokens, fetch_chunk);
      for (std::int64_t b = 0; b < stored; b += fetch_chunk)
        inner.put(keys[static_cast<std::size_t>(b / fetch_chunk)], full.kv.to_block({b, b + fetch_chunk}));
      // Every run's chunks and fetches update the speeds for the next request.
      const auto run = [&](const kvfuse::LoaderConfig& config) {
        kvfuse::LoaderTrace t = run_once(model, link, tokens, config, estimate, full, exact);
        meter.observe(t);
        return t;
      };
      // The best static split on the fetch grid, coarse to fine, none run whose load alone is slower than the best.
      kvfuse::LoaderConfig split{sizes.compute_chunk, fetch_chunk};
      split.mode = kvfuse::LoaderMode::static_split;
      const SplitSweep sweep = sweep_static_splits(stored, fetch_chunk, load_token_s, [&](std::int64_t at) {
        split.split = at;
        return run(split).ready_s;
      });
      const double sweep_s = sweep.best_s;
      const std::int64_t best_at = sweep.best_split;
      split.split = best_at;
      // Then Cake, compute-only, load-only and that split, --repeats times each, interleaved; the medians are compared
      // (the sweep's minimum over many noisy runs is biased low: it is reported beside them).
      const kvfuse::LoaderConfig cake_config{sizes.compute_chunk, fetch_chunk};
      kvfuse::LoaderConfig compute_config = cake_config, load_config = cake_config;
      compute_config.mode = kvfuse::LoaderMode::compute_only;
      // Compute-only at its own best: no race keeps its chunks small, so the rule's largest (Cake's 512), whose fixed
      // cost per call is the smallest share; load-only reads the fetch grid the store holds.
      compute_config.compute_chunk = std::max(sizes.compute_chunk, kvfuse::ChunkRule{}.max_chunk);
      load_config.mode = kvfuse::LoaderMode::load_only;
      // Load-only's bytes at the link's nominal speed: a bound on its time.
      const double load_bound_s = static_cast<double>(stored) * load_token_s;
      std::vector<double> cake_s, compute_s, load_s, split_s, meets;
      std::int64_t load_runs = 0;
      for (std::int64_t r = 0; r < o.repeats; ++r) {
        const kvfuse::LoaderTrace t = run(cake_config);
        if (qi == 0 && r == 0 && !o.out.empty()) write_timeline(o.out, t, o);
        cake_s.push_back(t.ready_s);
        meets.push_back(static_cast<double>(t.meet_token));
        compute_s.push_back(run(compute_config).ready_s);
        if (load_bound_s >= *std::max_element(compute_s.begin(), compute_s.end())) {
          load_s.push_back(load_bound_s);  // slower than every compute-only run: not the better single resource
        } else {
          load_s.push_back(run(load_config).ready_s);
          ++load_runs;
        }
        split_s.push_back(run(split).ready_s);
      }
      io_bounded = io_bounded || load_runs < o.repeats;
      per_prompt.push_back({{"question", o.start + static_cast<std::int64_t>(qi)},
                            {"stored_tokens", stored},
                            {"tokens", tokens.size()},
                            {"compute_chunk", sizes.compute_chunk},
                            {"fetch_chunk", fetch_chunk},
                            {"cake_ms", kvfuse::eval::median(cake_s) * 1e3},
                            {"compute_only_ms", kvfuse::eval::median(compute_s) * 1e3},
                            {"io_only_ms", kvfuse::eval::median(load_s) * 1e3},
                            {"io_only_runs", load_runs},
                            {"best_split_ms", kvfuse::eval::median(split_s) * 1e3},
                            {"best_split_token", best_at},
                            {"sweep_min_ms", sweep_s * 1e3},
                            {"sweep_runs", sweep.runs},
                            {"sweep_skipped", sweep.skipped},
                            {"meet_token", kvfuse::eval::median(meets)}});
      cake += kvfuse::eval::median(cake_s);
      meet += kvfuse::eval::median(meets);
      compute_only += kvfuse::eval::median(compute_s);
      io_only += kvfuse::eval::median(load_s);
      best += kvfuse::eval::median(split_s);
      sweep_min += sweep_s;
      best_token += static_cast<double>(best_at);
      tokens_sum += static_cast<double>(tokens.size());
      stored_sum += static_cast<double>(stored);
      for (std::int64_t b = 0; b < stored; b += fetch_chunk) (void)inner.erase(keys[static_cast<std::size_t>(b / fetch_chunk)]);
    }
    const auto n = static_cast<double>(questions.size());
    const double ms = 1000.0 / n;
    nlohmann::json j;
    j["ttft_ms"] = {{"cake", cake * ms}, {"compute_only", compute_only * ms}, {"io_only", io_only * ms},
                    {"best_split", best * ms}, {"best_split_sweep_min", sweep_min * ms}};
    j["repeats"] = o.repeats;
    j["cake_vs_best_split"] = cake / best;
    j["cake_vs_best_single"] = cake / std::min(compute_only, io_only);
    j["predicted_cake_ms"] = predicted * ms;
    j["chunks"] = chunks;
    j["prompts"] = per_prompt;
    j["io_only_is_lower_bound"] = io_bounded;  // some load-only run stood in by its nominal time
    const kvfuse::CakeSpeeds measured = meter.speeds();
    j["speeds_ms"] = {{"compute_call", measured.compute_call_s * 1e3}, {"compute_token", measured.compute_token_s * 1e3},
                      {"fetch_call", measured.fetch_call_s * 1e3}, {"fetch_token", measured.fetch_token_s * 1e3}};
    j["meet_token"] = meet / n;
    j["best_split_token"] = best_token / n;
    j["link_mbps"] = o.link.megabytes_per_s;
    j["link_latency_ms"] = o.link.latency_ms;
    j["measured_link_mbps"] = link.stats().bytes_per_s() / 1e6;
    j["tokens"] = tokens_sum / n;
    j["stored_tokens"] = stored_sum / n;
    j["questions"] = questions.size();
    j["store"] = o.store;
    j["matches_full_prefill"] = exact;
    fmt::print("{}\n", j.dump());
    return exact;
  };
  const bool exact = measure(*store);

  // One request composed of Cake (the stored exact prefix) and a fusion method (the reused chunks).
  const auto composed = [&](kvfuse::AnyKVStore& inner) {
    kvfuse::ThrottledKVStore link(inner, o.link);
    const Question& q = questions.front();
    const std::vector<std::string> passages(q.passages.begin(), q.passages.begin() + std::min<std::size_t>(4, q.passages.size()));
    const kvfuse::RagPrompt prompt = kvfuse::build_rag_prompt(tok, kSystem, passages, q.question);
    const kvfuse::PromptLayout layout = prompt.layout();
    kvfuse::CpuLlamaFusion engine(model);
    kvfuse::FusionPipeline pipeline(engine, link);
    pipeline.store_chunk_caches(prompt.tokens, layout);
    // An earlier request shared the system prompt and passage 1: its prefix entries cover them (the fetch grid
    // rounds up into passage 2, which this request does not reuse as a prefix: Cake stops at passage 1's end).
    const std::int64_t shared = layout.chunks.at(std::min<std::size_t>(1, layout.chunks.size() - 1)).range.end;
    const kvfuse::ChunkSizes sizes = chunks_for(o, meter.speeds(), shared);
    const std::int64_t fetch_chunk = sizes.fetch_chunk;
    pipeline.store_prefix(prompt.tokens,
                          std::min((shared + fetch_chunk - 1) / fetch_chunk * fetch_chunk, layout.query.begin),
                          fetch_chunk);
    const auto t0 = std::chrono::steady_clock::now();
    const kvfuse::LlamaPrefill full = model.full_prefill(prompt.tokens);
    const double full_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    const kvfuse::ComposedResult r = kvfuse::run_composed(pipeline, prompt.tokens, layout, kvfuse::parse_method(o.method),
                                                          kvfuse::LoaderConfig{sizes.compute_chunk, fetch_chunk});
    nlohmann::json j;
    j["composed"] = {{"method", r.fusion.plan.method},
                     {"tokens", prompt.tokens.size()},
                     {"exact_prefix", r.exact_prefix},
                     {"cake_meet_token", r.prefix.meet_token},
                     {"cake_loaded_tokens", r.prefix.loaded_tokens},
                     {"recompute_fraction", r.fusion.recompute_fraction},
                     {"ttft_ms", r.ttft_ms()},
                     {"full_prefill_ttft_ms", full_ms},
                     {"ttft_ratio_vs_full", r.ttft_ms() / full_ms},
                     {"kl_first_token", kvfuse::eval::kl_divergence(full.logits, r.fusion.logits)},
                     {"top1_agrees", kvfuse::argmax_token(full.logits) == kvfuse::argmax_token(r.fusion.logits)},
                     {"layer_pipelined", r.fusion.load.layerwise},
                     {"chunk_load_read_ms", r.fusion.load.read_ms()},
                     {"chunk_load_wait_ms", r.fusion.load.wait_ms()},
                     {"preload_depth", r.fusion.load.depth}};
    fmt::print("{}\n", j.dump());
  };
  if (o.composed == 1) composed(*store);
  // Several requests in one engine (CpuBatchEngine): Cake's token budget decides whose rows run each step, decode
  // first; a request with a stored prefix is a Cake request, its prefix loaded from the back meanwhile.
  bool served_exact = true;
  const auto served = [&](kvfuse::AnyKVStore& inner) {
    kvfuse::ThrottledKVStore link(inner, o.link);
    std::vector<std::vector<kvfuse::token_id>> prompts;
    std::vector<std::vector<kvfuse::token_id>> alone;  // each request served alone: full prefill + greedy
    kvfuse::require(o.start + o.serve <= static_cast<std::int64_t>(all.size()),
                    "--serve: '{}' has {} questions; --start {} --serve {} asks for more", o.data, all.size(), o.start,
                    o.serve);
    // The prefix entries' grid, chosen for --prefix-tokens; each Cake request's compute chunk the engine picks.
    const std::int64_t fetch_chunk = chunks_for(o, meter.speeds(), o.prefix_tokens).fetch_chunk;
    for (std::int64_t i = 0; i < o.serve; ++i) {
      const kvfuse::RagPrompt prompt = prompt_for(tok, all, static_cast<std::size_t>(o.start + i), o.prefix_tokens);
      const std::int64_t query_begin = prompt.layout().query.begin;
      const std::int64_t stored = std::min(o.prefix_tokens, query_begin) / fetch_chunk * fetch_chunk;
      std::vector<kvfuse::token_id> tokens(prompt.tokens.begin(), prompt.tokens.begin() + stored);
      tokens.insert(tokens.end(), prompt.tokens.begin() + query_begin, prompt.tokens.end());
      kvfuse::LlamaPrefill full = model.full_prefill(tokens);
      if (i % 2 == 0) {  // a Cake request: an earlier request left its prefix in the store
        const auto keys = kvfuse::prefix_chunk_keys(model.fingerprint(), tokens, fetch_chunk);
        for (std::int64_t b = 0; b < stored; b += fetch_chunk)
          inner.put(keys[static_cast<std::size_t>(b / fetch_chunk)], full.kv.to_block({b, b + fetch_chunk}));
      }
      alone.push_back(model.greedy_decode(full.kv, full.logits, o.decode_tokens, -1));
      prompts.push_back(std::move(tokens));
    }
    kvfuse::BatchEngineConfig config;
    if (o.compute_chunk > 0) {
      config.budget.token_budget = o.compute_chunk;
    } else {
      config.cake_speeds = meter.speeds();
    }
    config.cake.fetch_chunk = fetch_chunk;
    kvfuse::CpuBatchEngine<decltype(link)> engine(model, link, config);
    std::vector<std::uint64_t> ids;
    for (const std::vector<kvfuse::token_id>& tokens : prompts) {
      kvfuse::GenerationRequest r;
      r.tokens = tokens;
      r.layout = kvfuse::PromptLayout::from_lengths({}, static_cast<std::int64_t>(tokens.size()));
      r.max_new_tokens = o.decode_tokens;
      ids.push_back(engine.submit(std::move(r)));
    }
    std::map<std::uint64_t, std::vector<kvfuse::token_id>> tokens;
    std::map<std::uint64_t, kvfuse::RequestMetrics> metrics;
    std::map<std::uint64_t, std::int64_t> first_step;
    std::int64_t steps = 0;
    for (; !engine.idle(); ++steps) {
      for (const kvfuse::TokenEvent& e : engine.step()) {
        kvfuse::require(e.status == kvfuse::Status::success, "serve: request {}: {}", e.request, e.error);
        if (e.token) {
          first_step.emplace(e.request, steps);
          tokens[e.request].push_back(*e.token);
        }
        if (e.finish != kvfuse::FinishReason::none) metrics[e.request] = e.metrics;
      }
    }
    nlohmann::json j;
    j["serve"]["steps"] = steps;
    j["serve"]["token_budget"] = config.budget.token_budget;
    j["serve"]["fetch_chunk"] = fetch_chunk;
    for (std::size_t i = 0; i < ids.size(); ++i) {
      const kvfuse::RequestMetrics& m = metrics.at(ids[i]);
      const bool same = tokens[ids[i]] == alone[i];
      served_exact = served_exact && same;
      j["serve"]["requests"].push_back({{"id", ids[i]},
                                        {"tokens", prompts[i].size()},
                                        {"stored_prefix", m.stored_prefix},
                                        {"meet_token", m.meet_token},
                                        {"loaded_tokens", m.loaded_tokens},
                                        {"first_token_step", first_step.at(ids[i])},
                                        {"ttft_ms", m.ttft_ms},
                                        {"tokens_equal_alone", same}});
    }
    fmt::print("{}\n", j.dump());
  };
  if (o.serve > 0) served(*store);
  if (temp_dir) fs::remove_all(*temp_dir);
  return exact && served_exact ? 0 : 3;
} catch (const std::exception& e) {
  fmt::print(stderr, "kvfuse-cake-run: {}\n", e.what());
  return 2;
}
