#pragma once
// RedisKVStore: a KVStore (and RangedKVStore) on Redis — one server or a Redis Cluster — through hiredis.
//
// When to use it: a chunk cache shared by several engine processes or hosts, or one larger than a host's DRAM and
// disk. Put it behind a local tier (TieredKVStore<InMemoryKVStore, RedisKVStore>): a Redis failure then costs the
// remote copy, not the request. Link kvfuse::redis (hiredis).
//
// Format: key `key_prefix + "<model:016x>-<content:016x>"` (prefix "kvfuse:" by default); value exactly the bytes
// a DiskKVStore file holds (backend/kv_entry.hpp: checked header, page table, payload), written with one SET, with
// `PX ttl` when RedisOptions::ttl is set.
//   get       GET, then every check of kv_entry.hpp (key, model, size, header checksum, each page).
//   get_many  one pipeline of GETs per node: one round trip per node for a multi-chunk get.
//   contains / contains_many  EXISTS; contains_many one pipeline of EXISTS per node, like get_many.
//   describe  one MULTI/EXEC: EXISTS, STRLEN and GETRANGE of the first 16 KiB (header and page table of entries up
//             to about 130 MB; a larger table costs a second transaction). No payload byte is read.
//   get_into  one MULTI/EXEC: EXISTS, STRLEN, GETRANGE of the header and page table, GETRANGE of the pages the range
//             touches, copied from the reply into the caller's buffer (get_range: get_into a buffer of its own). The
//             transaction makes the header and the pages one snapshot, so an entry replaced since describe() is seen
//             as another version (a miss) and a replacement racing the read is never mistaken for damage.
// A value that fails a check (a foreign key's entry copied under this key, another model, another format version,
// truncated, garbage, a flipped byte, not a string) is rejected: the read returns nullopt and rejected() /
// last_rejection() count and explain it. Rejected values are left in place, not deleted: the store is shared, a
// reader of another kvfuse version may reject what a newer writer stored, and the recompute that follows a miss
// puts the key again, which replaces the value (deleting only an unchanged value would need a script that sends
// the whole value back). An absent key (never stored, expired, evicted by maxmemory) is a plain miss.
//
// Failures: the server down, refusing connections, not answering within command_timeout (each reply wait is bounded
// by it; connecting by connect_timeout) or replying with an error (LOADING, CLUSTERDOWN, ...):
//   reads (get, get_many, describe, get_into, get_range, contains, contains_many) return a miss, count it
//     (unavailable(), last_error()) and never throw;
//   put and erase throw kvfuse::error naming the key, the node and the reason (an OOM reply of a server at maxmemory
//     with noeviction included), code() Status::store_unavailable; TieredKVStore keeps the block in its fast tier
//     when the put fails. erase throws rather than return false: false says the key was not there, which a failed
//     DEL does not know.
// Values that fail their checks are never thrown about (they are rejected: misses); bad options and arguments throw
// Status::invalid_argument.
// A failure drops every connection to that node; reconnection is lazy, with exponential backoff from
// reconnect_initial to reconnect_max: until the backoff expires, calls for that node fail at once without
// touching the network (reads miss, puts throw). The first reply after a reconnection resets the backoff.
//
// Redis Cluster (RedisOptions::cluster; hiredis 0.14 has no cluster support, so the part kvfuse needs is here): the
// slot map comes from CLUSTER SLOTS of any reachable node (the seeds first), read on first use and again after a
// MOVED reply or a node failure. A key's slot is CRC16-XMODEM of the key (or of its {hash tag}) mod 16384; each
// master has its own connections. MOVED updates the map and retries on the new owner; ASK sends ASKING and the
// command to the importing node without changing the map; at most max_redirects redirections per call. A node that
// is down makes its keys misses (puts to them throw) while the other nodes serve theirs. get_many and contains_many
// group keys by node. Only masters are read (no replica reads).
//
// Thread safety: every public call is safe from any number of threads. Each node has a pool of
// connections_per_node connections, each with its own mutex, held for one round trip: up to that many requests per
// node run at once and no lock is held across the network otherwise. The slot map is read under a shared lock; the
// counters and statistics have their own mutex. SIGPIPE from a write to a dead server is blocked in the writing
// thread and discarded, so the process's SIGPIPE disposition does not matter.
//
// Reads are measured like the other stores' (read_stats(): get, get_many, describe and get_into (get_range) calls,
// payload bytes returned, wall time).

#include <hiredis/hiredis.h>
#include <pthread.h>
#include <signal.h>
#include <sys/time.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <charconv>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <ctime>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <shared_mutex>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "kvfuse/backend/concepts.hpp"
#include "kvfuse/backend/kv_entry.hpp"
#include "kvfuse/core/error.hpp"
#include "kvfuse/core/types.hpp"

namespace kvfuse {

// A Redis server: host name or address, and TCP port.
struct RedisEndpoint {
  std::string host;
  int port = 6379;
  friend bool operator==(const RedisEndpoint&, const RedisEndpoint&) = default;
};

struct RedisOptions {
  std::vector<RedisEndpoint> nodes{{"127.0.0.1", 6379}};  // the server; with `cluster`, the seed nodes
  bool cluster = false;                                    // Redis Cluster: route keys by slot
  std::chrono::milliseconds connect_timeout{500};
  std::chrono::milliseconds command_timeout{1000};         // bound on each wait for a reply
  std::chrono::milliseconds ttl{0};                        // entries expire this long after their put; 0: never
  std::chrono::milliseconds reconnect_initial{100};        // backoff after a node's first failure ...
  std::chrono::milliseconds reconnect_max{5000};           // ... doubled after each further one, up to this
  std::string key_prefix = "kvfuse:";
  std::size_t connections_per_node = 4;
  int max_redirects = 5;                                   // MOVED / ASK replies followed per call

