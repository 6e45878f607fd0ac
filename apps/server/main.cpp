// kvfuse-server: an OpenAI-compatible RAG server on kvfuse's batched CPU engine (CpuBatchEngine: continuous
// batching, decodes first within Cake's token budget, kvfuse's chunk-cache fusion through request-keyed hooks), or
// on llama.cpp (--engine llamacpp: LlamaCppBatchEngine, several requests per llama_decode, fixed-set methods).
// The content parts of a message are chunks whose KV is stored once and reused at any position (chat_request.hpp);
// docs/server.md describes the API, the chunks, the errors and the metrics.
//
//   kvfuse-server [--model smollm2|gemma3|qwen2|GGUF] [--engine cpu|llamacpp]
//                 [--store memory|DIR|redis://HOST:PORT|redis-cluster://HOST:PORT,...]
//                 [--method auto|full|naive|cacheblend[@r]|attnlink[@k]|queryaware[@r[:lambda]]|queryprobe[@r]]
//                 [--host 127.0.0.1] [--port 8000] [--threads 0] [--token-budget 512] [--queue-limit 64]
//                 [--max-running 16|4] [--max-body-bytes 4194304] [--max-tokens-default 256] [--region-cells 2048]
//                 [--chunk-context system|none] [--prefix-cache on|off] [--products fp32|bf16]
//
// --model: smollm2 (default), gemma3 or qwen2 as scripts/fetch_model.sh fetches them, or a GGUF path.
// --engine: cpu (default), kvfuse's reference engine; llamacpp (a build with -DKVFUSE_LLAMACPP=ON): llama.cpp's
//   forward pass, fixed-set methods only (full, naive, attnlink; CacheBlend and QueryAware change the recomputed set
//   per layer), models without sliding-window layers (not Gemma 3), --max-running <= 19 (default 4), and
//   --region-cells cells per request (its prompt and answer: the context limit; a multiple of 256). Every step
//   attends over all (max-running + 1) x region-cells cells, the price of answers that do not depend on the batch
//   (docs/llamacpp.md §4), so the defaults are small. Its chunk caches are llama.cpp sequence states, under another
//   fingerprint than the CPU engine's.
// --store: memory (default); a directory: memory over a DiskKVStore there; a Redis URI: memory over Redis, shared
//   by every server on it. New chunk caches are written through to every tier.
// --method: each request's fusion method unless the request names one (the extension field kvfuse.method). auto
//   (default): of the CacheBlend, AttnLink, QueryAware and QueryProbe settings the per-model correctness gate
//   admitted for this model (kvfuse-rag-eval --calibrated caches them under <kvfuse cache>/calibration, default
//   budget) with the
//   server's --chunk-context (kvfuse-rag-eval --chunk-context), the one that recomputes least; CacheBlend's
//   r = 15 % when no such calibration is cached; full prefill when the gate refused
//   every family it measured. On --engine llamacpp, auto considers AttnLink only (the gate's calibration of the
//   same GGUF, measured on the CPU engine), Epic's k = 16 when none is cached. cachecraft[@alpha][-cover] (cpu engine):
//   Cache-Craft with the engine's variant cache (N = 100 chunks x M = 5 variants, §5.1), each chunk computed in full
//   by a request becoming a variant (CpuBatchEngine); not in auto (the gate's Cache-Craft calibration reuses
//   variants of each sample prompt's own passages, recorded in another order: not what a server holds). prefix and
//   cacheblend@auto are refused: the server stores chunk caches and Cake's prefix entries only (no prefix-cache
//   entries on chunk boundaries), and CacheBlend's loading controller runs in FusionPipeline only.
// --chunk-context: system (the cpu engine's default): every chunk cache is computed behind the prompt's system turn
//   (BOS, the system prompt; PromptLayout::chunk_context), which is always computed, so that a part's first tokens
//   are not attention sinks; its key holds the system turn's tokens, so it is reused by requests with the same
//   system prompt. none (llamacpp's only choice): chunk caches computed alone from position 0, the system prompt a
//   chunk like the parts.
// --prefix-cache: on (the cpu engine's default): a prompt without content parts (plain string messages) is full
//   prefill whose whole 128-token chunks, the prompt's and then its answer's, are stored as Cake's prefix entries
//   (BatchEngineConfig::store_prefixes); a later prompt that starts with the same tokens (the same system prompt,
//   earlier turns and answers) loads them from the back while computing from the front (a Cake request;
//   usage.kvfuse.prefix_tokens says how many it found). off (llamacpp's only choice): such prompts are computed with
//   the server's method.
// --products (cpu engine): the precision of the weight projections' products (CpuLlamaOptions::products): fp32
//   (default) anywhere; bf16 on Intel AMX (refused on a CPU without AMX-BF16), faster (docs/server.md), under its own
//   model fingerprint, so that its chunk caches are never mixed with fp32 ones in a shared store and `auto` reads only
//   calibrations made with bf16 products.
// --port 0 binds a free port; the line "kvfuse-server: listening on http://HOST:PORT" says which.
// --queue-limit: requests in the engine at once (queued or running); more are answered 429. --max-running: how many
//   of them run in one step loop (CpuBatchEngine's max_running, default 16; llama.cpp's regions, default 4).
// --max-body-bytes: larger request bodies are answered 413. --max-tokens-default: max_tokens of a request that
//   gives none (capped by the model's context).
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <ctime>
#include <deque>
#include <exception>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <random>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <variant>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include "kvfuse/backend/cpu/batch_engine.hpp"
#include "kvfuse/cpu.hpp"
#if KVFUSE_WITH_LLAMACPP
#include "llamacpp_engine.hpp"
#endif
// After Eigen (kvfuse/cpu.hpp): httplib.h brings <resolv.h>, whose `_res` macro would rewrite Eigen's parameters.
#include <httplib.h>

