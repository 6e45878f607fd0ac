#pragma once
// Whether the client of a request still holds its end of the TCP connection, for a handler that writes nothing
// until its answer is whole (a chat completion that is not streamed). cpp-httplib 0.11 (Debian 12's) gives such a
// handler no way to see the socket; the kernel's table of TCP sockets does (Linux: /proc/net/tcp and tcp6, one line
// per socket: local and remote address:port in hex, then the state). A client that closed its end (a timeout, a
// process that exited) leaves the server's socket in CLOSE_WAIT; one that reset it removes the socket from the
// table. PeerWatch reads the table for one connection, identified by the request's local and remote address and
// port, and says it is gone when it sees a closing state, or no longer sees a socket it saw before.
#include <arpa/inet.h>
#include <sys/socket.h>

#include <array>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <optional>
#include <string>
#include <string_view>
#include <utility>

#include <fmt/format.h>

namespace kvfuse_server {

enum class PeerState { open, closing, absent };

namespace detail {

// An address as /proc/net/tcp{,6} prints it: each 32-bit word of the network-order address read in host order
// (little-endian here), as 8 upper-case hex digits; then ':' and the port as 4 hex digits.
[[nodiscard]] inline std::optional<std::string> proc_net_endpoint(const std::string& addr, int port, bool& v6) {
  std::array<unsigned char, 16> bytes{};
  std::size_t n = 0;
  if (inet_pton(AF_INET, addr.c_str(), bytes.data()) == 1) {
    n = 4;
    v6 = false;
  } else if (inet_pton(AF_INET6, addr.c_str(), bytes.data()) == 1) {
    n = 16;
    v6 = true;
  } else {
    return std::nullopt;
  }
  std::string out;
  for (std::size_t w = 0; w < n; w += 4) {
    const std::uint32_t word = static_cast<std::uint32_t>(bytes[w]) | static_cast<std::uint32_t>(bytes[w + 1]) << 8 |
                               static_cast<std::uint32_t>(bytes[w + 2]) << 16 |
                               static_cast<std::uint32_t>(bytes[w + 3]) << 24;
    out += fmt::format("{:08X}", word);
  }
  return out + fmt::format(":{:04X}", static_cast<unsigned>(port));
}

}  // namespace detail

// The state of the socket with these endpoints in the kernel's table: open (established, or any state before a
// close), closing (the peer closed its end: CLOSE_WAIT, LAST_ACK, CLOSING, CLOSE) or absent (not in the table, or
// the table cannot be read: not Linux, an address that is not IPv4 or IPv6).
[[nodiscard]] inline PeerState peer_state(const std::string& local_addr, int local_port, const std::string& remote_addr,
                                          int remote_port) {
  bool v6_local = false, v6_remote = false;
  const std::optional<std::string> local = detail::proc_net_endpoint(local_addr, local_port, v6_local);
  const std::optional<std::string> remote = detail::proc_net_endpoint(remote_addr, remote_port, v6_remote);
  if (!local || !remote || v6_local != v6_remote) return PeerState::absent;
  std::ifstream table(v6_local ? "/proc/net/tcp6" : "/proc/net/tcp");
  std::string line;
  std::getline(table, line);  // the header
  while (std::getline(table, line)) {
    // "  sl: LOCAL REMOTE ST ..."
    char sl[32], l[64], r[64], st[8];
    if (std::sscanf(line.c_str(), "%31s %63s %63s %7s", sl, l, r, st) != 4) continue;
    if (*local != l || *remote != r) continue;
    const std::string_view s(st);
    return s == "08" || s == "09" || s == "0B" || s == "07" ? PeerState::closing : PeerState::open;
  }
  return PeerState::absent;
}

// One request's connection, asked as the handler waits: gone once the peer closed its end, or once a socket seen
// open has left the table (a reset). A connection never seen (a table this system does not have) is never gone.
class PeerWatch {
 public:
  PeerWatch(std::string local_addr, int local_port, std::string remote_addr, int remote_port)
      : local_addr_(std::move(local_addr)),
        remote_addr_(std::move(remote_addr)),
        local_port_(local_port),
        remote_port_(remote_port) {}

  [[nodiscard]] bool gone() {
    switch (peer_state(local_addr_, local_port_, remote_addr_, remote_port_)) {
      case PeerState::open: seen_ = true; return false;
      case PeerState::closing: return true;
      case PeerState::absent: return seen_;
    }
    return false;
  }

 private:
  std::string local_addr_, remote_addr_;
  int local_port_, remote_port_;
  bool seen_ = false;
};

}  // namespace kvfuse_server
