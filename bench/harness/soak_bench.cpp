// kvfuse-bench-soak: many concurrent requests on several FusionPipelines over one shared three-tier store
// (memory → disk → Redis) for a long time while a fault thread breaks the store's tiers; every request's logits
// are checked bit for bit against those of the same request run alone on a healthy store.
//
//   kvfuse-bench-soak [--seconds 600] [--baseline-seconds S/5] [--fault-every-s 3] [--clients 64] [--pipelines 6]
//                     [--prompts 24] [--redis redis://127.0.0.1:PORT [--redis-pid PID]] [--redis-server redis-server]
//                     [--redis-timeout-ms 1000] [--dir DIR] [--seed 1] [--faults KIND,...] [--json FILE]
//
// Model: a synthetic Llama (LlamaWeights::random: 8 layers, d 64, GQA 4/2 heads of 16, FFN 128, vocabulary 256) on
// the CPU backend, one CpuLlama shared by --pipelines engines (CpuLlamaFusion, f32 blocks), each driven by its own
// FusionPipeline (a pipeline serializes its requests: one per engine worker). Prompts: --prompts prompts of 8 to
// 10 chunks (a 24-token system chunk and 7 to 9 passages of 28-52 tokens drawn from a pool of 32) and a query,
// 300-450 tokens, so requests share chunk caches. Methods: cacheblend, attnlink, naive, full (the first three
// store_chunk_caches first, so a missing chunk cache is computed and put).
//
// Store: TieredKVStore<InMemoryKVStore, AuditedDisk, RedisKVStore>, write-through. AuditedDisk is a DiskKVStore
// (a temp dir under --dir) whose put and erase also record which keys the disk acknowledged (put returned) and
// which the bench erased or corrupted on purpose; it forwards to DiskKVStore unchanged. Redis: the server at
// --redis (--redis-pid: its pid, needed to kill and pause it; scripts/soak.sh starts one), else a redis-server the
// bench starts on a free loopback port. Without persistence (--save "" --appendonly no): after a SIGKILL the bench
// restarts it (posix_spawn, same port, empty). An evictor (not a fault: it runs in both phases) keeps the lower
// tiers busy: every 250 ms it erases each key from the memory tier with probability 1/2, every 1 s 2-5 random
// keys from the disk tier, so reads go to disk and Redis.
//
// Phases: references (every (prompt, method) alone, single-threaded, on a fresh InMemoryKVStore and a fresh
// pipeline); a baseline of --baseline-seconds without faults; the soak of --seconds with a fault every
// --fault-every-s (± 50 %), the kind drawn uniformly (from --faults when given):
//   redis_kill      SIGKILL the server, restart it 1-4 s later (empty)
//   redis_stop      SIGSTOP for command timeout + 0.5-2 s, then SIGCONT
//   redis_garbage   a random stored value overwritten with as many random bytes (raw hiredis SET)
//   redis_truncate  a random stored value cut to a random shorter prefix
//   redis_copy      another key's value copied over a random key's
//   disk_flip       one byte of a random entry file inverted (in place)
//   disk_truncate   a random entry file truncated to a random shorter length
//   disk_unwritable the store directory made unwritable for 2-5 s: renamed away and back as root (reads miss, puts
//                   fail), chmod 0555 and back otherwise (puts fail)
// 64 client threads (--clients; client i on pipeline i mod P) loop: draw (prompt, method), store_chunk_caches
// unless full, run, compare the logits exactly with the reference of the plan the run ended with (a difference: a
// wrong-KV use). A chunk cache that no tier held at plan time is computed in context instead of loaded: another,
// correct computation, checked against the same request run alone on a fresh store holding exactly the chunk
// caches its plan loaded (References). An exception out of store_chunk_caches or run is a failed request (its
// message kept).
//
// At the end: faults stopped and repaired, flush, then every key the disk acknowledged and the bench neither
// erased nor corrupted since must read back from the disk tier with exactly its reference bytes (else: bytes lost).
// What Redis held at each SIGKILL is reported apart (no persistence: lost by design). Prints a table; --json FILE
// writes it as JSON. Exit 0 when no request failed, none used wrong KV and no byte was lost; 1 otherwise; 2 on a
// setup error ("kvfuse-bench-soak: <message>").

#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <hiredis/hiredis.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cmath>
#include <cstring>
#include <exception>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <random>
#include <shared_mutex>
#include <string>
#include <string_view>
#include <thread>
#include <tuple>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "kvfuse/backend/disk_kv_store.hpp"
#include "kvfuse/backend/in_memory_store.hpp"
#include "kvfuse/backend/redis_kv_store.hpp"
#include "kvfuse/backend/tiered_kv_store.hpp"
#include "kvfuse/cpu.hpp"
#include "kvfuse/fusion/fusion_pipeline.hpp"
#include "kvfuse/harness/bench_build.hpp"

#include "../examples/musique.hpp"

extern char** environ;