#include "any_store.hpp"
#include "chat_request.hpp"
#include "metrics.hpp"
#include "musique.hpp"
#include "peer_connection.hpp"
#include "server_method.hpp"
#include "text_stream.hpp"

namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using kvfuse_server::ApiError;
using kvfuse_server::auto_method;
using kvfuse_server::server_method;

struct Options {
  std::string model = "smollm2";
  std::string engine = "cpu";
  std::string store = "memory";
  std::string method = "auto";
  std::string host = "127.0.0.1";
  std::int64_t port = 8000;
  std::int64_t threads = 0;
  std::int64_t token_budget = 512;
  std::int64_t queue_limit = 64;
  std::int64_t max_running = 0;  // 0: the engine's default (cpu 16, llamacpp 4)
  std::int64_t max_body_bytes = 4 << 20;
  std::int64_t max_tokens_default = 256;
  std::int64_t memory_bytes = std::int64_t{2} << 30;
  std::int64_t region_cells = 2048;
  std::string chunk_context;  // system | none; empty: the engine's default (cpu system, llamacpp none)
  std::string prefix_cache;   // on | off; empty: the engine's default (cpu on, llamacpp off)
  kvfuse::CpuProducts products = kvfuse::CpuProducts::fp32;
};

constexpr std::string_view kUsage =
    "usage: kvfuse-server [--model smollm2|gemma3|qwen2|GGUF] [--engine cpu|llamacpp]\n"
    "                     [--store memory|DIR|redis://HOST:PORT|redis-cluster://HOST:PORT,...]\n"
    "                     [--method auto|full|naive|cacheblend[@r]|attnlink[@k]|cachecraft[@alpha][-cover]|\n"
    "                               queryaware[@r[:lambda]]|queryprobe[@r]]\n"
    "                     [--host 127.0.0.1] [--port 8000] [--threads 0] [--token-budget 512] [--queue-limit 64]\n"
    "                     [--max-running 16 (cpu), 4 (llamacpp)] [--max-body-bytes 4194304]\n"
    "                     [--max-tokens-default 256] [--memory-bytes 2147483648] [--region-cells 2048]\n"
    "                     [--chunk-context system (cpu), none (llamacpp)] [--prefix-cache on|off]\n"
    "                     [--products fp32|bf16 (cpu; bf16 needs Intel AMX-BF16)]\n"
    "--method auto: the cheapest setting the calibration gate admitted for the model and chunk context\n"
    "  (kvfuse-rag-eval --calibrated --chunk-context system|none),\n"
    "  cacheblend (r = 15 %) when none is cached, full when the gate refused every family. docs/server.md.\n";