  // Throws kvfuse::error naming the bad field.
  void validate() const {
    detail::require(!nodes.empty(), "RedisOptions: no node given");
    for (const RedisEndpoint& node : nodes) {
      detail::require(!node.host.empty(), "RedisOptions: a node has an empty host (port {})", node.port);
      detail::require(node.port > 0 && node.port < 65536, "RedisOptions: node '{}' has port {}, not in 1..65535",
                      node.host, node.port);
    }
    detail::require(cluster || nodes.size() == 1,
                    "RedisOptions: {} nodes given for a single server (set cluster for Redis Cluster seeds)",
                    nodes.size());
    detail::require(connect_timeout.count() > 0, "RedisOptions: connect_timeout = {} ms must be > 0",
                    connect_timeout.count());
    detail::require(command_timeout.count() > 0, "RedisOptions: command_timeout = {} ms must be > 0",
                    command_timeout.count());
    detail::require(ttl.count() >= 0, "RedisOptions: ttl = {} ms must be >= 0", ttl.count());
    detail::require(reconnect_initial.count() > 0, "RedisOptions: reconnect_initial = {} ms must be > 0",
                    reconnect_initial.count());
    detail::require(reconnect_max >= reconnect_initial,
                    "RedisOptions: reconnect_max = {} ms must be >= reconnect_initial = {} ms", reconnect_max.count(),
                    reconnect_initial.count());
    detail::require(connections_per_node >= 1, "RedisOptions: connections_per_node = {} must be >= 1",
                    connections_per_node);
    detail::require(max_redirects >= 1, "RedisOptions: max_redirects = {} must be >= 1", max_redirects);
  }
};

// Options for `redis://HOST:PORT` (one server) or `redis-cluster://HOST:PORT[,HOST:PORT...]` (cluster seeds);
// HOST may be an [IPv6] address. Every other option keeps its default. Throws kvfuse::error naming the bad part.
[[nodiscard]] inline RedisOptions parse_redis_uri(std::string_view uri) {
  constexpr std::string_view single = "redis://";
  constexpr std::string_view cluster = "redis-cluster://";
  RedisOptions options;
  std::string_view rest;
  if (uri.starts_with(single)) {
    rest = uri.substr(single.size());
  } else if (uri.starts_with(cluster)) {
    rest = uri.substr(cluster.size());
    options.cluster = true;
  } else {
    throw error(fmt::format("parse_redis_uri: '{}' is not a Redis URI (expected redis://HOST:PORT or "
                            "redis-cluster://HOST:PORT[,HOST:PORT...])",
                            uri));
  }
  options.nodes.clear();
  while (true) {
    const std::size_t comma = rest.find(',');
    const std::string_view part = rest.substr(0, comma);
    std::size_t colon = part.rfind(':');
    std::string_view host = part.substr(0, colon == std::string_view::npos ? part.size() : colon);
    if (part.starts_with('[')) {
      const std::size_t close = part.find(']');
      colon = close == std::string_view::npos || close + 1 >= part.size() || part[close + 1] != ':'
                  ? std::string_view::npos
                  : close + 1;
      host = part.substr(1, close == std::string_view::npos ? 0 : close - 1);
    }
    detail::require(colon != std::string_view::npos, "parse_redis_uri: '{}': node '{}' is not HOST:PORT", uri, part);
    detail::require(!host.empty() && host.find_first_of("/@?#[]") == std::string_view::npos,
                    "parse_redis_uri: '{}': node '{}' has an invalid host '{}'", uri, part, host);
    const std::string_view port_text = part.substr(colon + 1);
    int port = 0;
    const auto [end, ec] = std::from_chars(port_text.data(), port_text.data() + port_text.size(), port);
    detail::require(ec == std::errc() && end == port_text.data() + port_text.size() && port > 0 && port < 65536,
                    "parse_redis_uri: '{}': node '{}' has port '{}', not a number in 1..65535", uri, part, port_text);
    options.nodes.push_back({std::string(host), port});
    if (comma == std::string_view::npos) break;
    rest = rest.substr(comma + 1);
  }
  detail::require(options.cluster || options.nodes.size() == 1,
                  "parse_redis_uri: '{}' names {} nodes; redis:// takes one (redis-cluster:// for a cluster)", uri,
                  options.nodes.size());
  return options;
}

// The Redis Cluster slot of `key`: CRC16-XMODEM of the key, or of its hash tag (the text between the first '{' and
// the next '}', when not empty), mod 16384.
[[nodiscard]] inline std::uint16_t redis_key_slot(std::string_view key) noexcept {
  if (const std::size_t open = key.find('{'); open != std::string_view::npos) {
    if (const std::size_t close = key.find('}', open + 1); close != std::string_view::npos && close > open + 1) {
      key = key.substr(open + 1, close - open - 1);
    }
  }
  std::uint16_t crc = 0;
  for (const char c : key) {
    crc = static_cast<std::uint16_t>(crc ^ (static_cast<std::uint8_t>(c) << 8));
    for (int bit = 0; bit < 8; ++bit) {
      crc = static_cast<std::uint16_t>((crc & 0x8000) != 0 ? (crc << 1) ^ 0x1021 : crc << 1);
    }
  }
  return static_cast<std::uint16_t>(crc & 16383);
}

namespace detail {

inline constexpr std::size_t redis_cluster_slots = 16384;
// describe() reads this many bytes of an entry first: the header and a page table of up to 2040 pages.
inline constexpr std::uint64_t redis_describe_read_bytes = 16384;

struct RedisReplyFree {
  void operator()(redisReply* r) const noexcept { freeReplyObject(r); }
};
using RedisReplyPtr = std::unique_ptr<redisReply, RedisReplyFree>;

struct RedisContextFree {
  void operator()(redisContext* c) const noexcept { redisFree(c); }
};
using RedisContextPtr = std::unique_ptr<redisContext, RedisContextFree>;

// One command: its arguments (binary-safe).
using RedisCommand = std::vector<std::string_view>;

[[nodiscard]] inline std::string_view redis_text(const redisReply& r) noexcept { return {r.str, r.len}; }

[[nodiscard]] inline std::span<const std::byte> redis_bytes(const redisReply& r) noexcept {
  return std::as_bytes(std::span<const char>(r.str, r.len));
}

[[nodiscard]] inline timeval redis_timeval(std::chrono::milliseconds ms) noexcept {
  return {static_cast<time_t>(ms.count() / 1000), static_cast<suseconds_t>(ms.count() % 1000 * 1000)};
}

// Blocks SIGPIPE in this thread while alive, and discards a SIGPIPE raised meanwhile (a write to a server that
// went away): hiredis writes with write(2), which would otherwise kill a process that did not ignore SIGPIPE.
class ScopedSigpipeBlock {
 public:
  ScopedSigpipeBlock() noexcept {
    sigemptyset(&pipe_);
    sigaddset(&pipe_, SIGPIPE);
    pthread_sigmask(SIG_BLOCK, &pipe_, &old_);
    sigset_t pending;
    sigpending(&pending);
    was_pending_ = sigismember(&pending, SIGPIPE) == 1;
  }
  ScopedSigpipeBlock(const ScopedSigpipeBlock&) = delete;
  ScopedSigpipeBlock& operator=(const ScopedSigpipeBlock&) = delete;
  ~ScopedSigpipeBlock() {
    sigset_t pending;
    sigpending(&pending);
    if (!was_pending_ && sigismember(&pending, SIGPIPE) == 1) {
      const timespec now{};
      while (sigtimedwait(&pipe_, nullptr, &now) < 0 && errno == EINTR) {
      }
    }
    pthread_sigmask(SIG_SETMASK, &old_, nullptr);
  }