namespace {

using namespace kvfuse;
using kvfuse::require;
using Clock = std::chrono::steady_clock;
namespace fs = std::filesystem;

constexpr std::string_view kUsage =
    "usage: kvfuse-bench-soak [--seconds 600] [--baseline-seconds S/5] [--fault-every-s 3] [--clients 64] "
    "[--pipelines 6] [--prompts 24] [--redis redis://127.0.0.1:PORT [--redis-pid PID]] [--redis-server PATH] "
    "[--redis-timeout-ms 1000] [--dir DIR] [--seed 1] [--faults KIND,...] [--json FILE]";

const std::vector<std::string> kMethods{"cacheblend", "attnlink", "naive", "full"};
const std::vector<std::string> kFaultKinds{"redis_kill",  "redis_stop", "redis_garbage",  "redis_truncate",
                                           "redis_copy",  "disk_flip",  "disk_truncate",  "disk_unwritable"};

struct Args {
  double seconds = 600, baseline_seconds = -1, fault_every_s = 3;
  int clients = 64, pipelines = 6, prompts = 24;
  std::string redis, redis_server = "redis-server", json;
  pid_t redis_pid = -1;
  int redis_timeout_ms = 1000;
  fs::path dir = fs::temp_directory_path();
  std::uint64_t seed = 1;
  std::vector<std::string> faults = kFaultKinds;  // --faults a,b,...: only these kinds
};

Args parse_args(int argc, char** argv) {
  using kvfuse_example::parse_int;
  using kvfuse_example::parse_real;
  Args a;
  for (int i = 1; i < argc; ++i) {
    const std::string_view flag = argv[i];
    if (flag == "--help" || flag == "-h") {
      fmt::print("{}\n", kUsage);
      std::exit(0);
    }
    require(i + 1 < argc, "{} needs a value\n{}", flag, kUsage);
    const std::string_view v = argv[++i];
    if (flag == "--seconds") a.seconds = parse_real(flag, v);
    else if (flag == "--baseline-seconds") a.baseline_seconds = parse_real(flag, v);
    else if (flag == "--fault-every-s") a.fault_every_s = parse_real(flag, v);
    else if (flag == "--clients") a.clients = static_cast<int>(parse_int(flag, v));
    else if (flag == "--pipelines") a.pipelines = static_cast<int>(parse_int(flag, v));
    else if (flag == "--prompts") a.prompts = static_cast<int>(parse_int(flag, v));
    else if (flag == "--redis") a.redis = v;
    else if (flag == "--redis-pid") a.redis_pid = static_cast<pid_t>(parse_int(flag, v));
    else if (flag == "--redis-server") a.redis_server = v;
    else if (flag == "--redis-timeout-ms") a.redis_timeout_ms = static_cast<int>(parse_int(flag, v));
    else if (flag == "--dir") a.dir = v;
    else if (flag == "--seed") a.seed = static_cast<std::uint64_t>(parse_int(flag, v));
    else if (flag == "--json") a.json = v;
    else if (flag == "--faults") {
      a.faults = kvfuse_example::split(v);
      for (const std::string& kind : a.faults)
        require(std::find(kFaultKinds.begin(), kFaultKinds.end(), kind) != kFaultKinds.end(), "--faults: unknown kind '{}'", kind);
      require(!a.faults.empty(), "--faults: no kind given");
    }
    else throw error(fmt::format("unknown flag {}\n{}", flag, kUsage));
  }
  if (a.baseline_seconds < 0) a.baseline_seconds = a.seconds / 5;
  require(a.seconds > 0 && a.fault_every_s > 0, "--seconds and --fault-every-s must be > 0");
  require(a.clients >= 1 && a.pipelines >= 1 && a.prompts >= 1, "--clients, --pipelines, --prompts must be >= 1");
  require(a.redis.empty() || a.redis_pid > 0, "--redis needs --redis-pid (the bench kills and pauses the server)");
  require(a.redis_timeout_ms > 0, "--redis-timeout-ms must be > 0");
  return a;
}

// ---- the model and the prompts -----------------------------------------------------------------------------

LlamaConfig model_config() {
  LlamaConfig c;
  c.n_layer = 8;
  c.n_embd = 64;
  c.n_head = 4;
  c.n_head_kv = 2;
  c.head_dim = 16;
  c.n_ff = 128;
  c.n_vocab = 256;
  c.rope_base = 10000.0;
  c.rms_eps = 1e-5;
  return c;
}

struct Prompt {
  std::vector<token_id> tokens;
  PromptLayout layout;
};

std::vector<token_id> random_tokens(std::mt19937_64& rng, std::size_t n) {
  std::vector<token_id> t(n);
  for (token_id& x : t) x = static_cast<token_id>(rng() % 256);
  return t;
}

std::vector<Prompt> make_prompts(int count, std::uint64_t seed) {
  std::mt19937_64 rng(seed * 7919 + 3);
  const std::vector<token_id> system = random_tokens(rng, 24);
  std::vector<std::vector<token_id>> passages;
  for (int i = 0; i < 32; ++i) passages.push_back(random_tokens(rng, 28 + rng() % 25));
  std::vector<std::vector<token_id>> queries;
  for (int i = 0; i < 6; ++i) queries.push_back(random_tokens(rng, 8 + rng() % 7));
  std::vector<Prompt> prompts;
  for (int p = 0; p < count; ++p) {
    std::vector<int> order(passages.size());
    for (std::size_t i = 0; i < order.size(); ++i) order[i] = static_cast<int>(i);
    std::shuffle(order.begin(), order.end(), rng);
    const std::size_t k = 7 + rng() % 3;  // 8 to 10 chunks with the system chunk
    Prompt prompt;
    std::vector<std::int64_t> lengths{static_cast<std::int64_t>(system.size())};
    prompt.tokens = system;
    for (std::size_t i = 0; i < k; ++i) {
      const auto& c = passages[static_cast<std::size_t>(order[i])];
      prompt.tokens.insert(prompt.tokens.end(), c.begin(), c.end());
      lengths.push_back(static_cast<std::int64_t>(c.size()));
    }
    const auto& q = queries[rng() % queries.size()];
    prompt.tokens.insert(prompt.tokens.end(), q.begin(), q.end());
    prompt.layout = PromptLayout::from_lengths(lengths, static_cast<std::int64_t>(q.size()));
    prompts.push_back(std::move(prompt));
  }
  return prompts;
}

// ---- the audited disk tier ------------------------------------------------------------------------------------

// A DiskKVStore that records what it acknowledged. put and erase hide DiskKVStore's (TieredKVStore calls them on
// this type); everything else is DiskKVStore's. Corruption by the fault thread runs under exclusive(), puts under
// a shared lock, so "acknowledged after the last corruption" is well defined.
class AuditedDisk : public DiskKVStore {
 public:
  using DiskKVStore::DiskKVStore;

  void put(const KVKey& key, KVBlock block) {
    std::shared_lock audit(audit_);
    try {
      DiskKVStore::put(key, std::move(block));
    } catch (...) {
      failed_puts_.fetch_add(1);
      throw;
    }
    std::lock_guard lock(mutex_);
    ++acked_puts_;
    acked_.insert(key);
    damaged_.erase(key);
  }

  bool erase(const KVKey& key) {
    std::unique_lock audit(audit_);
    const bool erased = DiskKVStore::erase(key);
    std::lock_guard lock(mutex_);
    if (acked_.erase(key) > 0) ++deliberate_erases_;
    damaged_.erase(key);
    return erased;
  }

  // f() with no put in flight; f returns the key it damaged, if any.
  template <class F>
  void exclusive(F&& f) {
    std::unique_lock audit(audit_);
    if (std::optional<KVKey> key = f()) {
      std::lock_guard lock(mutex_);
      damaged_.insert(*key);
    }
  }

  // Acknowledged and neither erased nor damaged since.
  [[nodiscard]] std::vector<KVKey> intact_acknowledged() const {
    std::lock_guard lock(mutex_);
    std::vector<KVKey> out;
    for (const KVKey& k : acked_)
      if (!damaged_.contains(k)) out.push_back(k);
    return out;
  }
  [[nodiscard]] std::int64_t acked_puts() const {
    std::lock_guard lock(mutex_);
    return acked_puts_;
  }
  [[nodiscard]] std::int64_t failed_puts() const { return failed_puts_.load(); }
  [[nodiscard]] std::int64_t damaged_keys() const {
    std::lock_guard lock(mutex_);
    return static_cast<std::int64_t>(damaged_.size());
  }