Options parse(int argc, char** argv) {
  Options o;
  bool explicit_running = false;
  using kvfuse_example::parse_int;
  for (int i = 1; i < argc; ++i) {
    const std::string_view flag = argv[i];
    if (flag == "--help" || flag == "-h") {
      fmt::print("{}", kUsage);
      std::exit(0);
    }
    kvfuse::require(i + 1 < argc, "{}: missing value\n{}", flag, kUsage);
    const std::string_view v = argv[++i];
    if (flag == "--model") o.model = v;
    else if (flag == "--engine") o.engine = v;
    else if (flag == "--region-cells") o.region_cells = parse_int(flag, v);
    else if (flag == "--store") o.store = v;
    else if (flag == "--method") o.method = v;
    else if (flag == "--host") o.host = v;
    else if (flag == "--port") o.port = parse_int(flag, v);
    else if (flag == "--threads") o.threads = parse_int(flag, v);
    else if (flag == "--token-budget") o.token_budget = parse_int(flag, v);
    else if (flag == "--queue-limit") o.queue_limit = parse_int(flag, v);
    else if (flag == "--max-running") {
      o.max_running = parse_int(flag, v);
      explicit_running = true;
    }
    else if (flag == "--max-body-bytes") o.max_body_bytes = parse_int(flag, v);
    else if (flag == "--max-tokens-default") o.max_tokens_default = parse_int(flag, v);
    else if (flag == "--memory-bytes") o.memory_bytes = parse_int(flag, v);
    else if (flag == "--chunk-context") o.chunk_context = v;
    else if (flag == "--prefix-cache") o.prefix_cache = v;
    else if (flag == "--products") o.products = kvfuse::parse_products(v);
    else throw kvfuse::error(fmt::format("unknown flag '{}'\n{}", flag, kUsage));
  }
  kvfuse::require(o.port <= 65535, "--port: {} is not a port", o.port);
  kvfuse::require(o.threads <= 1024, "--threads: {} is more than 1024", o.threads);
  kvfuse::require(o.token_budget >= 1, "--token-budget: {} must be >= 1", o.token_budget);
  kvfuse::require(o.queue_limit >= 1 && o.queue_limit <= 4096, "--queue-limit: {} must be in [1, 4096]",
                          o.queue_limit);
  kvfuse::require(o.max_running >= 1 || (o.max_running == 0 && !explicit_running), "--max-running: {} must be >= 1",
                  o.max_running);
  if (o.max_running == 0) o.max_running = o.engine == "llamacpp" ? 4 : 16;
  kvfuse::require(o.max_body_bytes >= 1, "--max-body-bytes: {} must be >= 1", o.max_body_bytes);
  kvfuse::require(o.max_tokens_default >= 1, "--max-tokens-default: {} must be >= 1", o.max_tokens_default);
  kvfuse::require(o.memory_bytes >= 1, "--memory-bytes: {} must be >= 1", o.memory_bytes);
  kvfuse::require(o.engine == "cpu" || o.engine == "llamacpp", "--engine: '{}' is neither cpu nor llamacpp",
                  o.engine);
  kvfuse::require(o.region_cells >= 256 && o.region_cells % 256 == 0 && o.region_cells <= (1 << 20),
                  "--region-cells: {} must be a multiple of 256 in [256, 1048576]", o.region_cells);
  if (o.prefix_cache.empty()) o.prefix_cache = o.engine == "llamacpp" ? "off" : "on";
  kvfuse::require(o.prefix_cache == "on" || o.prefix_cache == "off", "--prefix-cache: '{}' is neither on nor off",
                  o.prefix_cache);
  kvfuse::require(o.engine != "llamacpp" || o.prefix_cache == "off",
                  "--prefix-cache on: the llamacpp engine keeps no prefix entries (Cake's loader runs in the cpu engine)");
  if (o.chunk_context.empty()) o.chunk_context = o.engine == "llamacpp" ? "none" : "system";
  kvfuse::require(o.chunk_context == "system" || o.chunk_context == "none",
                  "--chunk-context: '{}' is neither system nor none", o.chunk_context);
  kvfuse::require(o.engine != "llamacpp" || o.chunk_context == "none",
                  "--chunk-context system: the llamacpp engine stores chunk caches computed alone only (a llama.cpp "
                  "sequence state holds every row of its sequence); use --chunk-context none");
  kvfuse::require(o.engine != "llamacpp" || o.products == kvfuse::CpuProducts::fp32,
                  "--products bf16: the cpu engine's option (llama.cpp computes its products its own way)");
  o.model = kvfuse_example::resolve_model(o.model);
  return o;
}

// One request's events, from the engine thread to the handler thread that waits for them.
struct Channel {
  std::mutex mutex;
  std::condition_variable ready;
  std::deque<kvfuse::TokenEvent> events;
  bool stop_sequence = false;  // the handler ended it at a stop sequence (the engine reports it cancelled)

  // The next event, waiting at most `limit`; nullopt when none came.
  std::optional<kvfuse::TokenEvent> next(std::chrono::milliseconds limit) {
    std::unique_lock lock(mutex);
    if (!ready.wait_for(lock, limit, [this] { return !events.empty(); })) return std::nullopt;
    kvfuse::TokenEvent e = std::move(events.front());
    events.pop_front();
    return e;
  }
};

std::string finish_name(kvfuse::FinishReason f) {
  switch (f) {
    case kvfuse::FinishReason::length: return "length";
    case kvfuse::FinishReason::stop: return "stop";
    case kvfuse::FinishReason::cancelled: return "cancelled";
    case kvfuse::FinishReason::error: return "error";
    case kvfuse::FinishReason::none: break;
  }
  return "none";
}

// What the HTTP side asks of the engine's service.
struct Ticket {
  std::uint64_t id = 0;
  std::shared_ptr<Channel> channel;
};

class ServiceApi {
 public:
  // Queues a request: ApiError 429 when the queue is full; kvfuse::error from the engine for a bad request.
  virtual Ticket submit(kvfuse::GenerationRequest request) = 0;
  virtual void cancel(std::uint64_t id) = 0;
  [[nodiscard]] virtual std::int64_t in_flight() const = 0;
  // Cache-Craft's variants the engine keeps (synchronized itself); nullptr for an engine that keeps none.
  [[nodiscard]] virtual const kvfuse::VariantCache* variants() const = 0;

 protected:
  ~ServiceApi() = default;
};