 private:
  sigset_t pipe_{};
  sigset_t old_{};
  bool was_pending_ = false;
};

// What a node answered to a pipeline: one reply per command, or why it could not be asked.
struct RedisExchange {
  std::vector<RedisReplyPtr> replies;
  std::string error;         // "" when every reply arrived
  bool new_failure = false;  // this call's failure started or extended the node's backoff
};

// One Redis server: a pool of connections and the reconnection backoff they share.
class RedisNode {
 public:
  RedisNode(RedisEndpoint endpoint, const RedisOptions& options)
      : endpoint_(std::move(endpoint)),
        name_(endpoint_.host.find(':') != std::string::npos ? fmt::format("[{}]:{}", endpoint_.host, endpoint_.port)
                                                            : fmt::format("{}:{}", endpoint_.host, endpoint_.port)),
        options_(options) {
    for (std::size_t i = 0; i < options.connections_per_node; ++i) pool_.push_back(std::make_unique<Connection>());
  }

  [[nodiscard]] const RedisEndpoint& endpoint() const noexcept { return endpoint_; }
  [[nodiscard]] const std::string& name() const noexcept { return name_; }

  // Sends `commands` as one pipeline on one connection and reads every reply. A failure (no connection, I/O
  // error, timeout) drops the node's connections and starts or extends the backoff; error replies are replies.
  [[nodiscard]] RedisExchange exchange(std::span<const RedisCommand> commands) {
    Connection* conn = nullptr;
    const std::unique_lock lock = acquire(conn);
    if (RedisExchange failed = connect(*conn); !failed.error.empty()) return failed;
    redisContext* c = conn->context.get();
    const ScopedSigpipeBlock no_sigpipe;
    std::vector<const char*> argv;
    std::vector<std::size_t> lengths;
    for (const RedisCommand& command : commands) {
      argv.clear();
      lengths.clear();
      for (const std::string_view arg : command) {
        argv.push_back(arg.data());
        lengths.push_back(arg.size());
      }
      if (redisAppendCommandArgv(c, static_cast<int>(argv.size()), argv.data(), lengths.data()) != REDIS_OK) {
        return fail(*conn, fmt::format("cannot queue a command: {}", c->errstr));
      }
    }
    RedisExchange out;
    out.replies.reserve(commands.size());
    for (std::size_t i = 0; i < commands.size(); ++i) {
      void* reply = nullptr;
      if (redisGetReply(c, &reply) != REDIS_OK) {
        const int err = errno;
        const bool timed_out = c->err == REDIS_ERR_IO && (err == EAGAIN || err == EWOULDBLOCK);
        return fail(*conn, timed_out ? fmt::format("no reply within the command timeout ({} ms)",
                                                   options_.command_timeout.count())
                                     : std::string(c->errstr));
      }
      out.replies.emplace_back(static_cast<redisReply*>(reply));
    }
    std::lock_guard state(state_mutex_);
    if (conn->generation == generation_) backoff_ = std::chrono::milliseconds{0};  // not a reply from before a failure
    return out;
  }

 private:
  struct Connection {
    std::mutex mutex;  // held for a whole round trip
    RedisContextPtr context;
    std::uint64_t generation = 0;  // the node's failure count when it connected
  };

  // A free connection if there is one, else the next one in turn (waiting for it).
  [[nodiscard]] std::unique_lock<std::mutex> acquire(Connection*& conn) {
    for (const auto& candidate : pool_) {
      std::unique_lock lock(candidate->mutex, std::try_to_lock);
      if (lock.owns_lock()) {
        conn = candidate.get();
        return lock;
      }
    }
    conn = pool_[next_.fetch_add(1, std::memory_order_relaxed) % pool_.size()].get();
    return std::unique_lock(conn->mutex);
  }

  // Keeps the connection when it predates no failure, else reconnects unless the backoff forbids it: no error, or
  // why not.
  [[nodiscard]] RedisExchange connect(Connection& conn) {
    {
      std::lock_guard state(state_mutex_);
      if (conn.context && conn.generation == generation_) return {};
      conn.context.reset();
      const auto now = std::chrono::steady_clock::now();
      if (now < retry_at_) {
        return {{}, fmt::format("not retried for another {} ms after: {}",
                                std::chrono::ceil<std::chrono::milliseconds>(retry_at_ - now).count(), last_failure_)};
      }
      conn.generation = generation_;
    }
    RedisContextPtr c(redisConnectWithTimeout(endpoint_.host.c_str(), endpoint_.port,
                                              redis_timeval(options_.connect_timeout)));
    if (!c) return fail(conn, "cannot allocate a connection");
    if (c->err != 0) return fail(conn, fmt::format("cannot connect: {}", c->errstr));
    if (redisSetTimeout(c.get(), redis_timeval(options_.command_timeout)) != REDIS_OK) {
      return fail(conn, fmt::format("cannot set the command timeout: {}", c->errstr));
    }
    conn.context = std::move(c);
    return {};
  }

  // Drops `conn`; the first failure since the connection was made also drops the node's other connections (a new
  // generation) and starts or doubles the backoff. Returns the failure.
  [[nodiscard]] RedisExchange fail(Connection& conn, std::string_view why) {
    conn.context.reset();
    RedisExchange out{{}, std::string(why), false};
    std::lock_guard state(state_mutex_);
    if (conn.generation == generation_) {
      ++generation_;
      backoff_ = backoff_.count() == 0 ? options_.reconnect_initial : std::min(backoff_ * 2, options_.reconnect_max);
      retry_at_ = std::chrono::steady_clock::now() + backoff_;
      last_failure_ = out.error;
      out.new_failure = true;
    }
    return out;
  }

