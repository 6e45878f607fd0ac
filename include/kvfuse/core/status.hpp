#pragma once
// kvfuse::Status — what every kernel launcher (kvfuse::cuda) and every CPU reference of a kernel
// (kvfuse::ref) returns. They never throw: engines call them from code that must not unwind through CUDA
// streams. Bad arguments and unsupported settings are refused before anything runs, with a status and a
// message naming the bad value, kept per thread until the next refusal:
//
//   if (auto s = kvfuse::cuda::rope_apply(args, stream); s != kvfuse::Status::success)
//     log("{}: {}", kvfuse::status_string(s), kvfuse::last_status_message());
//
// fmt-free (printf-style formatting): CUDA translation units include it.

#include <cstdarg>
#include <cstdio>

namespace kvfuse {

enum class Status : int {
  success = 0,
  invalid_argument,  // a size, stride, pointer or index is out of range
  unsupported,       // a valid but unsupported setting (dtype, head_dim, scaling, layout)
  cuda_error,        // the CUDA runtime reported an error at launch
  store_unavailable, // a store could not be reached or failed to answer (a server down, a disk gone)
  corrupt_entry,     // a stored entry failed its checks (checksum, size, model, positions)
  beyond_context,    // a prompt or position beyond the model's context
  cancelled,         // the request was cancelled (a client went away)
};

[[nodiscard]] inline const char* status_string(Status s) noexcept {
  switch (s) {
    case Status::success: return "success";
    case Status::invalid_argument: return "invalid argument";
    case Status::unsupported: return "unsupported configuration";
    case Status::cuda_error: return "CUDA runtime error";
    case Status::store_unavailable: return "store unavailable";
    case Status::corrupt_entry: return "corrupt store entry";
    case Status::beyond_context: return "beyond the model's context";
    case Status::cancelled: return "cancelled";
  }
  return "unknown kvfuse::Status";
}

namespace detail {
inline char* status_message_buffer() noexcept {
  thread_local char buffer[512] = {};
  return buffer;
}
}  // namespace detail

// The message of the last refusal on this thread, e.g. "rope: head_dim 96 is not 64, 128 or 256";
// empty before the first one.
[[nodiscard]] inline const char* last_status_message() noexcept { return detail::status_message_buffer(); }

// Records a printf-style message for last_status_message() and returns `s`: `return refuse(Status::
// invalid_argument, "rope: head_dim %d is odd", d);`.
#if defined(__GNUC__)
__attribute__((format(printf, 2, 3)))
#endif
inline Status refuse(Status s, const char* format, ...) noexcept {
  std::va_list args;
  va_start(args, format);
  std::vsnprintf(detail::status_message_buffer(), 512, format, args);
  va_end(args);
  return s;
}

}  // namespace kvfuse