// The engine (CpuBatchEngine, or LlamaCppEngine on llama.cpp) and its thread: step() while anything is queued or
// running, asleep otherwise. Handler threads submit and read their request's events from its Channel; at most
// `queue_limit` requests are in the engine at once.
template <class Engine>
class Service final : public ServiceApi {
 public:
  template <class... EngineArgs>
  Service(std::size_t queue_limit, kvfuse_server::Metrics& metrics, EngineArgs&&... engine)
      : engine_(std::forward<EngineArgs>(engine)...),
        queue_limit_(queue_limit),
        metrics_(&metrics),
        thread_([this] { loop(); }) {}
  Service(const Service&) = delete;
  Service& operator=(const Service&) = delete;
  ~Service() {
    {
      std::lock_guard lock(mutex_);
      stopping_ = true;
    }
    wake_.notify_one();
    thread_.join();
  }

  [[nodiscard]] Engine& engine() noexcept { return engine_; }

  Ticket submit(kvfuse::GenerationRequest request) override {
    auto channel = std::make_shared<Channel>();
    std::uint64_t id = 0;
    {
      std::lock_guard lock(mutex_);
      if (channels_.size() >= queue_limit_)
        throw ApiError(429, fmt::format("the server is busy: {} requests in the engine (--queue-limit {}); retry later",
                                        channels_.size(), queue_limit_),
                       "", "queue_full", "rate_limit_error");
      id = engine_.submit(std::move(request));
      channels_.emplace(id, channel);
      work_ = true;
    }
    wake_.notify_one();
    return {id, std::move(channel)};
  }

  void cancel(std::uint64_t id) override {
    engine_.cancel(id);
    {
      std::lock_guard lock(mutex_);
      work_ = true;
    }
    wake_.notify_one();
  }

  [[nodiscard]] std::int64_t in_flight() const override {
    std::lock_guard lock(mutex_);
    return static_cast<std::int64_t>(channels_.size());
  }

  [[nodiscard]] const kvfuse::VariantCache* variants() const override {
    if constexpr (requires { engine_.variants(); })
      return &engine_.variants();
    else
      return nullptr;
  }

 private:
  void loop() {
    for (;;) {
      {
        std::unique_lock lock(mutex_);
        wake_.wait(lock, [this] { return work_ || stopping_; });
        if (stopping_) return;
        work_ = false;
      }
      while (!engine_.idle()) {
        std::vector<kvfuse::TokenEvent> events;
        try {
          events = engine_.step();
        } catch (const std::exception& e) {  // not one request's failure: every request in flight ends in error
          fail_all(e.what());
          continue;
        }
        const kvfuse::StepStats& s = engine_.last_step();
        if (s.items > 0) metrics_->step(s.step_ms, s.wait_ms, s.hook_ms, s.decode_rows, s.prefill_rows);
        dispatch(std::move(events));
      }
    }
  }

  void dispatch(std::vector<kvfuse::TokenEvent> events) {
    std::lock_guard lock(mutex_);
    for (kvfuse::TokenEvent& e : events) {
      const auto it = channels_.find(e.request);
      if (it == channels_.end()) continue;  // failed already (fail_all)
      const std::shared_ptr<Channel> channel = it->second;
      const bool last = e.finish != kvfuse::FinishReason::none;
      if (last) {
        std::string reason = finish_name(e.finish);
        {
          std::lock_guard channel_lock(channel->mutex);
          if (channel->stop_sequence) reason = "stop";
        }
        const kvfuse::RequestMetrics& m = e.metrics;
        metrics_->finished(reason, m.prompt_tokens, m.completion_tokens, m.loaded_tokens, m.recomputed_rows,
                           m.ttft_ms, m.completion_tokens > 0 || m.ttft_ms > 0.0);
        channels_.erase(it);
      }
      {
        std::lock_guard channel_lock(channel->mutex);
        channel->events.push_back(std::move(e));
      }
      channel->ready.notify_one();
    }
  }

  void fail_all(const std::string& why) {
    std::vector<kvfuse::TokenEvent> events;
    std::vector<std::uint64_t> ids;
    {
      std::lock_guard lock(mutex_);
      for (const auto& [id, channel] : channels_) ids.push_back(id);
    }
    for (const std::uint64_t id : ids) {
      engine_.cancel(id);
      events.push_back({id, std::nullopt, kvfuse::FinishReason::error, kvfuse::Status::unsupported,
                        fmt::format("engine step failed: {}", why), {}});
    }
    dispatch(std::move(events));
  }

  Engine engine_;
  std::size_t queue_limit_;
  kvfuse_server::Metrics* metrics_;
  mutable std::mutex mutex_;  // guards channels_, work_, stopping_
  std::condition_variable wake_;
  std::map<std::uint64_t, std::shared_ptr<Channel>> channels_;
  bool work_ = false;
  bool stopping_ = false;
  std::thread thread_;  // last: starts after everything it reads
};

std::string sse(const json& j) {
  return "data: " + j.dump(-1, ' ', false, json::error_handler_t::replace) + "\n\n";
}

