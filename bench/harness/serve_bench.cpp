// kvfuse-serve-bench: continuous batching with kvfuse's request-keyed hooks against today's one-at-a-time pipeline
// and batched full prefill, on the same Poisson arrivals of MuSiQue RAG requests.
//
//   kvfuse-serve-bench [--model smollm2|gemma3|GGUF] [--data ../shared/data/musique_dev.json] [--requests 24]
//                      [--rate 1.0] [--method cacheblend] [--passages 3] [--pool 12] [--zipf 1.0]
//                      [--max-tokens 16] [--budget 512] [--threads 0] [--seed 1] [--out DIR]
//
// Requests: question i of the file (i = 0 .. N − 1, wrapping), with P passages drawn without replacement, Zipf(s)
// over a pool of --pool passages (the first passages of the file's first questions), in the drawn order, so chunks
// recur in new orders and positions; the RAG prompt of kvfuse-rag-eval (system, "Document: ..." per passage,
// question) in the model's chat template; --max-tokens greedy tokens each. Arrivals: a Poisson process of rate R
// per second (exponential gaps, --seed). Chunk caches of the pool are stored before the arms (offline, as the papers
// generate them), in an InMemoryKVStore.
// Arms, one after the other on the same arrivals (real time, the steady clock):
//   full           CpuBatchEngine, FullRecompute for every request (chunked prefill under the token budget, batched)
//   one_at_a_time  FusionPipeline (the single-request driver) with --method, requests in arrival order, each
//                  prefill then its greedy decode (CpuLlama::extend) before the next starts
//   batched        CpuBatchEngine with --method: decode first, Cake's token budget, FusionConnector's hooks
// Prints one JSON line:
//   {"throughput_tok_s": {"batched", "one_at_a_time", "full"}, "ttft_ms": {"p50", "p99"} (batched),
//    "ttft_ms_one_at_a_time": {...}, "ttft_ms_full": {...}, "equal_alone": bool, "hook_overhead": share, ...}
// throughput: generated tokens / (last finish − first arrival); TTFT: first token − arrival; equal_alone: every
// request's tokens in the batched arm equal its tokens in the one-at-a-time arm (each request alone, same method,
// same store); hook_overhead: time inside kvfuse's per-layer hooks (FusionConnector's wait_for_layer not counting
// the blocked wait, after_layer with the method's policy) / step time, summed over the batched arm's steps;
// load_wait_share: the blocked waits / step time; install_share: the engine copying loaded layers into its KV and
// RoPE-shifting them / step time. --out DIR also gets serve_bench.json (the line plus per-request data).

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "kvfuse/backend/cpu/batch_engine.hpp"
#include "kvfuse/backend/in_memory_store.hpp"
#include "kvfuse/cpu.hpp"
#include "kvfuse/fusion/fusion_pipeline.hpp"
#include "kvfuse/harness/bench_build.hpp"
#include "kvfuse/harness/rag_prompt.hpp"

#include "../../examples/musique.hpp"

namespace {

using Clock = std::chrono::steady_clock;
constexpr std::string_view kSystem = "You are a helpful assistant. Answer the question using the documents, in a few words.";

struct Options {
  std::string model = "smollm2", data = "../shared/data/musique_dev.json", method = "cacheblend", out;
  std::int64_t requests = 24, passages = 3, pool = 12, max_tokens = 16, budget = 512, threads = 0, seed = 1;
  double rate = 1.0, zipf = 1.0;
};

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    kvfuse::require(i + 1 < argc, "{} needs a value", flag);
    const std::string v = argv[++i];
    using kvfuse_example::parse_int;
    using kvfuse_example::parse_real;
    if (flag == "--model") o.model = v;
    else if (flag == "--data") o.data = v;
    else if (flag == "--method") o.method = v;
    else if (flag == "--out") o.out = v;
    else if (flag == "--requests") o.requests = parse_int(flag, v);
    else if (flag == "--passages") o.passages = parse_int(flag, v);
    else if (flag == "--pool") o.pool = parse_int(flag, v);
    else if (flag == "--max-tokens") o.max_tokens = parse_int(flag, v);
    else if (flag == "--budget") o.budget = parse_int(flag, v);
    else if (flag == "--threads") o.threads = parse_int(flag, v);
    else if (flag == "--seed") o.seed = parse_int(flag, v);
    else if (flag == "--rate") o.rate = parse_real(flag, v);
    else if (flag == "--zipf") o.zipf = parse_real(flag, v);
    else throw kvfuse::error(fmt::format("unknown flag '{}'", flag));
  }
  kvfuse::require(o.requests >= 1 && o.passages >= 1 && o.pool >= o.passages && o.max_tokens >= 1,
                          "--requests {} --passages {} --pool {} --max-tokens {}: need requests, passages, max-tokens "
                          ">= 1 and pool >= passages",
                          o.requests, o.passages, o.pool, o.max_tokens);
  kvfuse::require(o.rate > 0 && std::isfinite(o.rate), "--rate {} must be > 0", o.rate);
  (void)kvfuse::parse_method(o.method);
  return o;
}

