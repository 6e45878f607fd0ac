#pragma once
// Real redis-server processes for the Redis store tests (tests/store/redis_*.cpp).
//
// RedisServer starts `redis-server` on a free loopback port with no persistence (--save "" --appendonly no) and its
// own temp directory, waits until it answers PING, and stops it (SIGTERM, then SIGKILL) when destroyed. kill()
// (SIGKILL), pause() (SIGSTOP), resume() (SIGCONT) and restart() (same port, empty data set) let tests break it.
// RedisCluster makes three such servers cluster masters with `redis-cli --cluster create` and waits for
// cluster_state:ok. RedisClient is a plain hiredis connection for the tests' own commands (raw SET of foreign or
// damaged values, CLUSTER SETSLOT, MIGRATE, DBSIZE ...). Output of the servers and of redis-cli goes to log files
// in the temp directories; a server that does not come up fails the test with its log.
//
// Tests that need a server start with `if (!redis_available()) { skip(...); return; }` (exit 77: Skipped).
// At the end: blocks of random bytes and the exact value RedisKVStore stores for them.
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <hiredis/hiredis.h>

#include <array>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <random>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <memory>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include <doctest/doctest.h>
#include <fmt/format.h>

#include "kvfuse/backend/redis_kv_store.hpp"
#include "support/test_util.hpp"

extern char** environ;

