// kvfuse-bench-store: put / get throughput and latency of the KV stores on real chunk KV, and what lz4 / zstd
// compression (CompressedKVStore) saves and costs.
//
//   kvfuse-bench-store [--model GGUF] [--data musique_dev.json] [--questions 2] [--passages 5] [--dtype f32]
//                      [--repeats 5] [--iterations 4] [--link-mbps 0] [--dir DIR] [--json FILE]
//                      [--redis redis://HOST:PORT]
//
// KV: SmolLM2 (--model, else $KVFUSE_MODEL, else the file scripts/fetch_model.sh caches) on the CPU backend. For
// each of the first --questions MuSiQue questions, the RAG prompt of kvfuse-rag-eval (system prompt, up to
// --passages passages, question) goes through FusionPipeline::store_chunk_caches: every chunk's isolated KV, as
// CpuLlamaFusion stores it (--dtype f32, f16 or bf16), is one block.
//
// Stores: memory (InMemoryKVStore), disk (DiskKVStore in a fresh directory under --dir, default the system's
// temporary directory; reads come from the page cache, so this is the CPU cost, not the device's), and
// CompressedKVStore over disk with lz4 and zstd levels 1 and 3, each without and with the byte shuffle of the KV's
// element size; with --redis, RedisKVStore on that server (which the user starts) and the same codecs over it
// (the run erases its keys at the end). --link-mbps M puts a ThrottledKVStore of M MB/s
// (a remote tier or a slow device) between each store and its backing, so compressed entries cross the link
// compressed; the link throttles gets only.
//
// Measured --repeats times, the stores taking turns within each repeat: --iterations rounds of putting every
// block (replacing the previous round's entries), then getting every block (each checked bit for bit against
// the original, outside the timed region). Reported: throughput in MB/s of raw KV (10^6 bytes), the median over
// repeats; p50 / p99 latency of one put and one get over all of them; stored / raw, the bytes handed to the
// backing store per raw KV byte (CodecStats; the disk and Redis entry headers, 0.02 %, not counted); and for the
// compressed stores the codec's own speed (raw bytes per
// second spent compressing / decompressing, each with its XXH3). Errors print "kvfuse-bench-store: <message>",
// exit 2.

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "kvfuse/backend/compressed_kv_store.hpp"
#include "kvfuse/backend/disk_kv_store.hpp"
#include "kvfuse/backend/in_memory_store.hpp"
#include "kvfuse/backend/throttled_kv_store.hpp"
#include "kvfuse/cpu.hpp"
#include "kvfuse/harness/bench_build.hpp"
#include "kvfuse/harness/metrics.hpp"
#include "kvfuse/harness/rag_prompt.hpp"
#include "kvfuse/runtime.hpp"
#ifdef KVFUSE_BENCH_REDIS
#include "kvfuse/backend/redis_kv_store.hpp"
#endif

#include "../examples/musique.hpp"