struct Request {
  kvfuse::RagPrompt prompt;
  double arrival_s = 0;
};

struct ArmResult {
  std::vector<std::vector<kvfuse::token_id>> tokens;  // per request
  std::vector<double> ttft_ms;                        // first token − arrival
  double makespan_s = 0;                              // last finish − first arrival
  double hook_ms = 0, step_ms = 0, wait_ms = 0, install_ms = 0;
  std::int64_t steps = 0;

  [[nodiscard]] double throughput() const {
    std::int64_t n = 0;
    for (const auto& t : tokens) n += static_cast<std::int64_t>(t.size());
    return static_cast<double>(n) / makespan_s;
  }
};

double percentile(std::vector<double> v, double p) {
  std::sort(v.begin(), v.end());
  const double at = p * static_cast<double>(v.size() - 1);
  const auto lo = static_cast<std::size_t>(std::floor(at));
  const std::size_t hi = std::min(lo + 1, v.size() - 1);
  return v[lo] + (v[hi] - v[lo]) * (at - static_cast<double>(lo));
}

double since_s(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

// The engine arms: submit each request at its arrival time, step while anything runs.
ArmResult run_engine(const kvfuse::CpuLlama& model, kvfuse::InMemoryKVStore& store, const std::vector<Request>& rs,
                     const std::string& method, const Options& o) {
  kvfuse::BatchEngineConfig config;
  config.budget.token_budget = o.budget;
  kvfuse::CpuBatchEngine<kvfuse::InMemoryKVStore> engine(model, store, config);
  ArmResult out;
  out.tokens.resize(rs.size());
  out.ttft_ms.assign(rs.size(), 0.0);
  std::map<std::uint64_t, std::size_t> index;
  std::size_t next = 0;
  std::size_t done = 0;
  const auto t0 = Clock::now();
  while (done < rs.size()) {
    const double now = since_s(t0);
    while (next < rs.size() && rs[next].arrival_s <= now) {
      kvfuse::GenerationRequest g;
      g.tokens = rs[next].prompt.tokens;
      g.layout = rs[next].prompt.layout();
      g.method = kvfuse::parse_method(method);
      g.max_new_tokens = o.max_tokens;
      index[engine.submit(std::move(g))] = next;
      ++next;
    }
    if (engine.idle()) {
      std::this_thread::sleep_for(std::chrono::duration<double>(rs[next].arrival_s - since_s(t0)));
      continue;
    }
    for (const kvfuse::TokenEvent& e : engine.step()) {
      const std::size_t i = index.at(e.request);
      kvfuse::require(e.status == kvfuse::Status::success, "request {}: {}", i, e.error);
      if (e.token) {
        if (out.tokens[i].empty()) out.ttft_ms[i] = (since_s(t0) - rs[i].arrival_s) * 1e3;
        out.tokens[i].push_back(*e.token);
      }
      if (e.finish != kvfuse::FinishReason::none) {
        ++done;
        out.makespan_s = since_s(t0) - rs.front().arrival_s;
      }
    }
    out.hook_ms += engine.last_step().hook_ms;
    out.wait_ms += engine.last_step().wait_ms;
    out.install_ms += engine.last_step().install_ms;
    out.step_ms += engine.last_step().step_ms;
    ++out.steps;
  }
  return out;
}

// Today's driver: one request at a time, prefill then decode, in arrival order.
ArmResult run_one_at_a_time(const kvfuse::CpuLlama& model, kvfuse::InMemoryKVStore& store,
                            const std::vector<Request>& rs, const Options& o) {
  kvfuse::CpuLlamaFusion engine(model);
  kvfuse::FusionPipeline pipeline(engine, store);
  ArmResult out;
  out.tokens.resize(rs.size());
  out.ttft_ms.assign(rs.size(), 0.0);
  const auto t0 = Clock::now();
  for (std::size_t i = 0; i < rs.size(); ++i) {
    const double wait = rs[i].arrival_s - since_s(t0);
    if (wait > 0) std::this_thread::sleep_for(std::chrono::duration<double>(wait));
    const kvfuse::FusionResult r =
        pipeline.run(rs[i].prompt.tokens, rs[i].prompt.layout(), kvfuse::parse_method(o.method));
    out.ttft_ms[i] = (since_s(t0) - rs[i].arrival_s) * 1e3;
    out.tokens[i] = model.greedy_decode(engine.kv(), r.logits, o.max_tokens, -1);
    out.makespan_s = since_s(t0) - rs.front().arrival_s;
  }
  return out;
}

nlohmann::json ttft(const ArmResult& a) {
  return {{"p50", percentile(a.ttft_ms, 0.5)}, {"p99", percentile(a.ttft_ms, 0.99)}};
}

}  // namespace