// The HTTP side: routes, request checks, and the answers of OpenAI's API.
class Api {
 public:
  Api(const Options& o, std::int64_t context_length, const kvfuse::Tokenizer& tok, kvfuse::FusionMethod method,
      ServiceApi& service, kvfuse_server::StoreStack& stores, kvfuse_server::Metrics& metrics)
      : o_(o),
        context_(context_length),
        tok_(tok),
        format_(tok, o.chunk_context == "system"),
        method_(std::move(method)),
        service_(service),
        stores_(stores),
        metrics_(metrics),
        model_id_(fs::path(o.model).stem().string()),
        created_(std::time(nullptr)) {
    for (std::size_t i = 0; i < tok.vocab_size(); ++i) {
      const auto t = static_cast<kvfuse::token_id>(i);
      if (tok.is_end_of_generation(t)) stop_tokens_.push_back(t);
    }
    if (std::find(stop_tokens_.begin(), stop_tokens_.end(), tok.eos()) == stop_tokens_.end() && tok.eos() >= 0)
      stop_tokens_.push_back(tok.eos());
  }

  [[nodiscard]] bool chatml() const noexcept { return format_.chatml(); }

  void routes(httplib::Server& svr) {
    svr.Post("/v1/chat/completions", [this](const httplib::Request& req, httplib::Response& res) {
      try {
        chat(req, res);
      } catch (const ApiError& e) {
        error(res, e);
      } catch (const std::exception& e) {
        error(res, ApiError(500, fmt::format("internal error: {}", e.what()), "", "internal_error", "server_error"));
      }
    });
    svr.Get("/v1/models", [this](const httplib::Request&, httplib::Response& res) {
      const json data = {{"object", "list"},
                         {"data", json::array({{{"id", model_id_},
                                                {"object", "model"},
                                                {"created", created_},
                                                {"owned_by", "kvfuse"}}})}};
      res.set_content(data.dump(), "application/json");
    });
    svr.Get("/health", [this](const httplib::Request&, httplib::Response& res) {
      const json data = {{"status", "ok"},
                         {"model", model_id_},
                         {"method", kvfuse::method_name(method_)},
                         {"store", stores_.description()},
                         {"in_flight", service_.in_flight()},
                         {"queue_limit", o_.queue_limit}};
      res.set_content(data.dump(), "application/json");
    });
    svr.Get("/metrics", [this](const httplib::Request&, httplib::Response& res) {
      kvfuse_server::Gauges g;
      g.in_flight = service_.in_flight();
      g.queue_limit = o_.queue_limit;
      g.store_hits = stores_.hits_per_tier();
      g.store_misses = stores_.store().misses();
      g.redis_unavailable = stores_.redis_unavailable();
      g.redis_rejected = stores_.redis_rejected();
      g.memory_bytes = stores_.memory().bytes();
      g.memory_evictions = stores_.memory().evictions();
      if (const kvfuse::VariantCache* v = service_.variants())
        g.variants = kvfuse_server::VariantGauges{v->size(), v->capacity(), v->inserted_total(), v->evicted_total()};
      res.set_content(metrics_.render(g), "text/plain; version=0.0.4");
    });
    // Answers httplib gives by itself (no route, a body over the limit, an unreadable request) get an error body.
    svr.set_error_handler([this](const httplib::Request& req, httplib::Response& res) {
      if (!res.body.empty() || res.is_chunked_content_provider_) return;
      if (res.status == 404)
        error(res, ApiError(404, fmt::format("no route {} {}", req.method, req.path), "", "not_found"));
      else if (res.status == 413)
        error(res, ApiError(413, fmt::format("the request body is over --max-body-bytes {}", o_.max_body_bytes), "",
                            "request_too_large"));
      else
        error(res, ApiError(res.status, fmt::format("the request could not be read (HTTP {})", res.status)));
    });
    svr.set_logger([this](const httplib::Request& req, const httplib::Response& res) {
      static const std::vector<std::string> known{"/v1/chat/completions", "/v1/models", "/health", "/metrics"};
      const bool is_known = std::find(known.begin(), known.end(), req.path) != known.end();
      metrics_.response(is_known ? req.path : "other", res.status);
    });
  }

 private:
  static void error(httplib::Response& res, const ApiError& e) {
    res.status = e.status();
    res.set_content(e.body().dump(-1, ' ', false, json::error_handler_t::replace), "application/json");
  }