namespace {

using kvfuse::require;
using Clock = std::chrono::steady_clock;
namespace fs = std::filesystem;

#ifdef KVFUSE_SOURCE_DIR
constexpr const char* kDefaultData = KVFUSE_SOURCE_DIR "/../shared/data/musique_dev.json";
#else
constexpr const char* kDefaultData = "../shared/data/musique_dev.json";
#endif
// kvfuse-rag-eval's system prompt.
constexpr std::string_view kSystem =
    "You are a helpful assistant. Answer the question using the documents, in a few words.";
constexpr std::string_view kUsage =
    "usage: kvfuse-bench-store [--model GGUF] [--data musique_dev.json] [--questions 2] [--passages 5] "
    "[--dtype f32|f16|bf16] [--repeats 5] [--iterations 4] [--link-mbps 0] [--dir DIR] [--json FILE] "
    "[--redis redis://HOST:PORT]";

struct Args {
  std::string model = kvfuse_example::resolve_model("smollm2");
  std::string data = kDefaultData;
  std::int64_t questions = 2, passages = 5, repeats = 5, iterations = 4;
  kvfuse::DType dtype = kvfuse::DType::f32;
  double link_mbps = 0;
  fs::path dir = fs::temp_directory_path();
  std::string json;
  std::string redis;
};

Args parse_args(int argc, char** argv) {
  using kvfuse_example::parse_int;
  Args a;
  for (int i = 1; i < argc; ++i) {
    const std::string_view flag = argv[i];
    if (flag == "--help" || flag == "-h") {
      fmt::print("{}\n", kUsage);
      std::exit(0);
    }
    require(i + 1 < argc, "{} needs a value\n{}", flag, kUsage);
    const std::string_view v = argv[++i];
    if (flag == "--model") a.model = kvfuse_example::resolve_model(v);
    else if (flag == "--data") a.data = v;
    else if (flag == "--questions") a.questions = parse_int(flag, v);
    else if (flag == "--passages") a.passages = parse_int(flag, v);
    else if (flag == "--repeats") a.repeats = parse_int(flag, v);
    else if (flag == "--iterations") a.iterations = parse_int(flag, v);
    else if (flag == "--link-mbps") a.link_mbps = kvfuse_example::parse_real(flag, v);
    else if (flag == "--dir") a.dir = v;
    else if (flag == "--json") a.json = v;
    else if (flag == "--redis") a.redis = v;
    else if (flag == "--dtype") {
      if (v == "f32") a.dtype = kvfuse::DType::f32;
      else if (v == "f16") a.dtype = kvfuse::DType::f16;
      else if (v == "bf16") a.dtype = kvfuse::DType::bf16;
      else require(false, "--dtype: '{}' is not f32, f16 or bf16", v);
    } else {
      require(false, "unknown flag '{}'\n{}", flag, kUsage);
    }
  }
  require(a.questions >= 1 && a.passages >= 1 && a.repeats >= 1 && a.iterations >= 1,
          "--questions {}, --passages {}, --repeats {}, --iterations {}: each must be >= 1", a.questions, a.passages,
          a.repeats, a.iterations);
  require(std::isfinite(a.link_mbps) && a.link_mbps >= 0, "--link-mbps = {} must be finite and >= 0", a.link_mbps);
#ifndef KVFUSE_BENCH_REDIS
  require(a.redis.empty(), "--redis: this build has no kvfuse::redis (hiredis; KVFUSE_REDIS=ON)");
#endif
  require(fs::is_regular_file(a.model), "--model: '{}' is not a file (bash scripts/fetch_model.sh smollm2)", a.model);
  return a;
}

// ---------------------------------------------------------------------------------------- the KV

struct Chunk {
  kvfuse::KVKey key;
  kvfuse::KVBlock block;
};

// Every chunk's isolated KV of the first `questions` RAG prompts, through FusionPipeline::store_chunk_caches.
std::vector<Chunk> chunk_kv(const Args& a, const kvfuse::Tokenizer& tok, const kvfuse::CpuLlama& model) {
  kvfuse::CpuLlamaFusion engine(model, a.dtype);
  kvfuse::InMemoryKVStore memory;
  kvfuse::FusionPipeline pipeline(engine, memory);
  std::vector<Chunk> out;
  for (const kvfuse_example::Question& q : kvfuse_example::load_questions(a.data, 0, a.questions, a.passages)) {
    const kvfuse::RagPrompt prompt = kvfuse::build_rag_prompt(tok, kSystem, q.passages, q.question);
    const kvfuse::PromptLayout layout = prompt.layout();
    (void)pipeline.store_chunk_caches(prompt.tokens, layout);
    for (const kvfuse::PromptChunk& c : layout.chunks) {
      const auto tokens = std::span(prompt.tokens).subspan(static_cast<std::size_t>(c.range.begin),
                                                           static_cast<std::size_t>(c.range.size()));
      const kvfuse::KVKey key = pipeline.isolated_key(tokens);
      const bool seen = std::any_of(out.begin(), out.end(), [&](const Chunk& x) { return x.key == key; });
      if (!seen) out.push_back({key, *memory.get(key)});  // the system prompt repeats
    }
  }
  return out;
}

// ---------------------------------------------------------------------------------------- the stores

// One store under test, type-erased. Its keys are the chunks' with `model` replaced, so stores sharing a backing
// (one Redis server) do not share entries.
struct BenchStore {
  std::string name;
  std::uint64_t model = 0;
  std::function<void(const kvfuse::KVKey&, kvfuse::KVBlock)> put;
  std::function<std::optional<kvfuse::KVBlock>(const kvfuse::KVKey&)> get;
  std::function<void(const kvfuse::KVKey&)> erase;
  std::function<std::optional<kvfuse::CodecStats>()> codec;  // nullopt: not compressed
  std::vector<std::shared_ptr<void>> owned;
};

// `backing` as a store (behind a link of `link_mbps` when > 0), or a CompressedKVStore with `codec` over that.
template <kvfuse::KVStore Backing>
BenchStore make_store(std::string name, std::shared_ptr<Backing> backing, double link_mbps,
                      std::optional<kvfuse::CodecOptions> codec) {
  BenchStore s{std::move(name), 0, {}, {}, {}, [] { return std::optional<kvfuse::CodecStats>(); }, {backing}};
  const auto finish = [&](auto store) {
    using Store = typename decltype(store)::element_type;
    s.owned.push_back(store);
    s.erase = [store](const kvfuse::KVKey& k) { (void)store->erase(k); };
    if (!codec) {
      s.put = [store](const kvfuse::KVKey& k, kvfuse::KVBlock b) { store->put(k, std::move(b)); };
      s.get = [store](const kvfuse::KVKey& k) { return store->get(k); };
      return;
    }
    auto compressed = std::make_shared<kvfuse::CompressedKVStore<Store>>(*store, *codec);
    s.owned.push_back(compressed);
    s.put = [compressed](const kvfuse::KVKey& k, kvfuse::KVBlock b) { compressed->put(k, std::move(b)); };
    s.get = [compressed](const kvfuse::KVKey& k) { return compressed->get(k); };
    s.codec = [compressed] { return std::optional(compressed->stats()); };
  };
  if (link_mbps > 0) {
    finish(std::make_shared<kvfuse::ThrottledKVStore<Backing>>(*backing, kvfuse::LinkConfig{link_mbps, 0.0}));
  } else {
    finish(backing);
  }
  return s;
}

// "lz4", "zstd-3", "zstd-1+shuffle2", ...
std::string codec_label(const kvfuse::CodecOptions& c) {
  std::string label = c.codec == kvfuse::Codec::zstd ? fmt::format("zstd-{}", c.zstd_level)
                                                     : std::string(kvfuse::codec_name(c.codec));
  return c.shuffle > 0 ? fmt::format("{}+shuffle{}", label, c.shuffle) : label;
}

// memory; disk, and each codec over disk; with --redis, redis and each codec over redis.
std::vector<BenchStore> make_stores(const Args& a, const fs::path& root) {
  const int width = kvfuse::dtype_size(a.dtype);
  const std::vector<kvfuse::CodecOptions> codecs{
      {kvfuse::Codec::lz4},           {kvfuse::Codec::zstd, 1},           {kvfuse::Codec::zstd, 3},
      {kvfuse::Codec::lz4, 3, 1, width}, {kvfuse::Codec::zstd, 1, 1, width}, {kvfuse::Codec::zstd, 3, 1, width}};
  std::vector<BenchStore> out;
  out.push_back(make_store("memory", std::make_shared<kvfuse::InMemoryKVStore>(), a.link_mbps, std::nullopt));
  out.push_back(make_store("disk", std::make_shared<kvfuse::DiskKVStore>(root / "disk"), a.link_mbps, std::nullopt));
  for (const kvfuse::CodecOptions& c : codecs) {
    const std::string name = "disk+" + codec_label(c);
    out.push_back(make_store(name, std::make_shared<kvfuse::DiskKVStore>(root / name), a.link_mbps, c));
  }
#ifdef KVFUSE_BENCH_REDIS
  if (!a.redis.empty()) {
    auto redis = std::make_shared<kvfuse::RedisKVStore>(a.redis);
    out.push_back(make_store("redis", redis, a.link_mbps, std::nullopt));
    for (const kvfuse::CodecOptions& c : codecs) {
      out.push_back(make_store("redis+" + codec_label(c), redis, a.link_mbps, c));
    }
  }
#endif
  for (std::size_t i = 0; i < out.size(); ++i) out[i].model = 0x6b7666757365ull << 8 | i;  // "kvfuse", i
  return out;
}

// ---------------------------------------------------------------------------------------- measurement

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

using kvfuse::eval::median;

// The q-quantile (nearest rank) of v.
double quantile(std::vector<double> v, double q) {
  std::sort(v.begin(), v.end());
  const auto rank = static_cast<std::size_t>(std::ceil(q * static_cast<double>(v.size())));
  return v[std::min(v.size() - 1, rank == 0 ? 0 : rank - 1)];
}

struct Measured {
  std::vector<double> put_mb_s, get_mb_s;  // per repeat
  std::vector<double> put_s, get_s;        // per operation, every repeat
};

// One repeat of `s`: --iterations rounds of put every block, get every block (checked).
void measure(BenchStore& s, const std::vector<Chunk>& chunks, std::int64_t iterations, Measured& m) {
  double raw = 0, put_total = 0, get_total = 0;
  for (std::int64_t it = 0; it < iterations; ++it) {
    for (const Chunk& c : chunks) {
      kvfuse::KVBlock copy = c.block;
      const auto t0 = Clock::now();
      s.put({s.model, c.key.content}, std::move(copy));
      const double t = seconds_since(t0);
      m.put_s.push_back(t);
      put_total += t;
      raw += static_cast<double>(c.block.bytes.size());
    }
    for (const Chunk& c : chunks) {
      const auto t0 = Clock::now();
      const std::optional<kvfuse::KVBlock> got = s.get({s.model, c.key.content});
      const double t = seconds_since(t0);
      m.get_s.push_back(t);
      get_total += t;
      require(got && got->bytes == c.block.bytes && got->num_tokens == c.block.num_tokens,
              "{}: get of a {}-token block returned {}", s.name, c.block.num_tokens,
              got ? "other bytes" : "nothing");
    }
  }
  m.put_mb_s.push_back(raw / put_total / 1e6);
  m.get_mb_s.push_back(raw / get_total / 1e6);
}

std::string load_average() {
  double l[3] = {0, 0, 0};
  if (getloadavg(l, 3) != 3) return "unknown";
  return fmt::format("{:.2f} {:.2f} {:.2f}", l[0], l[1], l[2]);
}

// Removes the benchmark's store directories on every exit path.
struct ScratchDir {
  fs::path path;
  explicit ScratchDir(const fs::path& parent) : path(parent / fmt::format("kvfuse-bench-store-{}", ::getpid())) {
    fs::remove_all(path);
  }
  ScratchDir(const ScratchDir&) = delete;
  ScratchDir& operator=(const ScratchDir&) = delete;
  ~ScratchDir() {
    std::error_code ignored;
    fs::remove_all(path, ignored);
  }
};

int run(const Args& a) {
  const std::string load_before = load_average();
  const kvfuse::GGUFFile file = kvfuse::GGUFFile::open(a.model);
  const kvfuse::Tokenizer tok = kvfuse::Tokenizer::from_gguf(file);
  const kvfuse::CpuLlama model = kvfuse::CpuLlama::from_gguf(file);
  const auto t_kv = Clock::now();
  const std::vector<Chunk> chunks = chunk_kv(a, tok, model);
  const double kv_s = seconds_since(t_kv);
  double raw_bytes = 0;
  std::int64_t tokens = 0;
  for (const Chunk& c : chunks) {
    raw_bytes += static_cast<double>(c.block.bytes.size());
    tokens += c.block.num_tokens;
  }
  fmt::print(stderr, "{} chunk caches, {} tokens, {:.1f} MB of {} KV computed in {:.1f} s\n", chunks.size(), tokens,
             raw_bytes / 1e6, kvfuse::dtype_name(a.dtype), kv_s);

  const ScratchDir scratch(a.dir);
  std::vector<BenchStore> stores = make_stores(a, scratch.path);
  std::vector<Measured> measured(stores.size());
  for (std::int64_t rep = 0; rep < a.repeats; ++rep) {
    for (std::size_t i = 0; i < stores.size(); ++i) {
      measure(stores[i], chunks, a.iterations, measured[i]);
      fmt::print(stderr, "repeat {} {}: put {:.0f} MB/s, get {:.0f} MB/s\n", rep, stores[i].name,
                 measured[i].put_mb_s.back(), measured[i].get_mb_s.back());
    }
  }
  for (const BenchStore& s : stores)
    for (const Chunk& c : chunks) s.erase({s.model, c.key.content});  // a Redis server outlives the run

  const kvfuse::LlamaConfig& cfg = model.config();
  fmt::print("kvfuse-bench-store: {} ({} layers, kv_dim {}), {} KV: {} chunk caches of {} MuSiQue question(s), "
             "{} tokens, {:.1f} MB ({:.0f} kB per token); {} repeats x {} rounds; link {}; load average {} before, {} "
             "after\n\n",
             fs::path(a.model).filename().string(), cfg.n_layer, cfg.kv_dim(), kvfuse::dtype_name(a.dtype),
             chunks.size(), a.questions, tokens, raw_bytes / 1e6, raw_bytes / static_cast<double>(tokens) / 1e3,
             a.repeats, a.iterations, a.link_mbps > 0 ? fmt::format("{} MB/s", a.link_mbps) : std::string("none"),
             load_before, load_average());
  fmt::print("| store | stored / raw | put MB/s | get MB/s | put p50 / p99 ms | get p50 / p99 ms | compress MB/s | "
             "decompress MB/s |\n|---|---:|---:|---:|---:|---:|---:|---:|\n");
  nlohmann::json results = nlohmann::json::array();
  for (std::size_t i = 0; i < stores.size(); ++i) {
    const Measured& m = measured[i];
    const std::optional<kvfuse::CodecStats> codec = stores[i].codec();
    const double ratio = codec ? codec->stored_ratio() : 1.0;
    const double compress = codec ? static_cast<double>(codec->raw_bytes_put) / codec->compress_s / 1e6 : 0;
    const double decompress = codec ? static_cast<double>(codec->raw_bytes_got) / codec->decompress_s / 1e6 : 0;
    fmt::print("| {} | {:.3f} | {:.0f} | {:.0f} | {:.2f} / {:.2f} | {:.2f} / {:.2f} | {} | {} |\n", stores[i].name,
               ratio, median(m.put_mb_s), median(m.get_mb_s), 1e3 * quantile(m.put_s, 0.5),
               1e3 * quantile(m.put_s, 0.99), 1e3 * quantile(m.get_s, 0.5), 1e3 * quantile(m.get_s, 0.99),
               codec ? fmt::format("{:.0f}", compress) : "-", codec ? fmt::format("{:.0f}", decompress) : "-");
    results.push_back({{"store", stores[i].name},
                       {"stored_over_raw", ratio},
                       {"put_mb_s", m.put_mb_s},
                       {"get_mb_s", m.get_mb_s},
                       {"put_ms_p50", 1e3 * quantile(m.put_s, 0.5)},
                       {"put_ms_p99", 1e3 * quantile(m.put_s, 0.99)},
                       {"get_ms_p50", 1e3 * quantile(m.get_s, 0.5)},
                       {"get_ms_p99", 1e3 * quantile(m.get_s, 0.99)},
                       {"compress_mb_s", compress},
                       {"decompress_mb_s", decompress}});
  }
  if (!a.json.empty()) {
    std::ofstream out(a.json);
    require(out.good(), "--json: cannot write '{}'", a.json);
    out << nlohmann::json{{"model", fs::path(a.model).filename().string()},
                          {"dtype", kvfuse::dtype_name(a.dtype)},
                          {"chunks", chunks.size()},
                          {"tokens", tokens},
                          {"raw_bytes", raw_bytes},
                          {"repeats", a.repeats},
                          {"iterations", a.iterations},
                          {"link_mbps", a.link_mbps},
                          {"stores", results}}
               .dump(2)
        << '\n';
    require(out.good(), "--json: writing '{}' failed", a.json);
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  kvfuse::harness::refuse_check_only_build("kvfuse-bench-store");
  try {
    return run(parse_args(argc, argv));
  } catch (const std::exception& e) {
    std::fflush(stdout);
    fmt::print(stderr, "kvfuse-bench-store: {}\n", e.what());
    return 2;
  }
}