  RedisEndpoint endpoint_;
  std::string name_;
  const RedisOptions& options_;
  std::vector<std::unique_ptr<Connection>> pool_;
  std::atomic<std::size_t> next_{0};
  std::mutex state_mutex_;  // guards the fields below; taken after a connection's mutex, never before
  std::uint64_t generation_ = 0;
  std::chrono::milliseconds backoff_{0};
  std::chrono::steady_clock::time_point retry_at_{};
  std::string last_failure_;
};

// A MOVED or ASK error reply: the slot and the node to ask.
struct RedisRedirect {
  bool ask = false;
  std::size_t slot = 0;
  RedisEndpoint target;
};

// The redirection among `replies` (the first MOVED or ASK error), if any. `from` fills an empty host.
[[nodiscard]] inline std::optional<RedisRedirect> redis_redirect(const std::vector<RedisReplyPtr>& replies,
                                                                 const RedisEndpoint& from) {
  for (const RedisReplyPtr& r : replies) {
    if (r->type != REDIS_REPLY_ERROR) continue;
    const std::string_view text = redis_text(*r);
    RedisRedirect out;
    std::string_view rest;
    if (text.starts_with("MOVED ")) {
      rest = text.substr(6);
    } else if (text.starts_with("ASK ")) {
      rest = text.substr(4);
      out.ask = true;
    } else {
      continue;
    }
    const std::size_t space = rest.find(' ');
    const std::size_t colon = rest.rfind(':');
    if (space == std::string_view::npos || colon == std::string_view::npos || colon < space) continue;
    const auto [slot_end, slot_ec] = std::from_chars(rest.data(), rest.data() + space, out.slot);
    const auto [port_end, port_ec] = std::from_chars(rest.data() + colon + 1, rest.data() + rest.size(), out.target.port);
    if (slot_ec != std::errc() || port_ec != std::errc() || out.slot >= redis_cluster_slots) continue;
    out.target.host = std::string(rest.substr(space + 1, colon - space - 1));
    if (out.target.host.empty()) out.target.host = from.host;
    return out;
  }
  return std::nullopt;
}

// What a pipeline about one key got: the replies of the node that serves the key, or why there are none.
struct RedisRouted {
  std::vector<RedisReplyPtr> replies;
  std::string error;  // "" when the replies are there
  std::string node;   // the node that answered or failed
};

// The nodes of a store and, for a cluster, which master serves each slot.
class RedisRouter {
 public:
  explicit RedisRouter(const RedisOptions& options) : options_(options), slots_(redis_cluster_slots, nullptr) {
    for (const RedisEndpoint& seed : options.nodes) (void)node_at(seed);
  }

  // The slot map's version, and a reread of the map after a failure seen on a node it routed to (a failover may
  // have moved the node's slots), unless another thread reread it since `seen_epoch`.
  [[nodiscard]] std::uint64_t epoch() {
    std::shared_lock lock(map_mutex_);
    return epoch_;
  }
  void refresh_after_failure(std::uint64_t seen_epoch) { (void)refresh(seen_epoch); }

  // The node serving `key` (in a cluster: its slot's master, the slot map read when missing), or nullptr and why.
  [[nodiscard]] RedisNode* route(std::string_view key, std::string& why) {
    if (!options_.cluster) return order_.front();
    const std::size_t slot = redis_key_slot(key);
    std::uint64_t epoch = 0;
    {
      std::shared_lock lock(map_mutex_);
      if (slots_[slot] != nullptr) return slots_[slot];
      epoch = epoch_;
    }
    why = refresh(epoch);
    if (!why.empty()) return nullptr;
    std::shared_lock lock(map_mutex_);
    if (slots_[slot] == nullptr) why = fmt::format("slot {} is served by no node of the cluster", slot);
    return slots_[slot];
  }

  // Runs `commands` (about `key`) on the node serving it, following MOVED and ASK replies.
  [[nodiscard]] RedisRouted run(std::string_view key, std::span<const RedisCommand> commands) {
    std::string why;
    RedisNode* node = route(key, why);
    if (node == nullptr) return {{}, std::move(why), "the cluster"};
    std::vector<RedisCommand> asking;
    for (int redirects = 0;; ++redirects) {
      std::uint64_t epoch = 0;
      if (options_.cluster) {
        std::shared_lock lock(map_mutex_);
        epoch = epoch_;
      }
      RedisExchange ex = node->exchange(asking.empty() ? commands : std::span<const RedisCommand>(asking));
      if (!ex.error.empty()) {
        if (options_.cluster && ex.new_failure) (void)refresh(epoch);  // a failover may have moved the node's slots
        return {{}, std::move(ex.error), node->name()};
      }
      if (!asking.empty()) ex.replies.erase(ex.replies.begin());  // ASKING's +OK
      const std::optional<RedisRedirect> redirect =
          options_.cluster ? redis_redirect(ex.replies, node->endpoint()) : std::nullopt;
      if (!redirect) return {std::move(ex.replies), {}, node->name()};
      if (redirects == options_.max_redirects) {
        return {{}, fmt::format("more than {} redirections (the last to slot {} on {}:{})", options_.max_redirects,
                                redirect->slot, redirect->target.host, redirect->target.port),
                node->name()};
      }
      node = node_at(redirect->target);
      asking.clear();
      if (redirect->ask) {
        ++asks_;
        asking.push_back({"ASKING"});
        asking.insert(asking.end(), commands.begin(), commands.end());
      } else {
        ++moves_;
        {
          std::unique_lock lock(map_mutex_);
          slots_[redirect->slot] = node;
        }
        (void)refresh(epoch);
      }
    }
  }

  // MOVED and ASK replies followed so far.
  [[nodiscard]] std::int64_t moves() const noexcept { return moves_.load(); }
  [[nodiscard]] std::int64_t asks() const noexcept { return asks_.load(); }