 private:
  mutable std::shared_mutex audit_;
  mutable std::mutex mutex_;
  std::unordered_set<KVKey, KVKeyHash> acked_, damaged_;
  std::int64_t acked_puts_ = 0, deliberate_erases_ = 0;
  std::atomic<std::int64_t> failed_puts_{0};
};

using Tiered = TieredKVStore<InMemoryKVStore, AuditedDisk, RedisKVStore>;
using Pipeline = FusionPipeline<CpuLlamaFusion, Tiered>;

// ---- the Redis server -------------------------------------------------------------------------------------------

struct RedisReplyFree {
  void operator()(redisReply* r) const noexcept { freeReplyObject(r); }
};
using RedisReplyPtr = std::unique_ptr<redisReply, RedisReplyFree>;
struct RedisContextFree {
  void operator()(redisContext* c) const noexcept { redisFree(c); }
};
using RedisContextPtr = std::unique_ptr<redisContext, RedisContextFree>;

RedisContextPtr redis_connect(int port, int timeout_ms) {
  const timeval tv{timeout_ms / 1000, (timeout_ms % 1000) * 1000};
  RedisContextPtr c(redisConnectWithTimeout("127.0.0.1", port, tv));
  if (c == nullptr || c->err != 0) return nullptr;
  redisSetTimeout(c.get(), tv);
  return c;
}

RedisReplyPtr redis_command(redisContext* c, const std::vector<std::string>& args) {
  std::vector<const char*> argv;
  std::vector<std::size_t> lengths;
  for (const std::string& a : args) {
    argv.push_back(a.data());
    lengths.push_back(a.size());
  }
  return RedisReplyPtr(static_cast<redisReply*>(
      redisCommandArgv(c, static_cast<int>(argv.size()), argv.data(), lengths.data())));
}

bool redis_pings(int port) {
  const RedisContextPtr c = redis_connect(port, 200);
  if (c == nullptr) return false;
  const RedisReplyPtr r = redis_command(c.get(), {"PING"});
  return r != nullptr && r->type == REDIS_REPLY_STATUS && std::string_view(r->str, r->len) == "PONG";
}

int free_loopback_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  require(fd >= 0, "socket: {}", std::strerror(errno));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof addr;
  const bool ok = ::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0 &&
                  ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0;
  ::close(fd);
  require(ok, "no free loopback port");
  return ntohs(addr.sin_port);
}

// The server the bench kills, pauses and restarts: given (--redis, --redis-pid) or started here. Servers started
// here are its children (posix_spawn; output to redis.log in `dir`), stopped at the end.
class RedisProcess {
 public:
  RedisProcess(std::string server, fs::path dir, int port, pid_t pid)
      : server_(std::move(server)), dir_(std::move(dir)), port_(port), pid_(pid) {
    if (pid_ <= 0) {
      port_ = free_loopback_port();
      require(start(), "redis-server did not start on port {}; see {}", port_, (dir_ / "redis.log").string());
    }
  }
  RedisProcess(const RedisProcess&) = delete;
  RedisProcess& operator=(const RedisProcess&) = delete;
  ~RedisProcess() {
    if (pid_ > 0 && child_) {
      ::kill(pid_, SIGCONT);
      ::kill(pid_, SIGTERM);
      ::waitpid(pid_, nullptr, 0);
    }
  }

  [[nodiscard]] int port() const noexcept { return port_; }
  [[nodiscard]] std::string uri() const { return fmt::format("redis://127.0.0.1:{}", port_); }

  // Keys the server held (DBSIZE), -1 when it does not answer.
  [[nodiscard]] long long dbsize() const {
    const RedisContextPtr c = redis_connect(port_, 1000);
    if (c == nullptr) return -1;
    const RedisReplyPtr r = redis_command(c.get(), {"DBSIZE"});
    return r != nullptr && r->type == REDIS_REPLY_INTEGER ? r->integer : -1;
  }