  void chat(const httplib::Request& req, httplib::Response& res) {
    json body;
    try {
      body = json::parse(req.body);
    } catch (const json::parse_error& e) {
      throw ApiError(400, fmt::format("the request body is not valid JSON: {}", e.what()), "", "invalid_json");
    }
    const kvfuse_server::ChatRequest c = kvfuse_server::parse_chat_request(body);
    kvfuse::FusionMethod method = method_;
    if (c.method) {
      try {
        method = server_method(*c.method, o_.engine);
      } catch (const kvfuse::error& e) {
        throw ApiError(400, fmt::format("kvfuse.method: {}", e.what()), "kvfuse.method", "invalid_value");
      }
    }
    kvfuse_server::ChatPrompt prompt;
    try {
      prompt = format_.build(c.messages);
    } catch (const kvfuse::error& e) {
      throw ApiError(400, fmt::format("messages: {}", e.what()), "messages", "invalid_value");
    }
    const auto n = static_cast<std::int64_t>(prompt.tokens.size());
    const std::int64_t context = context_;
    if (context > 0 && n >= context)
      throw ApiError(400, fmt::format("messages: the prompt is {} tokens; the model's context is {} tokens", n, context),
                     "messages", "context_length_exceeded");
    kvfuse::GenerationRequest g;
    g.max_new_tokens = c.max_tokens.value_or(context > 0 ? std::min(o_.max_tokens_default, context - n)
                                                         : o_.max_tokens_default);
    g.tokens = prompt.tokens;
    g.layout = prompt.layout;
    // A prompt without content parts has no chunk to reuse: full prefill, which with the prefix cache loads the stored
    // KV of the tokens it starts with (the system prompt and earlier turns of a conversation) by Cake.
    const bool parts = std::any_of(prompt.layout.chunks.begin(), prompt.layout.chunks.end(),
                                   [](const kvfuse::PromptChunk& ch) { return ch.cached; });
    g.method = !parts && o_.prefix_cache == "on" ? kvfuse::FusionMethod(kvfuse::FullRecompute{}) : method;
    g.stop_tokens = stop_tokens_;
    g.temperature = c.temperature;
    g.seed = c.seed.value_or(std::random_device{}());
    Ticket ticket;
    try {
      ticket = service_.submit(std::move(g));
    } catch (const kvfuse::error& e) {
      const bool context_error = e.code() == kvfuse::Status::beyond_context;
      throw ApiError(400, e.what(), context_error && c.max_tokens ? "max_tokens" : "messages",
                     context_error ? "context_length_exceeded" : "invalid_value");
    }
    auto state = std::make_shared<Generation>(tok_, c, std::move(ticket), n, prompt.layout, model_id_);
    if (!c.stream) {
      // Nothing is written until the answer is whole, so a client that went away is found in the kernel's socket
      // table (PeerWatch), asked every quarter of a second: the engine frees its request.
      kvfuse_server::PeerWatch peer(req.local_addr, req.local_port, req.remote_addr, req.remote_port);
      bool cancelled = false;
      auto check = std::chrono::steady_clock::now();
      while (!state->finished) {
        state->take(std::chrono::milliseconds(250), service_);
        if (cancelled || state->finished || std::chrono::steady_clock::now() < check) continue;
        check = std::chrono::steady_clock::now() + std::chrono::milliseconds(250);
        if (peer.gone()) {
          service_.cancel(state->ticket.id);
          cancelled = true;
        }
      }
      if (state->error) throw ApiError(500, *state->error, "", "engine_error", "server_error");
      json message = {{"role", "assistant"}, {"content", state->text.text()}};
      const json out = {{"id", state->id},
                        {"object", "chat.completion"},
                        {"created", state->created},
                        {"model", model_id_},
                        {"choices", json::array({{{"index", 0},
                                                  {"message", message},
                                                  {"logprobs", nullptr},
                                                  {"finish_reason", state->finish_reason}}})},
                        {"usage", state->usage()}};
      res.set_content(out.dump(-1, ' ', false, json::error_handler_t::replace), "application/json");
      return;
    }
    res.set_header("Cache-Control", "no-cache");
    res.set_chunked_content_provider(
        "text/event-stream",
        [this, state](std::size_t, httplib::DataSink& sink) {
          const auto send = [&sink](const std::string& s) { return sink.write(s.data(), s.size()); };
          const auto gone = [&] {  // the client went away: the engine frees the request
            service_.cancel(state->ticket.id);
            return false;
          };
          if (!send(sse(state->chunk({{"role", "assistant"}, {"content", ""}}, nullptr)))) return gone();
          while (!state->finished) {
            const std::optional<std::string> text = state->take(std::chrono::milliseconds(1000), service_);
            if (!text) {  // nothing for a second: an SSE comment, which also finds a client that went away
              if (!send(": keep-alive\n\n")) return gone();
              continue;
            }
            if (!text->empty() && !send(sse(state->chunk({{"content", *text}}, nullptr)))) return gone();
          }
          if (state->error) {
            send(sse(ApiError(500, *state->error, "", "engine_error", "server_error").body()));
          } else {
            send(sse(state->chunk(json::object(), state->finish_reason)));
            if (state->include_usage) {
              json last = state->chunk(json::object(), nullptr);
              last["choices"] = json::array();
              last["usage"] = state->usage();
              send(sse(last));
            }
          }
          send("data: [DONE]\n\n");
          sink.done();
          return true;
        },
        [this, state](bool) {
          if (!state->finished) service_.cancel(state->ticket.id);
        });
  }