 private:
  // The node at `endpoint`, added when new. Nodes are never removed, so the pointer stays valid.
  [[nodiscard]] RedisNode* node_at(const RedisEndpoint& endpoint) {
    std::unique_lock lock(map_mutex_);
    for (RedisNode* node : order_) {
      if (node->endpoint() == endpoint) return node;
    }
    nodes_.push_back(std::make_unique<RedisNode>(endpoint, options_));
    order_.push_back(nodes_.back().get());
    return order_.back();
  }

  // Reads the slot map from the first node that answers CLUSTER SLOTS (seeds first) unless another thread did
  // since `seen_epoch`: "" or why no node could tell.
  [[nodiscard]] std::string refresh(std::uint64_t seen_epoch) {
    const std::lock_guard serial(refresh_mutex_);
    std::vector<RedisNode*> candidates;
    {
      std::shared_lock lock(map_mutex_);
      if (epoch_ != seen_epoch) return {};
      candidates = order_;
    }
    static const std::vector<RedisCommand> slots_command{{"CLUSTER", "SLOTS"}};
    std::string errors;
    for (RedisNode* node : candidates) {
      RedisExchange ex = node->exchange(slots_command);
      std::string why = ex.error.empty() ? std::string() : fmt::format("{}: {}", node->name(), ex.error);
      std::vector<std::pair<std::pair<long long, long long>, RedisEndpoint>> ranges;
      if (why.empty()) {
        if (std::string bad = parse_slots(*ex.replies.front(), node->endpoint(), ranges); !bad.empty()) {
          why = fmt::format("{}: {}", node->name(), bad);
        }
      }
      if (!why.empty()) {
        errors += fmt::format("{}{}", errors.empty() ? "" : "; ", why);
        continue;
      }
      std::vector<RedisNode*> owners;
      for (const auto& range : ranges) owners.push_back(node_at(range.second));
      std::unique_lock lock(map_mutex_);
      std::fill(slots_.begin(), slots_.end(), nullptr);
      for (std::size_t i = 0; i < ranges.size(); ++i) {
        for (long long s = ranges[i].first.first; s <= ranges[i].first.second; ++s) {
          slots_[static_cast<std::size_t>(s)] = owners[i];
        }
      }
      ++epoch_;
      return {};
    }
    return fmt::format("cannot read the cluster's slot map from any node: {}", errors);
  }

  // The slot ranges and masters of a CLUSTER SLOTS reply: "" or why it is not one.
  [[nodiscard]] static std::string parse_slots(
      const redisReply& r, const RedisEndpoint& from,
      std::vector<std::pair<std::pair<long long, long long>, RedisEndpoint>>& ranges) {
    if (r.type == REDIS_REPLY_ERROR) return fmt::format("CLUSTER SLOTS: {}", redis_text(r));
    if (r.type != REDIS_REPLY_ARRAY) return "CLUSTER SLOTS: not an array";
    for (std::size_t i = 0; i < r.elements; ++i) {
      const redisReply& e = *r.element[i];
      const bool ok = e.type == REDIS_REPLY_ARRAY && e.elements >= 3 && e.element[0]->type == REDIS_REPLY_INTEGER &&
                      e.element[1]->type == REDIS_REPLY_INTEGER && e.element[2]->type == REDIS_REPLY_ARRAY &&
                      e.element[2]->elements >= 2 && e.element[2]->element[0]->type == REDIS_REPLY_STRING &&
                      e.element[2]->element[1]->type == REDIS_REPLY_INTEGER;
      const long long first = ok ? e.element[0]->integer : -1;
      const long long last = ok ? e.element[1]->integer : -1;
      if (!ok || first < 0 || last < first || last >= static_cast<long long>(redis_cluster_slots)) {
        return fmt::format("CLUSTER SLOTS: malformed entry {}", i);
      }
      RedisEndpoint master{std::string(redis_text(*e.element[2]->element[0])),
                           static_cast<int>(e.element[2]->element[1]->integer)};
      if (master.host.empty()) master.host = from.host;
      ranges.push_back({{first, last}, std::move(master)});
    }
    return {};
  }

  const RedisOptions& options_;
  std::shared_mutex map_mutex_;  // guards the nodes and the slot map
  std::vector<std::unique_ptr<RedisNode>> nodes_;
  std::vector<RedisNode*> order_;  // the nodes, seeds first
  std::vector<RedisNode*> slots_;  // the master of each slot; nullptr: unknown
  std::uint64_t epoch_ = 0;        // slot map reads so far
  std::mutex refresh_mutex_;       // one slot map read at a time
  std::atomic<std::int64_t> moves_{0};
  std::atomic<std::int64_t> asks_{0};
};

}  // namespace detail

class RedisKVStore {
 public:
  // Validates the options (kvfuse::error naming the bad one); connects on first use, so a server that is down
  // now is not an error here.
  explicit RedisKVStore(RedisOptions options) : options_((options.validate(), std::move(options))), router_(options_) {}
  // A store on parse_redis_uri(uri).
  explicit RedisKVStore(std::string_view uri) : RedisKVStore(parse_redis_uri(uri)) {}

  RedisKVStore(const RedisKVStore&) = delete;
  RedisKVStore& operator=(const RedisKVStore&) = delete;

  [[nodiscard]] const RedisOptions& options() const noexcept { return options_; }

  // The Redis key of `key`: key_prefix + "<model:016x>-<content:016x>".
  [[nodiscard]] std::string key_name(const KVKey& key) const {
    return fmt::format("{}{:016x}-{:016x}", options_.key_prefix, key.model, key.content);
  }

  // Whether the key exists (EXISTS); the value is not checked (get() may still reject it). False when the node
  // cannot answer (counted in unavailable()).
  [[nodiscard]] bool contains(const KVKey& key) const {
    const std::string name = key_name(key);
    const std::vector<detail::RedisCommand> commands{{"EXISTS", name}};
    detail::RedisRouted routed = router_.run(name, commands);
    if (!routed.error.empty()) {
      miss("contains", name, routed.node, routed.error);
      return false;
    }
    return exists_of(name, routed.node, *routed.replies.front());
  }

  // contains() of each key, with one pipeline of EXISTS per node (one round trip per node); result i belongs to
  // keys[i].
  [[nodiscard]] std::vector<bool> contains_many(std::span<const KVKey> keys) const {
    std::vector<bool> out(keys.size(), false);
    const std::vector<std::string> names = key_names(keys);
    per_node("contains", "EXISTS", names, [&](std::size_t i, const std::string& node, const redisReply& r) {
      out[i] = exists_of(names[i], node, r);
    });
    return out;
  }