int main(int argc, char** argv) {
  kvfuse::harness::refuse_check_only_build("kvfuse-serve-bench");
  try {
    const Options o = parse(argc, argv);
    const std::string path = kvfuse_example::resolve_model(o.model);
    kvfuse::require(std::filesystem::exists(path), "--model: '{}' does not exist (scripts/fetch_model.sh all)",
                            path);
    const kvfuse::GGUFFile file = kvfuse::GGUFFile::open(path);
    const kvfuse::Tokenizer tok = kvfuse::Tokenizer::from_gguf(file);
    kvfuse::CpuLlamaOptions options;
    options.threads = static_cast<int>(o.threads);
    const kvfuse::CpuLlama model = kvfuse::CpuLlama::from_gguf(file, options);

    // The pool: the first passages of the first questions; requests draw Zipf over it.
    const std::int64_t questions = kvfuse_example::question_count(o.data);
    const std::vector<kvfuse_example::Question> qs =
        kvfuse_example::load_questions(o.data, 0, std::min<std::int64_t>(questions, o.requests), 10);
    std::vector<std::string> pool;
    for (std::size_t k = 0; static_cast<std::int64_t>(pool.size()) < o.pool; ++k) {
      kvfuse::require(k < 10 * qs.size(), "--pool {}: the questions hold fewer passages", o.pool);
      const auto& q = qs[k % qs.size()];
      if (k / qs.size() < q.passages.size()) pool.push_back(q.passages[k / qs.size()]);
    }
    std::mt19937_64 rng(static_cast<std::uint64_t>(o.seed));
    std::vector<double> weights;
    for (std::int64_t k = 1; k <= o.pool; ++k) weights.push_back(1.0 / std::pow(static_cast<double>(k), o.zipf));
    std::exponential_distribution<double> gap(o.rate);
    std::vector<Request> rs;
    double t = 0;
    for (std::int64_t i = 0; i < o.requests; ++i) {
      std::vector<double> w = weights;
      std::vector<std::string> passages;
      for (std::int64_t p = 0; p < o.passages; ++p) {
        std::discrete_distribution<std::size_t> pick(w.begin(), w.end());
        const std::size_t k = pick(rng);
        w[k] = 0;  // without replacement
        passages.push_back(pool[k]);
      }
      const auto& q = qs[static_cast<std::size_t>(i) % qs.size()];
      rs.push_back({kvfuse::build_rag_prompt(tok, kSystem, passages, q.question), t});
      t += gap(rng);
    }

    kvfuse::InMemoryKVStore store;
    {
      kvfuse::CpuLlamaFusion engine(model);
      kvfuse::FusionPipeline pipeline(engine, store);
      for (const Request& r : rs) pipeline.store_chunk_caches(r.prompt.tokens, r.prompt.layout());
    }

    const ArmResult full = run_engine(model, store, rs, "full", o);
    const ArmResult one = run_one_at_a_time(model, store, rs, o);
    const ArmResult batched = run_engine(model, store, rs, o.method, o);

    bool equal_alone = true;
    for (std::size_t i = 0; i < rs.size(); ++i) equal_alone = equal_alone && batched.tokens[i] == one.tokens[i];
    nlohmann::json line = {
        {"throughput_tok_s", {{"batched", batched.throughput()}, {"one_at_a_time", one.throughput()},
                              {"full", full.throughput()}}},
        {"ttft_ms", ttft(batched)},
        {"ttft_ms_one_at_a_time", ttft(one)},
        {"ttft_ms_full", ttft(full)},
        {"equal_alone", equal_alone},
        {"hook_overhead", batched.hook_ms / batched.step_ms},
        {"load_wait_share", batched.wait_ms / batched.step_ms},
        {"install_share", batched.install_ms / batched.step_ms},
        {"steps", batched.steps},
        {"method", o.method},
        {"requests", o.requests},
        {"rate", o.rate},
        {"passages", o.passages},
        {"pool", o.pool},
        {"model", o.model},
        {"threads", model.threads()},
    };
    std::cout << line.dump() << std::endl;
    if (!o.out.empty()) {
      std::filesystem::create_directories(o.out);
      nlohmann::json all = line;
      for (std::size_t i = 0; i < rs.size(); ++i) {
        all["requests_detail"].push_back({{"arrival_s", rs[i].arrival_s},
                                          {"prompt_tokens", rs[i].prompt.tokens.size()},
                                          {"ttft_ms", {{"batched", batched.ttft_ms[i]},
                                                       {"one_at_a_time", one.ttft_ms[i]},
                                                       {"full", full.ttft_ms[i]}}},
                                          {"equal", batched.tokens[i] == one.tokens[i]}});
      }
      std::ofstream(std::filesystem::path(o.out) / "serve_bench.json") << all.dump(2) << "\n";
    }
    return 0;
  } catch (const std::exception& e) {
    std::cerr << "kvfuse-serve-bench: " << e.what() << "\n";
    return 2;
  }
}