  // One request on its way: the events read so far as text, the finish and kvfuse's figures.
  struct Generation {
    Generation(const kvfuse::Tokenizer& tok, const kvfuse_server::ChatRequest& c, Ticket t,
               std::int64_t prompt, const kvfuse::PromptLayout& layout, const std::string& model)
        : ticket(std::move(t)),
          text(tok, c.stop),
          include_usage(c.include_usage),
          prompt_tokens(prompt),
          id(fmt::format("chatcmpl-{:x}-{:x}", ticket.id, std::random_device{}())),
          created(std::time(nullptr)),
          model_id(model) {
      for (const kvfuse::PromptChunk& ch : layout.chunks) {
        if (!ch.cached) continue;
        ++chunks;
        chunk_tokens += ch.range.size();
      }
    }

    // Waits up to `limit` for the next event; nullopt when none came, else the text it releases (possibly empty).
    std::optional<std::string> take(std::chrono::milliseconds limit, ServiceApi& service) {
      std::optional<kvfuse::TokenEvent> e = ticket.channel->next(limit);
      if (!e) return std::nullopt;
      std::string out;
      if (e->token && !text.stopped()) {
        ++completion_tokens;
        out = text.push(*e->token);
        if (text.stopped()) {  // a stop sequence: the engine stops generating; its last event comes as cancelled
          {
            std::lock_guard lock(ticket.channel->mutex);
            ticket.channel->stop_sequence = true;
          }
          service.cancel(ticket.id);
        }
      }
      if (e->finish == kvfuse::FinishReason::none) return out;
      finished = true;
      metrics = e->metrics;
      if (e->finish == kvfuse::FinishReason::error) {
        error = e->error;
        return out;
      }
      out += text.finish();
      finish_reason = text.stopped() || e->finish == kvfuse::FinishReason::stop ? "stop" : "length";
      return out;
    }

    [[nodiscard]] json chunk(json delta, json finish) const {
      return {{"id", id},
              {"object", "chat.completion.chunk"},
              {"created", created},
              {"model", model_id},
              {"choices", json::array({{{"index", 0},
                                        {"delta", std::move(delta)},
                                        {"logprobs", nullptr},
                                        {"finish_reason", std::move(finish)}}})}};
    }

    [[nodiscard]] json usage() const {
      return {{"prompt_tokens", prompt_tokens},
              {"completion_tokens", completion_tokens},
              {"total_tokens", prompt_tokens + completion_tokens},
              {"kvfuse",
               {{"method", metrics.method},
                {"chunks", chunks},
                {"chunk_tokens", chunk_tokens},
                {"loaded_tokens", metrics.loaded_tokens},
                {"recomputed_tokens", metrics.recomputed_rows},
                {"prefix_tokens", metrics.stored_prefix},
                {"ttft_ms", metrics.ttft_ms},
                {"restarts", metrics.restarts}}}};
    }

    Ticket ticket;
    kvfuse_server::TextStream text;
    bool include_usage;
    std::int64_t prompt_tokens;
    std::string id;
    std::time_t created;
    std::string model_id;
    std::int64_t chunks = 0;        // reusable chunks of the prompt
    std::int64_t chunk_tokens = 0;  // their tokens
    std::int64_t completion_tokens = 0;
    bool finished = false;
    std::string finish_reason;
    std::optional<std::string> error;
    kvfuse::RequestMetrics metrics;
  };

  const Options& o_;
  std::int64_t context_;  // tokens of a prompt and its answer (0: no limit known)
  const kvfuse::Tokenizer& tok_;
  kvfuse_server::PromptFormat format_;
  kvfuse::FusionMethod method_;
  ServiceApi& service_;
  kvfuse_server::StoreStack& stores_;
  kvfuse_server::Metrics& metrics_;
  std::string model_id_;
  std::time_t created_;
  std::vector<kvfuse::token_id> stop_tokens_;
};