  // The block, or nullopt when absent, rejected or unreachable (see the header comment).
  [[nodiscard]] std::optional<KVBlock> get(const KVKey& key) {
    return timed([&]() -> std::optional<KVBlock> {
      const std::string name = key_name(key);
      const std::vector<detail::RedisCommand> commands{{"GET", name}};
      detail::RedisRouted routed = router_.run(name, commands);
      if (!routed.error.empty()) return miss("get", name, routed.node, routed.error);
      return block_of(key, name, routed.node, *routed.replies.front());
    });
  }

  // get() of each key, with one pipeline of GETs per node (one round trip per node); result i belongs to keys[i].
  [[nodiscard]] std::vector<std::optional<KVBlock>> get_many(std::span<const KVKey> keys) {
    return timed([&] {
      std::vector<std::optional<KVBlock>> out(keys.size());
      const std::vector<std::string> names = key_names(keys);
      per_node("get", "GET", names, [&](std::size_t i, const std::string& node, const redisReply& r) {
        out[i] = block_of(keys[i], names[i], node, r);
      });
      return out;
    });
  }

  // RangedKVStore: the entry's header and page table, checked, or nullopt when absent, rejected or unreachable.
  // No payload byte is read.
  [[nodiscard]] std::optional<KVBlockInfo> describe(const KVKey& key) {
    return timed([&]() -> std::optional<KVBlockInfo> {
      const std::string name = key_name(key);
      std::uint64_t read_bytes = detail::redis_describe_read_bytes;
      std::string node;
      // A second pass reads a page table longer than the first read; a third only if the entry grew meanwhile.
      for (int pass = 0; pass < 3; ++pass) {
        const std::string last = fmt::format("{}", read_bytes - 1);
        Transaction tx = transaction(name, {{"EXISTS", name}, {"STRLEN", name}, {"GETRANGE", name, "0", last}});
        node = tx.node;
        if (!tx.error.empty()) return tx.wrong_type ? reject(name, tx.node, tx.error) : miss("describe", name, tx.node, tx.error);
        if (tx.results[0]->integer == 0) return std::nullopt;
        const std::span<const std::byte> prefix = detail::redis_bytes(*tx.results[2]);
        KVEntryLayout layout;
        std::string why = parse_kv_entry_header(prefix, static_cast<std::uint64_t>(tx.results[1]->integer), key, layout);
        if (why.empty() && layout.payload_offset > prefix.size()) {
          read_bytes = layout.payload_offset;
          continue;
        }
        if (why.empty()) {
          why = parse_kv_entry_pages(prefix.first(kv_entry_header_bytes),
                                     prefix.subspan(kv_entry_header_bytes, layout.payload_offset - kv_entry_header_bytes),
                                     layout);
        }
        if (!why.empty()) return reject(name, tx.node, why);
        return layout.info;
      }
      return miss("describe", name, node, "the entry kept growing while being read");
    });
  }

  // RangedKVStore: payload bytes [offset, offset + out.size()) of the entry `info` described, read with the header
  // and page table in one transaction, checked page by page and copied from the reply into `out`; false when the entry
  // is gone, was replaced since describe() (another version: neither a rejection nor a failure), fails a check
  // (rejected) or is unreachable.
  [[nodiscard]] bool get_into(const KVKey& key, const KVBlockInfo& info, std::uint64_t offset,
                              std::span<std::byte> out) {
    detail::require_in_entry("RedisKVStore", "get_into", info, offset, out.size());
    return timed(
        [&]() -> bool {
          const std::string name = key_name(key);
          // The page size is the entry's: the one kvfuse writes, read again in the rare case the header says otherwise.
          KVEntryLayout guess;
          guess.page_bytes = kv_entry_page_bytes;
          guess.info.bytes = info.bytes;
          std::string node;
          for (int pass = 0; pass < 2; ++pass) {
            const std::uint64_t pages = info.bytes / guess.page_bytes + (info.bytes % guess.page_bytes != 0 ? 1 : 0);
            const std::uint64_t payload_offset = kv_entry_header_bytes + pages * sizeof(std::uint64_t);
            const KVEntryPageSpan span = kv_entry_page_span(guess, offset, out.size());
            const std::string prefix_last = fmt::format("{}", payload_offset - 1);
            const std::string first = fmt::format("{}", payload_offset + span.begin);
            const std::string last = fmt::format("{}", payload_offset + span.end - 1);
            std::vector<detail::RedisCommand> commands{
                {"EXISTS", name}, {"STRLEN", name}, {"GETRANGE", name, "0", prefix_last}};
            if (span.end > span.begin) commands.push_back({"GETRANGE", name, first, last});
            Transaction tx = transaction(name, std::move(commands));
            node = tx.node;
            if (!tx.error.empty()) {
              if (tx.wrong_type) return rejected(name, tx.node, tx.error);
              miss("get_into", name, tx.node, tx.error);
              return false;
            }
            if (tx.results[0]->integer == 0) return false;
            const std::span<const std::byte> prefix = detail::redis_bytes(*tx.results[2]);
            KVEntryLayout layout;
            std::string why =
                parse_kv_entry_header(prefix, static_cast<std::uint64_t>(tx.results[1]->integer), key, layout);
            if (!why.empty()) return rejected(name, tx.node, why);
            if (layout.info.version != info.version || layout.info.bytes != info.bytes) return false;
            if (layout.page_bytes != guess.page_bytes) {
              guess.page_bytes = layout.page_bytes;
              continue;
            }
            why = parse_kv_entry_pages(prefix.first(kv_entry_header_bytes), prefix.subspan(kv_entry_header_bytes),
                                       layout);
            if (!why.empty()) return rejected(name, tx.node, why);
            const std::span<const std::byte> bytes =
                span.end > span.begin ? detail::redis_bytes(*tx.results[3]) : std::span<const std::byte>();
            if (bytes.size() != span.end - span.begin) {
              return rejected(name, tx.node, fmt::format("truncated: {} of payload bytes [{}, {}) present",
                                                         bytes.size(), span.begin, span.end));
            }
            if (why = check_kv_entry_pages(layout, span.first_page, bytes); !why.empty()) {
              return rejected(name, tx.node, why);
            }
            if (!out.empty()) std::memcpy(out.data(), bytes.data() + (offset - span.begin), out.size());
            return true;
          }
          return rejected(name, node, "the page size changed between two reads of one version");
        },
        out.size());
  }
  [[nodiscard]] std::optional<std::vector<std::byte>> get_range(const KVKey& key, const KVBlockInfo& info,
                                                                std::uint64_t offset, std::uint64_t size) {
    return detail::get_range_by_get_into(*this, "RedisKVStore", key, info, offset, size);
  }