  void kill9() {
    ::kill(pid_, SIGCONT);
    ::kill(pid_, SIGKILL);
    if (child_) {
      ::waitpid(pid_, nullptr, 0);
    } else {  // the script's server: a zombie until its parent reaps it, so wait for the port instead
      const auto deadline = Clock::now() + std::chrono::seconds(5);
      while (Clock::now() < deadline && redis_pings(port_)) std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    pid_ = -1;
  }
  void pause() { ::kill(pid_, SIGSTOP); }
  void resume() { ::kill(pid_, SIGCONT); }

  // A new server on the same port (empty); retries while the port is still held.
  bool restart() {
    for (int attempt = 0; attempt < 50; ++attempt) {
      if (start()) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    return false;
  }

 private:
  bool start() {
    std::vector<std::string> argv{server_, "--port", std::to_string(port_), "--bind", "127.0.0.1", "--save", "",
                                  "--appendonly", "no", "--dir", dir_.string()};
    std::vector<char*> args;
    for (std::string& a : argv) args.push_back(a.data());
    args.push_back(nullptr);
    const std::string log = (dir_ / "redis.log").string();
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_addopen(&actions, 0, "/dev/null", O_RDONLY, 0);
    posix_spawn_file_actions_addopen(&actions, 1, log.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
    posix_spawn_file_actions_adddup2(&actions, 1, 2);
    pid_t pid = -1;
    const int rc = posix_spawnp(&pid, args[0], &actions, nullptr, args.data(), environ);
    posix_spawn_file_actions_destroy(&actions);
    if (rc != 0) throw error(fmt::format("cannot start {}: {}", server_, std::strerror(rc)));
    const auto deadline = Clock::now() + std::chrono::seconds(10);
    while (Clock::now() < deadline) {
      if (::waitpid(pid, nullptr, WNOHANG) == pid) return false;  // exited: the port is still taken
      if (redis_pings(port_)) {
        pid_ = pid;
        child_ = true;
        return true;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    ::kill(pid, SIGKILL);
    ::waitpid(pid, nullptr, 0);
    return false;
  }

  std::string server_;
  fs::path dir_;
  int port_;
  pid_t pid_;
  bool child_ = false;
};

// ---- statistics -------------------------------------------------------------------------------------------------

double percentile(std::vector<double> v, double q) {
  if (v.empty()) return 0.0;
  std::sort(v.begin(), v.end());
  return v[static_cast<std::size_t>(q * static_cast<double>(v.size() - 1) + 0.5)];
}

struct PhaseResult {
  std::string name;
  double seconds = 0;
  std::int64_t completed = 0, failed = 0, wrong_kv = 0, rejected_entries = 0, layer_read_failures = 0;
  std::int64_t degraded_plans = 0;  // chunks computed that the healthy plan loads (checked against that plan)
  std::int64_t unverifiable = 0;    // a plan the bench could not reproduce on a fresh store
  std::vector<double> ttft_ms, wall_ms;
  std::map<std::string, std::int64_t> errors;  // message -> count
  std::map<std::string, std::int64_t> wrong_by_method;
  std::vector<std::string> wrong_examples;  // the first few wrong-KV uses, described
};

// A wrong-KV use, described: the request, how far its logits are from the reference, what the run loaded.
std::string describe_wrong(int prompt, const std::string& method, const FusionResult& r, const std::vector<float>& want) {
  float diff = 0.0F;
  for (std::size_t i = 0; i < std::min(r.logits.size(), want.size()); ++i)
    diff = std::max(diff, std::abs(r.logits[i] - want[i]));
  std::string sources;
  for (const ChunkPlan& c : r.plan.chunks)
    sources += fmt::format("{}{}", sources.empty() ? "" : ",", static_cast<int>(c.source));
  std::string failures;
  for (const std::string& f : r.load.failures) failures += "; " + f;
  return fmt::format("prompt {} {}: max |diff| {:g}, {} logits; rejected entries {}, layerwise {}, restarts {}, "
                     "sources [{}]{}", prompt, method, diff, r.logits.size(), r.rejected_entries, r.load.layerwise,
                     r.load.restarts, sources, failures);
}

// Store counters, read at the end of each phase (the phase's share is the difference).
struct Counters {
  std::int64_t put_failures[3] = {0, 0, 0};
  std::int64_t tier_reads[3] = {0, 0, 0};
  std::int64_t tier_bytes[3] = {0, 0, 0};
  std::int64_t disk_rejected = 0, redis_rejected = 0, redis_unavailable = 0;
  std::int64_t disk_acked_puts = 0, disk_failed_puts = 0;

  Counters operator-(const Counters& o) const {
    Counters d = *this;
    for (int i = 0; i < 3; ++i) {
      d.put_failures[i] -= o.put_failures[i];
      d.tier_reads[i] -= o.tier_reads[i];
      d.tier_bytes[i] -= o.tier_bytes[i];
    }
    d.disk_rejected -= o.disk_rejected;
    d.redis_rejected -= o.redis_rejected;
    d.redis_unavailable -= o.redis_unavailable;
    d.disk_acked_puts -= o.disk_acked_puts;
    d.disk_failed_puts -= o.disk_failed_puts;
    return d;
  }
  [[nodiscard]] nlohmann::json json() const {
    nlohmann::json j;
    j["put_failures"] = {{"memory", put_failures[0]}, {"disk", put_failures[1]}, {"redis", put_failures[2]}};
    j["reads"] = {{"memory", tier_reads[0]}, {"disk", tier_reads[1]}, {"redis", tier_reads[2]}};
    j["read_bytes"] = {{"memory", tier_bytes[0]}, {"disk", tier_bytes[1]}, {"redis", tier_bytes[2]}};
    j["rejected"] = {{"disk", disk_rejected}, {"redis", redis_rejected}};
    j["redis_unavailable"] = redis_unavailable;
    j["disk_puts_acknowledged"] = disk_acked_puts;
    j["disk_puts_failed"] = disk_failed_puts;
    return j;
  }
};

Counters read_counters(const Tiered& tiered, const AuditedDisk& disk, const RedisKVStore& redis) {
  Counters c;
  for (std::size_t i = 0; i < 3; ++i) {
    c.put_failures[i] = tiered.put_failures(i);
    const ReadStats s = tiered.tier_stats(i);
    c.tier_reads[i] = s.reads;
    c.tier_bytes[i] = s.bytes;
  }
  c.disk_rejected = disk.rejected();
  c.redis_rejected = redis.rejected();
  c.redis_unavailable = redis.unavailable();
  c.disk_acked_puts = disk.acked_puts();
  c.disk_failed_puts = disk.failed_puts();
  return c;
}

// ---- the soak -----------------------------------------------------------------------------------------------------

struct Request {
  int prompt = 0;
  int method = 0;
};

std::string sources_of(const FusionPlan& plan) {
  std::string s;
  for (const ChunkPlan& c : plan.chunks) s += static_cast<char>('0' + static_cast<int>(c.source));
  return s;
}

// The logits each request must produce. A request whose final plan has the healthy plan's chunk sources must match
// the healthy reference (the request alone on a fresh store holding every chunk cache). A request whose plan
// differs (a chunk cache that no tier held when it planned — the tier with it evicted, broken or down — is
// computed in context instead of loaded: another, legitimate computation) must match the reference of that plan:
// the request alone on a fresh store holding exactly the chunk caches its plan loaded, computed on first use.
class References {
 public:
  References(const CpuLlama& model, const std::vector<Prompt>& prompts,
             const std::unordered_map<KVKey, KVBlock, KVKeyHash>& blocks)
      : model_(model), prompts_(prompts), blocks_(blocks) {}

  void add_healthy(int prompt, int method, std::vector<float> logits, std::string sources) {
    std::lock_guard lock(mutex_);
    healthy_sources_[{prompt, method}] = sources;
    by_plan_[{prompt, method, std::move(sources)}] = std::move(logits);
  }

  // The expected logits of (prompt, method) run with this final plan; nullopt when the plan cannot be reproduced
  // (`why` says how). `degraded`: the plan differs from the healthy one.
  std::optional<std::vector<float>> expected(int prompt, int method, const std::string& sources, bool& degraded,
                                             std::string& why) {
    {
      std::lock_guard lock(mutex_);
      degraded = healthy_sources_.at({prompt, method}) != sources;
      if (const auto it = by_plan_.find({prompt, method, sources}); it != by_plan_.end()) return it->second;
    }
    const Prompt& p = prompts_[static_cast<std::size_t>(prompt)];
    InMemoryKVStore memory;
    CpuLlamaFusion engine(model_);
    FusionPipeline<CpuLlamaFusion, InMemoryKVStore> pipeline(engine, memory);
    for (std::size_t j = 0; j < p.layout.chunks.size() && j < sources.size(); ++j) {
      if (sources[j] != '0' + static_cast<int>(KVSource::isolated)) continue;
      const TokenRange r = p.layout.chunks[j].range;
      const KVKey key = pipeline.isolated_key(
          std::span(p.tokens).subspan(static_cast<std::size_t>(r.begin), static_cast<std::size_t>(r.size())));
      memory.put(key, blocks_.at(key));
    }
    FusionResult r = pipeline.run(p.tokens, p.layout, parse_method(kMethods[static_cast<std::size_t>(method)]));
    if (sources_of(r.plan) != sources) {
      why = fmt::format("plan [{}] not reproduced on a fresh store (got [{}])", sources, sources_of(r.plan));
      return std::nullopt;
    }
    std::lock_guard lock(mutex_);
    ++degraded_references_;
    return by_plan_.try_emplace({prompt, method, sources}, std::move(r.logits)).first->second;
  }

  [[nodiscard]] std::int64_t degraded_references() const {
    std::lock_guard lock(mutex_);
    return degraded_references_;
  }

 private:
  const CpuLlama& model_;
  const std::vector<Prompt>& prompts_;
  const std::unordered_map<KVKey, KVBlock, KVKeyHash>& blocks_;
  mutable std::mutex mutex_;
  std::map<std::pair<int, int>, std::string> healthy_sources_;
  std::map<std::tuple<int, int, std::string>, std::vector<float>> by_plan_;
  std::int64_t degraded_references_ = 0;
};

struct World {
  const std::vector<Prompt>& prompts;
  References& references;
  std::vector<std::unique_ptr<Pipeline>>& pipelines;
};

PhaseResult run_phase(const std::string& name, World& w, int clients, double seconds, std::uint64_t seed) {
  PhaseResult result;
  result.name = name;
  std::mutex mutex;
  std::atomic<bool> stop{false};
  std::vector<std::thread> threads;
  const auto t0 = Clock::now();
  for (int c = 0; c < clients; ++c) {
    threads.emplace_back([&, c] {
      std::mt19937_64 rng(seed * 1000003 + static_cast<std::uint64_t>(c));
      Pipeline& pipeline = *w.pipelines[static_cast<std::size_t>(c) % w.pipelines.size()];
      PhaseResult mine;
      while (!stop.load(std::memory_order_relaxed)) {
        const Request q{static_cast<int>(rng() % w.prompts.size()), static_cast<int>(rng() % kMethods.size())};
        const Prompt& p = w.prompts[static_cast<std::size_t>(q.prompt)];
        const std::string& m = kMethods[static_cast<std::size_t>(q.method)];
        const auto r0 = Clock::now();
        try {
          if (m != "full") pipeline.store_chunk_caches(p.tokens, p.layout);
          const FusionResult r = pipeline.run(p.tokens, p.layout, parse_method(m));
          mine.wall_ms.push_back(std::chrono::duration<double, std::milli>(Clock::now() - r0).count());
          mine.ttft_ms.push_back(r.time.ttft_ms());
          ++mine.completed;
          mine.rejected_entries += r.rejected_entries;
          mine.layer_read_failures += static_cast<std::int64_t>(r.load.failures.size());
          bool degraded = false;
          std::string why;
          const std::optional<std::vector<float>> want =
              w.references.expected(q.prompt, q.method, sources_of(r.plan), degraded, why);
          if (degraded) ++mine.degraded_plans;
          if (!want) {
            ++mine.unverifiable;
            if (mine.wrong_examples.size() < 5) mine.wrong_examples.push_back(fmt::format("unverifiable: {}", why));
          } else if (r.logits != *want) {
            ++mine.wrong_kv;
            ++mine.wrong_by_method[m];
            if (mine.wrong_examples.size() < 5) mine.wrong_examples.push_back(describe_wrong(q.prompt, m, r, *want));
          }
        } catch (const std::exception& e) {
          ++mine.failed;
          ++mine.errors[fmt::format("{}: {}", m, e.what())];
        }
      }
      std::lock_guard lock(mutex);
      result.completed += mine.completed;
      result.failed += mine.failed;
      result.wrong_kv += mine.wrong_kv;
      result.degraded_plans += mine.degraded_plans;
      result.unverifiable += mine.unverifiable;
      result.rejected_entries += mine.rejected_entries;
      result.layer_read_failures += mine.layer_read_failures;
      result.ttft_ms.insert(result.ttft_ms.end(), mine.ttft_ms.begin(), mine.ttft_ms.end());
      result.wall_ms.insert(result.wall_ms.end(), mine.wall_ms.begin(), mine.wall_ms.end());
      for (const auto& [k, v] : mine.errors) result.errors[k] += v;
      for (const auto& [k, v] : mine.wrong_by_method) result.wrong_by_method[k] += v;
      for (std::string& e : mine.wrong_examples)
        if (result.wrong_examples.size() < 20) result.wrong_examples.push_back(std::move(e));
    });
  }
  while (Clock::now() - t0 < std::chrono::duration<double>(seconds))
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  stop = true;
  for (std::thread& t : threads) t.join();
  result.seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  return result;
}

// Sleeps up to `seconds`, waking early when `stop` is set; whether it slept the whole time.
bool nap(const std::atomic<bool>& stop, double seconds) {
  const auto until = Clock::now() + std::chrono::duration<double>(seconds);
  while (Clock::now() < until) {
    if (stop.load()) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return true;
}

std::optional<KVKey> key_of_file(const std::string& name) {
  // "<model:016x>-<content:016x>.kvb"
  if (name.size() != 37 || name[16] != '-' || !name.ends_with(".kvb")) return std::nullopt;
  try {
    return KVKey{std::stoull(name.substr(0, 16), nullptr, 16), std::stoull(name.substr(17, 16), nullptr, 16)};
  } catch (const std::exception&) {
    return std::nullopt;
  }
}

struct FaultLog {
  std::map<std::string, std::int64_t> injected, skipped;
  std::int64_t redis_keys_lost_to_kill = 0;  // DBSIZE before each SIGKILL, summed
  std::vector<std::string> lines;
  std::vector<std::string> problems;  // a fault that could not be repaired
};

class FaultInjector {
 public:
  FaultInjector(RedisProcess& redis, AuditedDisk& disk, const Args& args, Clock::time_point start)
      : redis_(redis), disk_(disk), args_(args), start_(start), rng_(args.seed * 31 + 17) {}

  void run(const std::atomic<bool>& stop) {
    std::uniform_real_distribution<double> jitter(0.5, 1.5);
    while (nap(stop, args_.fault_every_s * jitter(rng_))) {
      const std::string& kind = args_.faults[rng_() % args_.faults.size()];
      std::string what;
      try {
        what = inject(kind);
      } catch (const std::exception& e) {
        what = fmt::format("failed: {}", e.what());
        log_.problems.push_back(fmt::format("{}: {}", kind, e.what()));
      }
      const bool skipped = what.starts_with("skipped");
      ++(skipped ? log_.skipped : log_.injected)[kind];
      const double t = std::chrono::duration<double>(Clock::now() - start_).count();
      log_.lines.push_back(fmt::format("[{:7.1f} s] {} {}", t, kind, what));
      std::fprintf(stderr, "%s\n", log_.lines.back().c_str());
    }
  }

  [[nodiscard]] const FaultLog& log() const noexcept { return log_; }

 private:
  double uniform(double lo, double hi) { return std::uniform_real_distribution<double>(lo, hi)(rng_); }

  std::string inject(const std::string& kind) {
    if (kind == "redis_kill") {
      const long long held = redis_.dbsize();
      redis_.kill9();
      log_.redis_keys_lost_to_kill += std::max(0LL, held);
      const double down = uniform(1, 4);
      std::this_thread::sleep_for(std::chrono::duration<double>(down));
      if (!redis_.restart()) {
        log_.problems.push_back("redis-server did not restart");
        throw error("redis-server did not restart");
      }
      return fmt::format("({} keys lost), down {:.1f} s", held, down);
    }
    if (kind == "redis_stop") {
      const double paused = args_.redis_timeout_ms / 1e3 + uniform(0.5, 2);
      redis_.pause();
      std::this_thread::sleep_for(std::chrono::duration<double>(paused));
      redis_.resume();
      return fmt::format("paused {:.1f} s", paused);
    }
    if (kind.starts_with("redis_")) return damage_redis(kind);
    if (kind == "disk_flip" || kind == "disk_truncate") return damage_disk(kind);
    if (kind == "disk_unwritable") return disk_unwritable();
    throw error(fmt::format("unknown fault {}", kind));
  }

  std::string damage_redis(const std::string& kind) {
    const RedisContextPtr c = redis_connect(redis_.port(), 2000);
    if (c == nullptr) return "skipped: no connection";
    const RedisReplyPtr keys = redis_command(c.get(), {"KEYS", "kvfuse:*"});
    if (keys == nullptr || keys->type != REDIS_REPLY_ARRAY || keys->elements == 0) return "skipped: no key";
    const auto pick = [&] {
      const redisReply& k = *keys->element[rng_() % keys->elements];
      return std::string(k.str, k.len);
    };
    const std::string key = pick();
    const RedisReplyPtr value = redis_command(c.get(), {"GET", key});
    if (value == nullptr || value->type != REDIS_REPLY_STRING) return "skipped: value gone";
    std::string v(value->str, value->len);
    std::string how;
    if (kind == "redis_garbage") {
      for (char& ch : v) ch = static_cast<char>(rng_());
      how = fmt::format("{} random bytes", v.size());
    } else if (kind == "redis_truncate") {
      const std::size_t n = v.empty() ? 0 : rng_() % v.size();
      v.resize(n);
      how = fmt::format("cut to {} of {} bytes", n, value->len);
    } else {  // redis_copy
      std::string other = pick();
      for (int i = 0; i < 8 && other == key; ++i) other = pick();
      if (other == key) return "skipped: one key only";
      const RedisReplyPtr ov = redis_command(c.get(), {"GET", other});
      if (ov == nullptr || ov->type != REDIS_REPLY_STRING) return "skipped: value gone";
      v.assign(ov->str, ov->len);
      how = fmt::format("value of {}", other);
    }
    const RedisReplyPtr set = redis_command(c.get(), {"SET", key, v});
    if (set == nullptr || set->type != REDIS_REPLY_STATUS) return "skipped: SET failed";
    return fmt::format("{}: {}", key, how);
  }

  std::string damage_disk(const std::string& kind) {
    std::vector<fs::path> files;
    std::error_code ec;
    for (const fs::directory_entry& e : fs::directory_iterator(disk_.directory(), ec))
      if (key_of_file(e.path().filename().string())) files.push_back(e.path());
    if (files.empty()) return "skipped: no entry file";
    const fs::path file = files[rng_() % files.size()];
    std::string how = "skipped: file gone";
    disk_.exclusive([&]() -> std::optional<KVKey> {
      const int fd = ::open(file.c_str(), O_RDWR | O_CLOEXEC);
      if (fd < 0) return std::nullopt;
      struct stat st {};
      if (::fstat(fd, &st) != 0 || st.st_size == 0) {
        ::close(fd);
        return std::nullopt;
      }
      const auto size = static_cast<std::uint64_t>(st.st_size);
      const std::uint64_t at = rng_() % size;
      bool done = false;
      if (kind == "disk_flip") {
        unsigned char b = 0;
        if (::pread(fd, &b, 1, static_cast<off_t>(at)) == 1) {
          b = static_cast<unsigned char>(b ^ 0xFF);
          done = ::pwrite(fd, &b, 1, static_cast<off_t>(at)) == 1;
        }
        how = fmt::format("{}: byte {} of {} inverted", file.filename().string(), at, size);
      } else {
        done = ::ftruncate(fd, static_cast<off_t>(at)) == 0;
        how = fmt::format("{}: truncated to {} of {} bytes", file.filename().string(), at, size);
      }
      ::close(fd);
      if (!done) how = "skipped: write failed";
      return done ? key_of_file(file.filename().string()) : std::nullopt;
    });
    return how;
  }

  std::string disk_unwritable() {
    const fs::path dir = disk_.directory();
    const double seconds = uniform(2, 5);
    if (::geteuid() == 0) {  // root writes through any mode: take the directory away instead
      fs::path away = dir;
      away += ".away";
      fs::rename(dir, away);
      std::this_thread::sleep_for(std::chrono::duration<double>(seconds));
      for (int attempt = 0;; ++attempt) {
        std::error_code ec;
        fs::rename(away, dir, ec);
        if (!ec) break;
        if (attempt == 100) {
          log_.problems.push_back(fmt::format("cannot move {} back: {}", away.string(), ec.message()));
          throw error(fmt::format("cannot move {} back: {}", away.string(), ec.message()));
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
      }
      return fmt::format("directory renamed away for {:.1f} s", seconds);
    }
    fs::permissions(dir, fs::perms::owner_read | fs::perms::owner_exec | fs::perms::group_read |
                             fs::perms::group_exec | fs::perms::others_read | fs::perms::others_exec);
    std::this_thread::sleep_for(std::chrono::duration<double>(seconds));
    fs::permissions(dir, fs::perms::owner_all | fs::perms::group_read | fs::perms::group_exec |
                             fs::perms::others_read | fs::perms::others_exec);
    return fmt::format("directory chmod 0555 for {:.1f} s", seconds);
  }

  RedisProcess& redis_;
  AuditedDisk& disk_;
  const Args& args_;
  Clock::time_point start_;
  std::mt19937_64 rng_;
  FaultLog log_;
};

nlohmann::json phase_json(const PhaseResult& r, const Counters& c) {
  nlohmann::json j;
  j["seconds"] = r.seconds;
  j["requests_completed"] = r.completed;
  j["requests_failed"] = r.failed;
  j["wrong_kv_uses"] = r.wrong_kv;
  j["wrong_kv_by_method"] = r.wrong_by_method;
  j["degraded_plans"] = r.degraded_plans;
  j["unverifiable"] = r.unverifiable;
  j["errors"] = r.errors;
  j["wrong_kv_examples"] = r.wrong_examples;
  j["entries_rejected_by_pipeline"] = r.rejected_entries;
  j["layer_read_failures"] = r.layer_read_failures;
  j["ttft_ms"] = {{"p50", percentile(r.ttft_ms, 0.5)},
                  {"p99", percentile(r.ttft_ms, 0.99)},
                  {"p99.9", percentile(r.ttft_ms, 0.999)},
                  {"max", percentile(r.ttft_ms, 1.0)}};
  j["request_wall_ms"] = {{"p50", percentile(r.wall_ms, 0.5)},
                          {"p99", percentile(r.wall_ms, 0.99)},
                          {"p99.9", percentile(r.wall_ms, 0.999)},
                          {"max", percentile(r.wall_ms, 1.0)}};
  j["store"] = c.json();
  return j;
}

struct ScratchDir {
  fs::path path;
  explicit ScratchDir(const fs::path& parent) {
    path = parent / fmt::format("kvfuse-soak-{}", ::getpid());
    fs::remove_all(path);
    fs::create_directories(path);
  }
  ~ScratchDir() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
};

int soak(const Args& args) {
  const ScratchDir scratch(args.dir);
  const LlamaConfig config = model_config();
  const CpuLlama model(config, LlamaWeights::random(config, args.seed), CpuLlamaOptions{1, 64});
  const std::vector<Prompt> prompts = make_prompts(args.prompts, args.seed);
  std::int64_t min_tokens = 1 << 30, max_tokens = 0;
  for (const Prompt& p : prompts) {
    min_tokens = std::min(min_tokens, p.layout.num_tokens());
    max_tokens = std::max(max_tokens, p.layout.num_tokens());
  }

  // References: each (prompt, method) alone on a fresh healthy store; the chunk caches they made, by key.
  fmt::print("references: {} prompts ({}-{} tokens, 8-10 chunks) x {} methods, each alone on a fresh store ...\n",
             prompts.size(), min_tokens, max_tokens, kMethods.size());
  std::fflush(stdout);
  const auto ref0 = Clock::now();
  std::unordered_map<KVKey, KVBlock, KVKeyHash> blocks;
  References references(model, prompts, blocks);
  for (std::size_t p = 0; p < prompts.size(); ++p) {
    for (std::size_t mi = 0; mi < kMethods.size(); ++mi) {
      const std::string& m = kMethods[mi];
      InMemoryKVStore memory;
      CpuLlamaFusion engine(model);
      FusionPipeline<CpuLlamaFusion, InMemoryKVStore> pipeline(engine, memory);
      if (m != "full") pipeline.store_chunk_caches(prompts[p].tokens, prompts[p].layout);
      FusionResult r = pipeline.run(prompts[p].tokens, prompts[p].layout, parse_method(m));
      references.add_healthy(static_cast<int>(p), static_cast<int>(mi), std::move(r.logits), sources_of(r.plan));
      for (const PromptChunk& c : prompts[p].layout.chunks) {
        const auto chunk = std::span(prompts[p].tokens).subspan(static_cast<std::size_t>(c.range.begin),
                                                               static_cast<std::size_t>(c.range.size()));
        const KVKey key = pipeline.isolated_key(chunk);
        if (std::optional<KVBlock> b = memory.get(key)) {
          auto [it, fresh] = blocks.try_emplace(key, *b);
          require(fresh || it->second.bytes == b->bytes, "chunk cache of one key computed twice differs");
        }
      }
    }
  }
  std::vector<KVKey> keys;
  std::int64_t chunk_bytes = 0;
  for (const auto& [k, b] : blocks) {
    keys.push_back(k);
    chunk_bytes += static_cast<std::int64_t>(b.bytes.size());
  }
  const double ref_s = std::chrono::duration<double>(Clock::now() - ref0).count();
  fmt::print("  {:.1f} s; {} distinct chunk caches, {:.1f} MB\n", ref_s, keys.size(), chunk_bytes / 1e6);

  // The shared store and the pipelines.
  int port = 0;
  if (!args.redis.empty()) port = parse_redis_uri(args.redis).nodes.front().port;
  RedisProcess server(args.redis_server, scratch.path, port, args.redis.empty() ? -1 : args.redis_pid);
  RedisOptions ropts = parse_redis_uri(server.uri());
  ropts.command_timeout = std::chrono::milliseconds(args.redis_timeout_ms);
  ropts.key_prefix = fmt::format("kvfuse:soak{}:", ::getpid());
  RedisKVStore redis(ropts);  // the fault thread damages keys matching "kvfuse:*"
  InMemoryKVStore memory;
  AuditedDisk disk(scratch.path / "disk");
  TieredConfig tconfig;
  tconfig.tiers = {{"memory", 1.0}, {"disk", 0.1}, {"redis", 0.01}};
  Tiered tiered(tconfig, memory, disk, redis);
  std::vector<std::unique_ptr<CpuLlamaFusion>> engines;
  std::vector<std::unique_ptr<Pipeline>> pipelines;
  for (int i = 0; i < args.pipelines; ++i) {
    engines.push_back(std::make_unique<CpuLlamaFusion>(model));
    pipelines.push_back(std::make_unique<Pipeline>(*engines.back(), tiered));
  }
  World world{prompts, references, pipelines};

  // The evictor: keeps reads going to disk and Redis (both phases).
  std::atomic<bool> stop_evictor{false};
  std::atomic<std::int64_t> memory_evictions{0}, disk_evictions{0};
  std::thread evictor([&] {
    std::mt19937_64 rng(args.seed * 97 + 5);
    int tick = 0;
    while (nap(stop_evictor, 0.25)) {
      for (const KVKey& k : keys)
        if (rng() % 2 == 0 && memory.erase(k)) ++memory_evictions;
      if (++tick % 4 == 0) {
        const int n = 2 + static_cast<int>(rng() % 4);
        for (int i = 0; i < n; ++i) {
          try {
            if (disk.erase(keys[rng() % keys.size()])) ++disk_evictions;
          } catch (const std::exception&) {  // the directory taken away by a fault: not an eviction
          }
        }
      }
    }
  });

  fmt::print("store: memory -> disk ({}) -> Redis ({}, command timeout {} ms); {} pipelines, {} clients\n",
             disk.directory().string(), server.uri(), args.redis_timeout_ms, args.pipelines, args.clients);
  fmt::print("baseline: {:.0f} s without faults ...\n", args.baseline_seconds);
  std::fflush(stdout);
  const Counters c0 = read_counters(tiered, disk, redis);
  PhaseResult base = run_phase("baseline", world, args.clients, args.baseline_seconds, args.seed);
  const Counters c1 = read_counters(tiered, disk, redis);
  fmt::print("  {} requests\nsoak: {:.0f} s, a fault every ~{:.1f} s ...\n", base.completed, args.seconds,
             args.fault_every_s);
  std::fflush(stdout);

  std::atomic<bool> stop_faults{false};
  FaultInjector injector(server, disk, args, Clock::now());
  std::thread faults([&] { injector.run(stop_faults); });
  PhaseResult faulted = run_phase("faults", world, args.clients, args.seconds, args.seed + 1);
  stop_faults = true;
  faults.join();
  stop_evictor = true;
  evictor.join();
  const Counters c2 = read_counters(tiered, disk, redis);

  // Bytes lost: every key the disk acknowledged and the bench did not erase or damage since, read back exactly.
  tiered.flush();
  std::int64_t checked = 0, lost = 0;
  std::vector<std::string> lost_what;
  for (const KVKey& k : disk.intact_acknowledged()) {
    ++checked;
    const std::optional<KVBlock> got = disk.DiskKVStore::get(k);
    const auto want = blocks.find(k);
    const bool same = got && want != blocks.end() && got->bytes == want->second.bytes &&
                      got->num_tokens == want->second.num_tokens &&
                      got->first_position == want->second.first_position;
    if (!same) {
      ++lost;
      if (lost_what.size() < 10)
        lost_what.push_back(fmt::format("{}: {}", disk.path_for(k).filename().string(),
                                        got ? "bytes differ" : "unreadable: " + disk.last_rejection()));
    }
  }
  // What Redis holds at the end, checked the same way (not a loss criterion: it was killed on purpose).
  std::int64_t redis_held = 0, redis_exact = 0;
  for (const KVKey& k : keys) {
    if (const std::optional<KVBlock> got = redis.get(k)) {
      ++redis_held;
      if (got->bytes == blocks.at(k).bytes) ++redis_exact;
    }
  }
  const FaultLog& flog = injector.log();

  // The table.
  const Counters base_c = c1 - c0, fault_c = c2 - c1;
  std::int64_t injected = 0;
  for (const auto& [k, v] : flog.injected) injected += v;
  fmt::print("\n{:<44} {:>14} {:>14}\n", "", "no faults", "faults");
  const auto row = [](std::string_view name, auto a, auto b) { fmt::print("{:<44} {:>14} {:>14}\n", name, a, b); };
  const auto rowf = [](std::string_view name, double a, double b) {
    fmt::print("{:<44} {:>14.1f} {:>14.1f}\n", name, a, b);
  };
  rowf("seconds", base.seconds, faulted.seconds);
  row("requests completed", base.completed, faulted.completed);
  row("requests failed (exception)", base.failed, faulted.failed);
  row("wrong-KV uses (logits != reference)", base.wrong_kv, faulted.wrong_kv);
  row("requests on a degraded plan (chunk computed)", base.degraded_plans, faulted.degraded_plans);
  row("unverifiable (plan not reproducible)", base.unverifiable, faulted.unverifiable);
  rowf("TTFT p50 ms (FusionResult)", percentile(base.ttft_ms, 0.5), percentile(faulted.ttft_ms, 0.5));
  rowf("TTFT p99 ms (FusionResult)", percentile(base.ttft_ms, 0.99), percentile(faulted.ttft_ms, 0.99));
  rowf("TTFT p99.9 ms (FusionResult)", percentile(base.ttft_ms, 0.999), percentile(faulted.ttft_ms, 0.999));
  rowf("TTFT max ms (FusionResult)", percentile(base.ttft_ms, 1.0), percentile(faulted.ttft_ms, 1.0));
  rowf("request p50 ms (queue + store + run)", percentile(base.wall_ms, 0.5), percentile(faulted.wall_ms, 0.5));
  rowf("request p99 ms (queue + store + run)", percentile(base.wall_ms, 0.99), percentile(faulted.wall_ms, 0.99));
  rowf("request p99.9 ms (queue + store + run)", percentile(base.wall_ms, 0.999), percentile(faulted.wall_ms, 0.999));
  rowf("request max ms (queue + store + run)", percentile(base.wall_ms, 1.0), percentile(faulted.wall_ms, 1.0));
  rowf("requests per second", static_cast<double>(base.completed) / base.seconds,
       static_cast<double>(faulted.completed) / faulted.seconds);
  row("planned entries unusable -> recomputed", base.rejected_entries, faulted.rejected_entries);
  row("layer reads failed mid-prefill", base.layer_read_failures, faulted.layer_read_failures);
  row("reads served: memory", base_c.tier_reads[0], fault_c.tier_reads[0]);
  row("reads served: disk", base_c.tier_reads[1], fault_c.tier_reads[1]);
  row("reads served: redis", base_c.tier_reads[2], fault_c.tier_reads[2]);
  row("rejected: disk (checksum/size/key)", base_c.disk_rejected, fault_c.disk_rejected);
  row("rejected: redis (checksum/size/key)", base_c.redis_rejected, fault_c.redis_rejected);
  row("redis unavailable (reads missed, puts)", base_c.redis_unavailable, fault_c.redis_unavailable);
  row("put failures: memory", base_c.put_failures[0], fault_c.put_failures[0]);
  row("put failures: disk", base_c.put_failures[1], fault_c.put_failures[1]);
  row("put failures: redis", base_c.put_failures[2], fault_c.put_failures[2]);
  row("disk puts acknowledged", base_c.disk_acked_puts, fault_c.disk_acked_puts);
  fmt::print("\nfaults injected: {} ({})\n", injected, [&] {
    std::string s;
    for (const std::string& k : kFaultKinds) {
      const auto it = flog.injected.find(k);
      s += fmt::format("{}{} {}", s.empty() ? "" : ", ", k, it == flog.injected.end() ? 0 : it->second);
    }
    return s;
  }());
  for (const auto& [k, v] : flog.skipped) fmt::print("  skipped (nothing to damage): {} {}\n", k, v);
  for (const std::string& p : flog.problems) fmt::print("  PROBLEM: {}\n", p);
  fmt::print("evictions (both phases, not faults): memory {}, disk {}\n", memory_evictions.load(),
             disk_evictions.load());
  fmt::print("bytes lost: {} of {} disk-acknowledged intact keys unreadable or different ({} keys damaged on "
             "purpose, excluded)\n", lost, checked, disk.damaged_keys());
  for (const std::string& l : lost_what) fmt::print("  LOST {}\n", l);
  fmt::print("redis: {} keys held at the SIGKILLs (no persistence: lost by design); at the end {} of {} keys "
             "held, {} exact\n", flog.redis_keys_lost_to_kill, redis_held, keys.size(), redis_exact);
  for (const PhaseResult* r : {&base, &faulted})
    for (const auto& [msg, n] : r->errors) fmt::print("  {} failure x{}: {}\n", r->name, n, msg);
  for (const PhaseResult* r : {&base, &faulted}) {
    for (const auto& [m, n] : r->wrong_by_method) fmt::print("  {} wrong-KV uses by {}: {}\n", r->name, m, n);
    for (const std::string& e : r->wrong_examples) fmt::print("  {} WRONG-KV {}\n", r->name, e);
  }
  if (!disk.last_rejection().empty()) fmt::print("last disk rejection: {}\n", disk.last_rejection());
  if (!redis.last_rejection().empty()) fmt::print("last redis rejection: {}\n", redis.last_rejection());
  if (!redis.last_error().empty()) fmt::print("last redis error: {}\n", redis.last_error());
  for (std::size_t t = 0; t < 3; ++t)
    if (!tiered.last_put_error(t).empty()) fmt::print("last put error, tier {}: {}\n", t, tiered.last_put_error(t));

  if (!args.json.empty()) {
    nlohmann::json j;
    j["config"] = {{"seconds", args.seconds},
                   {"fault_kinds", args.faults},
                   {"baseline_seconds", args.baseline_seconds},
                   {"fault_every_s", args.fault_every_s},
                   {"clients", args.clients},
                   {"pipelines", args.pipelines},
                   {"prompts", args.prompts},
                   {"methods", kMethods},
                   {"prompt_tokens", {min_tokens, max_tokens}},
                   {"distinct_chunk_caches", keys.size()},
                   {"chunk_cache_bytes", chunk_bytes},
                   {"model", "synthetic Llama: 8 layers, d 64, 4/2 heads of 16, ffn 128, vocab 256 (random weights)"},
                   {"redis_command_timeout_ms", args.redis_timeout_ms},
                   {"seed", args.seed},
                   {"reference_seconds", ref_s}};
    j["baseline"] = phase_json(base, base_c);
    j["faults"] = phase_json(faulted, fault_c);
    j["faults"]["injected"] = flog.injected;
    j["faults"]["skipped"] = flog.skipped;
    j["faults"]["problems"] = flog.problems;
    j["faults"]["log"] = flog.lines;
    j["evictions"] = {{"memory", memory_evictions.load()}, {"disk", disk_evictions.load()}};
    j["bytes_lost"] = {{"disk_keys_checked", checked}, {"lost", lost}, {"damaged_on_purpose", disk.damaged_keys()},
                       {"examples", lost_what}};
    j["redis"] = {{"keys_held_at_sigkills", flog.redis_keys_lost_to_kill},
                  {"keys_held_at_end", redis_held},
                  {"keys_exact_at_end", redis_exact}};
    std::ofstream(args.json) << j.dump(2) << "\n";
  }
  const bool ok = base.failed + faulted.failed == 0 && base.wrong_kv + faulted.wrong_kv == 0 && lost == 0 &&
                  base.unverifiable + faulted.unverifiable == 0 &&
                  flog.problems.empty();
  fmt::print("\n{}\n", ok ? "PASS: no failed request, no wrong-KV use, no byte lost"
                          : "FAIL: see failed requests, wrong-KV uses, bytes lost or problems above");
  return ok ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  kvfuse::harness::refuse_check_only_build("kvfuse-bench-soak");
  try {
    return soak(parse_args(argc, argv));
  } catch (const std::exception& e) {
    std::fprintf(stderr, "kvfuse-bench-soak: %s\n", e.what());
    return 2;
  }
}