// Serves HTTP until SIGINT or SIGTERM; 0 when it stopped on a signal.
int serve(const Options& o, const Api& api_for_log, httplib::Server& svr, const std::string& engine_line,
          const kvfuse_server::StoreStack& stores, const kvfuse::FusionMethod& method, const std::string& why,
          sigset_t stop_signals) {
  // Each streamed request holds a thread while it runs; the rest answer health, metrics and 429s.
  const std::size_t http_threads = static_cast<std::size_t>(2 * o.queue_limit + 8);
  svr.new_task_queue = [http_threads] { return new httplib::ThreadPool(http_threads); };
  svr.set_payload_max_length(static_cast<std::size_t>(o.max_body_bytes));
  int port = static_cast<int>(o.port);
  if (port == 0) {
    port = svr.bind_to_any_port(o.host);
    kvfuse::require(port > 0, "--host {}: cannot bind a port", o.host);
  } else {
    kvfuse::require(svr.bind_to_port(o.host, port), "--host {} --port {}: cannot bind", o.host, port);
  }
  fmt::print(stderr, "kvfuse-server: model {} ({}, {}), store {}, method {} ({})\n", o.model, engine_line,
             api_for_log.chatml() ? "ChatML" : "plain text", stores.description(), kvfuse::method_name(method), why);
  fmt::print(stderr, "kvfuse-server: listening on http://{}:{}\n", o.host, port);
  std::fflush(stderr);

  std::atomic<bool> signalled{false};
  std::thread signals([&svr, &stop_signals, &signalled] {
    int sig = 0;
    sigwait(&stop_signals, &sig);
    signalled = true;
    svr.stop();
  });
  const bool served = svr.listen_after_bind();
  if (!signalled) kill(getpid(), SIGTERM);  // listen ended by itself: the signal thread takes this one and returns
  signals.join();
  fmt::print(stderr, "kvfuse-server: stopped\n");
  return served ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) try {
  const Options o = parse(argc, argv);
  // SIGINT / SIGTERM go to one thread that stops the HTTP server; a client gone mid-write is an error, not SIGPIPE.
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGINT);
  sigaddset(&stop_signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);
  signal(SIGPIPE, SIG_IGN);

  const kvfuse::GGUFFile file = kvfuse::GGUFFile::open(o.model);
  const kvfuse::Tokenizer tok = kvfuse::Tokenizer::from_gguf(file);
  kvfuse::CpuLlamaOptions model_options;
  model_options.threads = static_cast<int>(o.threads);
  model_options.products = o.products;
  kvfuse_server::StoreStack stores(o.store, o.memory_bytes);
  kvfuse_server::Metrics metrics;
  const auto queue_limit = static_cast<std::size_t>(o.queue_limit);
  std::string why = "--method";
  httplib::Server svr;

  if (o.engine == "cpu") {
    const kvfuse::CpuLlama model = kvfuse::CpuLlama::from_gguf(file, model_options);
    const kvfuse::FusionMethod method =
        o.method == "auto"
            ? auto_method(kvfuse_example::cache_dir() / "calibration", model.fingerprint(), o.engine, o.chunk_context,
                          why)
            : server_method(o.method, o.engine);
    kvfuse::BatchEngineConfig config;
    config.budget.token_budget = o.token_budget;
    config.max_running = static_cast<std::size_t>(o.max_running);
    std::string cake;
    if (o.prefix_cache == "on") {
      config.store_prefixes = true;
      // Cake's compute chunk from measured speeds (choose_chunk_sizes): the engine's compute line measured now, the
      // store's fetches learnt as requests run (a memory tier first: free until measured otherwise).
      std::vector<kvfuse::token_id> probe(256);
      for (std::size_t i = 0; i < probe.size(); ++i)
        probe[i] = static_cast<kvfuse::token_id>(i % static_cast<std::size_t>(model.config().n_vocab));
      config.cake_speeds = kvfuse::measure_cake_speeds(model, probe);
      cake = fmt::format(", prefix cache (Cake; compute {:.2f} ms + {:.3f} ms/token)",
                         1e3 * config.cake_speeds->compute_call_s, 1e3 * config.cake_speeds->compute_token_s);
    }
    Service<kvfuse::CpuBatchEngine<kvfuse::AnyKVStore>> service(queue_limit, metrics, model, stores.store(), config);
    Api api(o, model.config().context_length, tok, method, service, stores, metrics);
    api.routes(svr);
    return serve(o, api, svr,
                 fmt::format("cpu engine, {} layers, context {}, {} threads, {} products{}", model.config().n_layer,
                             model.config().context_length, model.threads(), kvfuse::products_name(o.products), cake),
                 stores, method, why, stop_signals);
  }
#if KVFUSE_WITH_LLAMACPP
  kvfuse::FusionMethod method;
  if (o.method == "auto") {  // the gate's calibrations are keyed by the CPU engine's fingerprint of the same GGUF
    const kvfuse::CpuLlama model = kvfuse::CpuLlama::from_gguf(file, model_options);
    method =
        auto_method(kvfuse_example::cache_dir() / "calibration", model.fingerprint(), o.engine, o.chunk_context, why);
  } else {
    method = server_method(o.method, o.engine);
  }
  kvfuse::llamacpp::BatchOptions options;
  options.llama.threads = static_cast<int>(o.threads);
  options.llama.n_batch = options.llama.n_ubatch = static_cast<std::uint32_t>(o.token_budget);
  options.llama.attention_statistics = false;
  options.max_requests = static_cast<std::uint32_t>(o.max_running);
  options.region_cells = static_cast<std::uint32_t>(o.region_cells);
  Service<kvfuse_server::LlamaCppEngine> service(queue_limit, metrics, fs::path(o.model), stores.store(), options);
  const kvfuse_server::LlamaCppEngine& engine = service.engine();
  Api api(o, engine.context_length(), tok, method, service, stores, metrics);
  api.routes(svr);
  return serve(o, api, svr,
               fmt::format("llama.cpp engine, {} layers, {} cells per request, {} running, {} threads",
                           engine.num_layers(), engine.context_length(), o.max_running, engine.threads()),
               stores, method, why, stop_signals);
#else
  throw kvfuse::error("--engine llamacpp: this kvfuse-server was built without the llama.cpp integration "
                      "(configure with -DKVFUSE_LLAMACPP=ON after scripts/fetch_llamacpp.sh)");
#endif
} catch (const std::exception& e) {
  fmt::print(stderr, "kvfuse-server: {}\n", e.what());
  return 2;
}