  // Stores the block with one SET (PX ttl when set), replacing any value of the key. Throws kvfuse::error naming the
  // key, the node and the reason: num_tokens < 0 (Status::invalid_argument); the node unreachable or in backoff, an
  // error reply (OOM at maxmemory with noeviction, ...) (Status::store_unavailable).
  void put(const KVKey& key, KVBlock block) {
    const std::string name = key_name(key);
    detail::require(block.num_tokens >= 0, "RedisKVStore: cannot store '{}': num_tokens = {} must be >= 0", name,
                    block.num_tokens);
    const std::vector<std::byte> prefix = kv_entry_prefix(key, block);
    std::string value;
    value.reserve(prefix.size() + block.bytes.size());
    value.append(reinterpret_cast<const char*>(prefix.data()), prefix.size());
    value.append(reinterpret_cast<const char*>(block.bytes.data()), block.bytes.size());
    block.bytes = {};
    const std::string ttl = fmt::format("{}", options_.ttl.count());
    std::vector<detail::RedisCommand> commands{{"SET", name, value}};
    if (options_.ttl.count() > 0) commands.front().insert(commands.front().end(), {"PX", ttl});
    detail::RedisRouted routed = router_.run(name, commands);
    if (routed.error.empty()) {
      const redisReply& r = *routed.replies.front();
      if (r.type == REDIS_REPLY_STATUS && detail::redis_text(r) == "OK") return;
      routed.error = reply_problem(r);
    }
    throw error(Status::store_unavailable,
                failure(fmt::format("cannot store '{}' on {}: {}", name, routed.node, routed.error)));
  }

  // Deletes the key (DEL); returns whether it existed. Throws kvfuse::error naming the key, the node and the reason
  // (Status::store_unavailable) when the node cannot answer.
  bool erase(const KVKey& key) {
    const std::string name = key_name(key);
    detail::RedisRouted routed = router_.run(name, std::vector<detail::RedisCommand>{{"DEL", name}});
    if (routed.error.empty()) {
      const redisReply& r = *routed.replies.front();
      if (r.type == REDIS_REPLY_INTEGER) return r.integer > 0;
      routed.error = reply_problem(r);
    }
    throw error(Status::store_unavailable,
                failure(fmt::format("cannot erase '{}' on {}: {}", name, routed.node, routed.error)));
  }

  // How many values reads have rejected, and why the last one was (empty before the first).
  [[nodiscard]] std::int64_t rejected() const {
    std::lock_guard lock(mutex_);
    return rejected_;
  }
  [[nodiscard]] std::string last_rejection() const {
    std::lock_guard lock(mutex_);
    return last_rejection_;
  }

  // How many reads missed because a node could not answer, and the last failure of any call, puts and erases
  // included (empty before the first).
  [[nodiscard]] std::int64_t unavailable() const {
    std::lock_guard lock(mutex_);
    return unavailable_;
  }
  [[nodiscard]] std::string last_error() const {
    std::lock_guard lock(mutex_);
    return last_error_;
  }

  // Reads measured: get, get_many, describe and get_into (get_range) calls, the payload bytes they returned, their
  // wall time.
  [[nodiscard]] ReadStats read_stats() const {
    std::lock_guard lock(mutex_);
    return stats_;
  }

  // Cluster redirections followed: MOVED (the slot map was updated) and ASK (a migrating slot's key).
  [[nodiscard]] std::int64_t moved_redirects() const noexcept { return router_.moves(); }
  [[nodiscard]] std::int64_t ask_redirects() const noexcept { return router_.asks(); }

 private:
  // The replies of a MULTI/EXEC transaction (owned by `exec`), or why there are none.
  struct Transaction {
    detail::RedisReplyPtr exec;
    std::span<redisReply*> results;
    std::string error;
    std::string node;
    bool wrong_type = false;  // the error is a WRONGTYPE reply: the key holds no string (rejected, not a failure)
  };

  // Runs `commands` on `name`'s node as one MULTI ... EXEC pipeline. Every result is checked for the type the
  // reads expect (EXISTS and STRLEN integers, GETRANGE strings); anything else is an error.
  [[nodiscard]] Transaction transaction(const std::string& name, std::vector<detail::RedisCommand> commands) const {
    const std::size_t n = commands.size();
    commands.insert(commands.begin(), {"MULTI"});
    commands.push_back({"EXEC"});
    detail::RedisRouted routed = router_.run(name, commands);
    Transaction tx{nullptr, {}, std::move(routed.error), std::move(routed.node), false};
    if (!tx.error.empty()) return tx;
    for (const detail::RedisReplyPtr& r : routed.replies) {
      if (r->type == REDIS_REPLY_ERROR && !detail::redis_text(*r).starts_with("EXECABORT")) {
        tx.error = reply_problem(*r);
        return tx;
      }
    }
    tx.exec = std::move(routed.replies.back());
    if (tx.exec->type != REDIS_REPLY_ARRAY || tx.exec->elements != n) {
      tx.error = fmt::format("EXEC: {}", reply_problem(*tx.exec));
      return tx;
    }
    tx.results = std::span<redisReply*>(tx.exec->element, n);
    for (std::size_t i = 0; i < n; ++i) {
      const int want = i < 2 ? REDIS_REPLY_INTEGER : REDIS_REPLY_STRING;
      if (tx.results[i]->type != want) {
        tx.error = reply_problem(*tx.results[i]);
        tx.wrong_type = is_wrong_type(*tx.results[i]);
        return tx;
      }
    }
    return tx;
  }

  [[nodiscard]] std::vector<std::string> key_names(std::span<const KVKey> keys) const {
    std::vector<std::string> names;
    names.reserve(keys.size());
    for (const KVKey& key : keys) names.push_back(key_name(key));
    return names;
  }