namespace kvfuse_test {

// Whether `program` is an executable file in a directory of $PATH.
inline bool on_path(std::string_view program) {
  const char* path = std::getenv("PATH");
  std::string_view dirs = path != nullptr ? path : "";
  while (!dirs.empty()) {
    const std::size_t colon = dirs.find(':');
    const std::filesystem::path candidate = std::filesystem::path(dirs.substr(0, colon)) / program;
    if (::access(candidate.c_str(), X_OK) == 0) return true;
    if (colon == std::string_view::npos) break;
    dirs.remove_prefix(colon + 1);
  }
  return false;
}

// Whether the Redis tests can run: redis-server and redis-cli on PATH.
inline bool redis_available() { return on_path("redis-server") && on_path("redis-cli"); }

// Whether TCP `port` on 127.0.0.1 can be bound now (0: any port, returned through `port`).
inline bool bind_loopback(int& port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  REQUIRE(fd >= 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = htons(static_cast<std::uint16_t>(port));
  socklen_t len = sizeof addr;
  const bool ok = ::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0 &&
                  ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0;
  if (ok) port = ntohs(addr.sin_port);
  ::close(fd);
  return ok;
}

// A free loopback port; with `cluster_bus`, port + 10000 is free too (Redis Cluster's bus port).
inline int free_loopback_port(bool cluster_bus) {
  for (int attempt = 0; attempt < 200; ++attempt) {
    int port = 0;
    if (!bind_loopback(port)) continue;
    int bus = port + 10000;
    if (!cluster_bus || (bus < 65536 && bind_loopback(bus))) return port;
  }
  FAIL("no free loopback port");
  return 0;
}

// Starts `argv` with stdin from /dev/null and stdout and stderr appended to `log`; returns its pid.
inline pid_t spawn(const std::vector<std::string>& argv, const std::filesystem::path& log) {
  std::vector<char*> args;
  for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, 0, "/dev/null", O_RDONLY, 0);
  posix_spawn_file_actions_addopen(&actions, 1, log.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
  posix_spawn_file_actions_adddup2(&actions, 1, 2);
  pid_t pid = -1;
  const int rc = posix_spawnp(&pid, args[0], &actions, nullptr, args.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  REQUIRE_MESSAGE(rc == 0, "cannot start " << argv[0] << ": " << std::strerror(rc));
  return pid;
}

inline std::string read_text(const std::filesystem::path& file) {
  std::ifstream in(file, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

// A plain hiredis connection to 127.0.0.1:port for the tests' own commands.
class RedisClient {
 public:
  explicit RedisClient(int port) : context_(redisConnectWithTimeout("127.0.0.1", port, timeval{2, 0})) {
    REQUIRE(context_ != nullptr);
    REQUIRE_MESSAGE(context_->err == 0, "cannot connect to 127.0.0.1:" << port << ": " << context_->errstr);
    REQUIRE(redisSetTimeout(context_.get(), timeval{5, 0}) == REDIS_OK);
  }

  // The reply to `args` (binary-safe); fails the test when none arrives.
  kvfuse::detail::RedisReplyPtr command(const std::vector<std::string>& args) {
    std::vector<const char*> argv;
    std::vector<std::size_t> lengths;
    for (const std::string& a : args) {
      argv.push_back(a.data());
      lengths.push_back(a.size());
    }
    kvfuse::detail::RedisReplyPtr reply(static_cast<redisReply*>(
        redisCommandArgv(context_.get(), static_cast<int>(argv.size()), argv.data(), lengths.data())));
    REQUIRE_MESSAGE(reply != nullptr, "no reply to " << args.front() << ": " << context_->errstr);
    return reply;
  }

  // The reply as text: a string, status or error as is, an integer in decimal, nil as "(nil)".
  std::string text(const std::vector<std::string>& args) {
    const kvfuse::detail::RedisReplyPtr r = command(args);
    if (r->type == REDIS_REPLY_INTEGER) return std::to_string(r->integer);
    if (r->type == REDIS_REPLY_NIL) return "(nil)";
    return std::string(r->str != nullptr ? std::string_view(r->str, r->len) : std::string_view());
  }

  // The reply's integer; fails the test when it is not one.
  long long integer(const std::vector<std::string>& args) {
    const kvfuse::detail::RedisReplyPtr r = command(args);
    REQUIRE_MESSAGE(r->type == REDIS_REPLY_INTEGER,
                    args.front() << ": not an integer reply: " << (r->str != nullptr ? r->str : "(no text)"));
    return r->integer;
  }

  // Sends `args` and requires the reply +OK.
  void ok(const std::vector<std::string>& args) {
    const std::string reply = text(args);
    REQUIRE_MESSAGE(reply == "OK", args.front() << " replied: " << reply);
  }

 private:
  kvfuse::detail::RedisContextPtr context_;
};

class RedisServer {
 public:
  // A server on a free port; `extra_args` are appended to the command line (e.g. {"--maxmemory", "2mb"}).
  explicit RedisServer(std::vector<std::string> extra_args = {}, bool cluster_bus = false)
      : extra_args_(std::move(extra_args)) {
    std::filesystem::create_directories(dir_.path);
    for (int attempt = 0;; ++attempt) {
      port_ = free_loopback_port(cluster_bus);
      if (start() || attempt == 2) break;  // another process may have taken the port meanwhile
    }
    REQUIRE_MESSAGE(pid_ > 0, "redis-server did not start; log:\n" << log());
  }
  RedisServer(const RedisServer&) = delete;
  RedisServer& operator=(const RedisServer&) = delete;
  ~RedisServer() { stop(); }

  [[nodiscard]] int port() const noexcept { return port_; }
  [[nodiscard]] std::string address() const { return fmt::format("127.0.0.1:{}", port_); }
  [[nodiscard]] std::string uri() const { return fmt::format("redis://127.0.0.1:{}", port_); }
  [[nodiscard]] const std::filesystem::path& directory() const noexcept { return dir_.path; }
  [[nodiscard]] std::string log() const { return read_text(dir_.path / "redis.log"); }
  [[nodiscard]] RedisClient client() const { return RedisClient(port_); }

  // SIGKILL, and waits for the process to end.
  void kill() {
    if (pid_ <= 0) return;
    ::kill(pid_, SIGKILL);
    ::waitpid(pid_, nullptr, 0);
    pid_ = -1;
  }
  void pause() { ::kill(pid_, SIGSTOP); }
  void resume() { ::kill(pid_, SIGCONT); }

  // Kills the server (if running) and starts a new one on the same port, with an empty data set.
  void restart() {
    kill();
    for (int attempt = 0; attempt < 50 && !start(); ++attempt) {
      std::this_thread::sleep_for(std::chrono::milliseconds(100));  // the port may still be held briefly
    }
    REQUIRE_MESSAGE(pid_ > 0, "redis-server did not restart on port " << port_ << "; log:\n" << log());
  }

 private:
  // Starts redis-server on port_ and waits until it answers PING (up to 10 s): whether it did.
  bool start() {
    std::vector<std::string> argv{"redis-server", "--port", std::to_string(port_), "--bind", "127.0.0.1",
                                  "--save", "", "--appendonly", "no", "--dir", dir_.path.string()};
    argv.insert(argv.end(), extra_args_.begin(), extra_args_.end());
    pid_ = spawn(argv, dir_.path / "redis.log");
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (std::chrono::steady_clock::now() < deadline) {
      if (::waitpid(pid_, nullptr, WNOHANG) == pid_) {  // exited: port taken, bad argument ...
        pid_ = -1;
        return false;
      }
      kvfuse::detail::RedisContextPtr c(redisConnectWithTimeout("127.0.0.1", port_, timeval{0, 200000}));
      if (c != nullptr && c->err == 0) {
        const kvfuse::detail::RedisReplyPtr pong(static_cast<redisReply*>(redisCommand(c.get(), "PING")));
        if (pong != nullptr && pong->type == REDIS_REPLY_STATUS && std::string_view(pong->str, pong->len) == "PONG") {
          return true;
        }
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    kill();
    return false;
  }

  void stop() {
    if (pid_ <= 0) return;
    ::kill(pid_, SIGCONT);
    ::kill(pid_, SIGTERM);
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(3);
    while (std::chrono::steady_clock::now() < deadline) {
      if (::waitpid(pid_, nullptr, WNOHANG) == pid_) {
        pid_ = -1;
        return;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    kill();
  }

  TempDir dir_;
  std::vector<std::string> extra_args_;
  int port_ = 0;
  pid_t pid_ = -1;
};

// Three Redis Cluster masters, no replicas, slots split by redis-cli (0-5460, 5461-10922, 10923-16383 in node
// order). cluster-require-full-coverage is off, so the others keep serving while one is down.
class RedisCluster {
 public:
  RedisCluster() {
    const std::vector<std::string> args{"--cluster-enabled",      "yes", "--cluster-config-file", "nodes.conf",
                                        "--cluster-node-timeout", "2000", "--cluster-require-full-coverage", "no"};
    for (auto& node : nodes_) node = std::make_unique<RedisServer>(args, /*cluster_bus=*/true);
    std::filesystem::create_directories(dir_.path);
    std::vector<std::string> argv{"redis-cli", "--cluster", "create"};
    for (const auto& node : nodes_) argv.push_back(node->address());
    argv.insert(argv.end(), {"--cluster-replicas", "0", "--cluster-yes"});
    const pid_t pid = spawn(argv, dir_.path / "redis-cli.log");
    int status = 0;
    ::waitpid(pid, &status, 0);
    REQUIRE_MESSAGE((WIFEXITED(status) && WEXITSTATUS(status) == 0),
                    "redis-cli --cluster create failed:\n" << read_text(dir_.path / "redis-cli.log"));
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
    for (std::size_t i = 0; i < nodes_.size(); ++i) {
      RedisClient c = nodes_[i]->client();
      while (c.text({"CLUSTER", "INFO"}).find("cluster_state:ok") == std::string::npos) {
        REQUIRE_MESSAGE(std::chrono::steady_clock::now() < deadline, "node " << i << " never reached cluster_state:ok");
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
      }
      ids_[i] = c.text({"CLUSTER", "MYID"});
    }
  }

  [[nodiscard]] static constexpr std::size_t size() noexcept { return 3; }
  [[nodiscard]] RedisServer& node(std::size_t i) { return *nodes_[i]; }
  [[nodiscard]] const std::string& id(std::size_t i) const { return ids_[i]; }
  // "redis-cluster://" with every node as a seed.
  [[nodiscard]] std::string uri() const {
    return fmt::format("redis-cluster://{},{},{}", nodes_[0]->address(), nodes_[1]->address(), nodes_[2]->address());
  }
  // The index of the node that serves `slot`, as node 0 sees the cluster.
  [[nodiscard]] std::size_t owner(std::size_t slot) {
    const kvfuse::detail::RedisReplyPtr r = nodes_[0]->client().command({"CLUSTER", "SLOTS"});
    REQUIRE(r->type == REDIS_REPLY_ARRAY);
    for (std::size_t i = 0; i < r->elements; ++i) {
      const redisReply& range = *r->element[i];
      if (static_cast<long long>(slot) < range.element[0]->integer ||
          static_cast<long long>(slot) > range.element[1]->integer) {
        continue;
      }
      const long long port = range.element[2]->element[1]->integer;
      for (std::size_t n = 0; n < size(); ++n) {
        if (nodes_[n]->port() == port) return n;
      }
    }
    FAIL("slot " << slot << " has no owner");
    return 0;
  }

 private:
  std::array<std::unique_ptr<RedisServer>, 3> nodes_;
  std::array<std::string, 3> ids_;
  TempDir dir_;
};

// A block of `bytes` random bytes (seeded), `tokens` tokens from `first_position`.
inline kvfuse::KVBlock random_block(std::uint64_t seed, std::size_t bytes, std::int64_t tokens = 16,
                                    std::int64_t first_position = 0) {
  std::mt19937_64 rng(seed);
  kvfuse::KVBlock block{tokens, std::vector<std::byte>(bytes), first_position};
  for (std::byte& b : block.bytes) b = static_cast<std::byte>(rng());
  return block;
}

// The Redis value of `block` under `key`: the entry prefix, then the payload.
inline std::string entry_value(const kvfuse::KVKey& key, const kvfuse::KVBlock& block) {
  const std::vector<std::byte> prefix = kvfuse::kv_entry_prefix(key, block);
  std::string value(reinterpret_cast<const char*>(prefix.data()), prefix.size());
  value.append(reinterpret_cast<const char*>(block.bytes.data()), block.bytes.size());
  return value;
}

// Whether `got` holds exactly `want` (tokens, position, every byte).
inline bool same_block(const std::optional<kvfuse::KVBlock>& got, const kvfuse::KVBlock& want) {
  return got && got->num_tokens == want.num_tokens && got->first_position == want.first_position &&
         got->bytes == want.bytes;
}

// Payload bytes [offset, offset + size) of `block`.
inline std::vector<std::byte> slice(const kvfuse::KVBlock& block, std::uint64_t offset, std::uint64_t size) {
  const auto begin = block.bytes.begin() + static_cast<std::ptrdiff_t>(offset);
  return {begin, begin + static_cast<std::ptrdiff_t>(size)};
}

}  // namespace kvfuse_test
