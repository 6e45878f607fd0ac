#pragma once
// Whether the client of a request still holds its connection, for a handler that waits without writing (a
// non-streamed completion). cpp-httplib 0.11.4, the Debian 12 package, gives a handler neither the socket nor
// Request::is_connection_closed (later versions have it), so the connection's socket is found among this process's
// descriptors by its two addresses (the Request's local and remote port and address) and peeked without blocking:
// an orderly close reads as 0 bytes, a reset as an error. Linux only (/proc/self/fd), as the server is.

#include <arpa/inet.h>
#include <dirent.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <cerrno>
#include <cstdlib>
#include <string>

#include <httplib.h>

namespace kvfuse_server {

namespace detail {

// The address and port of a socket address, as cpp-httplib writes them into a Request.
inline bool address_of(const sockaddr_storage& a, std::string& host, int& port) {
  char text[INET6_ADDRSTRLEN] = {};
  if (a.ss_family == AF_INET) {
    const auto& in = reinterpret_cast<const sockaddr_in&>(a);
    port = ntohs(in.sin_port);
    host = inet_ntop(AF_INET, &in.sin_addr, text, sizeof text) != nullptr ? text : "";
    return true;
  }
  if (a.ss_family == AF_INET6) {
    const auto& in6 = reinterpret_cast<const sockaddr_in6&>(a);
    port = ntohs(in6.sin6_port);
    host = inet_ntop(AF_INET6, &in6.sin6_addr, text, sizeof text) != nullptr ? text : "";
    return true;
  }
  return false;
}

// Whether socket fd connects the request's local and remote endpoints.
inline bool is_connection_of(int fd, const httplib::Request& req) {
  sockaddr_storage local{}, peer{};
  socklen_t local_len = sizeof local, peer_len = sizeof peer;
  if (getsockname(fd, reinterpret_cast<sockaddr*>(&local), &local_len) != 0 ||
      getpeername(fd, reinterpret_cast<sockaddr*>(&peer), &peer_len) != 0)
    return false;
  std::string local_host, peer_host;
  int local_port = -1, peer_port = -1;
  return address_of(local, local_host, local_port) && address_of(peer, peer_host, peer_port) &&
         local_port == req.local_port && peer_port == req.remote_port && local_host == req.local_addr &&
         peer_host == req.remote_addr;
}

}  // namespace detail

// True when the request's connection is found closed by its client; false while it is open (or not found).
inline bool client_gone(const httplib::Request& req) {
  DIR* dir = opendir("/proc/self/fd");
  if (dir == nullptr) return false;
  bool gone = false;
  while (const dirent* e = readdir(dir)) {
    char* end = nullptr;
    const long fd = std::strtol(e->d_name, &end, 10);
    if (end == e->d_name || *end != '\0' || fd == dirfd(dir) || !detail::is_connection_of(static_cast<int>(fd), req))
      continue;
    char byte = 0;
    const ssize_t n = recv(static_cast<int>(fd), &byte, 1, MSG_PEEK | MSG_DONTWAIT);
    gone = n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR);
    break;
  }
  closedir(dir);
  return gone;
}

}  // namespace kvfuse_server