  // Runs `command` (GET, EXISTS) on each of `names`, one pipeline per node, and hands the reply about names[i] from
  // `node` to answer(i, node, reply). A MOVED or ASK reply is followed for its key alone; a key whose node cannot
  // answer (or whose slot has none) is a miss of `op`, counted, and answer is not called for it.
  template <class Answer>
  void per_node(std::string_view op, std::string_view command, const std::vector<std::string>& names,
                Answer&& answer) const {
    std::map<detail::RedisNode*, std::vector<std::size_t>> by_node;
    const std::uint64_t epoch = router_.epoch();
    for (std::size_t i = 0; i < names.size(); ++i) {
      std::string why;
      if (detail::RedisNode* node = router_.route(names[i], why)) {
        by_node[node].push_back(i);
      } else {
        miss(op, names[i], "the cluster", why);
      }
    }
    for (const auto& [node, indices] : by_node) {
      std::vector<detail::RedisCommand> commands;
      for (const std::size_t i : indices) commands.push_back({command, names[i]});
      detail::RedisExchange ex = node->exchange(commands);
      if (options_.cluster && ex.new_failure) router_.refresh_after_failure(epoch);
      for (std::size_t j = 0; j < indices.size(); ++j) {
        const std::size_t i = indices[j];
        if (!ex.error.empty()) {
          miss(op, names[i], node->name(), ex.error);
        } else if (const redisReply& r = *ex.replies[j]; r.type == REDIS_REPLY_ERROR && is_redirect(r)) {
          detail::RedisRouted routed = router_.run(names[i], std::vector<detail::RedisCommand>{{command, names[i]}});
          if (routed.error.empty()) {
            answer(i, routed.node, *routed.replies.front());
          } else {
            miss(op, names[i], routed.node, routed.error);
          }
        } else {
          answer(i, node->name(), r);
        }
      }
    }
  }

  // Whether an EXISTS reply says the key exists; any other reply is a miss (counted).
  [[nodiscard]] bool exists_of(std::string_view name, std::string_view node, const redisReply& r) const {
    if (r.type == REDIS_REPLY_INTEGER) return r.integer > 0;
    miss("contains", name, node, reply_problem(r));
    return false;
  }

  // The block a GET reply holds, or nullopt: absent (nil), rejected, or an error reply (counted).
  [[nodiscard]] std::optional<KVBlock> block_of(const KVKey& key, const std::string& name, const std::string& node,
                                                const redisReply& r) const {
    if (r.type == REDIS_REPLY_NIL) return std::nullopt;
    if (is_wrong_type(r)) return reject(name, node, reply_problem(r));
    if (r.type != REDIS_REPLY_STRING) return miss("get", name, node, reply_problem(r));
    KVBlock block;
    if (std::string why = parse_kv_entry(detail::redis_bytes(r), key, block); !why.empty()) {
      return reject(name, node, why);
    }
    return block;
  }

  [[nodiscard]] static bool is_wrong_type(const redisReply& r) {
    return r.type == REDIS_REPLY_ERROR && detail::redis_text(r).starts_with("WRONGTYPE");
  }

  [[nodiscard]] static bool is_redirect(const redisReply& r) {
    const std::string_view text = detail::redis_text(r);
    return text.starts_with("MOVED ") || text.starts_with("ASK ");
  }

  // What is wrong with a reply the caller did not expect: the server's error message, or its type.
  [[nodiscard]] static std::string reply_problem(const redisReply& r) {
    if (r.type == REDIS_REPLY_ERROR) return fmt::format("error reply: {}", detail::redis_text(r));
    if (r.type == REDIS_REPLY_STATUS) return fmt::format("unexpected status reply: {}", detail::redis_text(r));
    return fmt::format("unexpected reply of type {}", r.type);
  }

  // Times a read and adds it to the statistics with the payload bytes it returned (get_into: `range` bytes when it
  // returns true).
  template <class Read>
  std::invoke_result_t<Read&> timed(Read&& read, std::size_t range = 0) {
    const auto t0 = std::chrono::steady_clock::now();
    auto result = read();
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    std::int64_t bytes = 0;
    if constexpr (std::is_same_v<decltype(result), std::optional<KVBlock>>) {
      if (result) bytes = static_cast<std::int64_t>(result->bytes.size());
    } else if constexpr (std::is_same_v<decltype(result), bool>) {
      if (result) bytes = static_cast<std::int64_t>(range);
    } else if constexpr (std::is_same_v<decltype(result), std::vector<std::optional<KVBlock>>>) {
      for (const auto& block : result) bytes += block ? static_cast<std::int64_t>(block->bytes.size()) : 0;
    }
    std::lock_guard lock(mutex_);
    stats_.add(bytes, seconds);
    return result;
  }

  // Counts a read that missed because `node` could not answer.
  std::nullopt_t miss(std::string_view op, std::string_view name, std::string_view node, std::string_view why) const {
    const std::string message = fmt::format("RedisKVStore: {} '{}' on {}: {}", op, name, node, why);
    std::lock_guard lock(mutex_);
    ++unavailable_;
    last_error_ = message;
    return std::nullopt;
  }

  // Records a failed put or erase; returns the message to throw.
  [[nodiscard]] std::string failure(std::string_view what) const {
    std::string message = fmt::format("RedisKVStore: {}", what);
    std::lock_guard lock(mutex_);
    last_error_ = message;
    return message;
  }

  // Counts a rejected value (left in place: see the header comment).
  std::nullopt_t reject(std::string_view name, std::string_view node, std::string_view why) const {
    const std::string message = fmt::format("RedisKVStore: rejected '{}' on {}: {}; left in place", name, node, why);
    std::lock_guard lock(mutex_);
    ++rejected_;
    last_rejection_ = message;
    return std::nullopt;
  }
  // The same for a read that answers a bool (get_into): false.
  bool rejected(std::string_view name, std::string_view node, std::string_view why) const {
    reject(name, node, why);
    return false;
  }

  RedisOptions options_;
  mutable detail::RedisRouter router_;  // connections and the slot map change on reads too
  mutable std::mutex mutex_;             // guards the counters and statistics
  mutable std::int64_t rejected_ = 0;
  mutable std::string last_rejection_;
  mutable std::int64_t unavailable_ = 0;
  mutable std::string last_error_;
  ReadStats stats_;
};

static_assert(RangedKVStore<RedisKVStore>);

}  // namespace kvfuse
