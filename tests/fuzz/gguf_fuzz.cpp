// libFuzzer target for the GGUF reader (include/kvfuse/model/gguf.hpp): parses the input through the span
// API, reads every metadata entry through the typed getters and dequantizes every tensor. kvfuse::error is
// the expected outcome for malformed input; anything else (a crash, a sanitizer report, another exception,
// a leak, an allocation beyond -rss_limit_mb) is a bug. How to build and run it: tests/fuzz/README.md.
#include <cstddef>
#include <cstdint>
#include <span>

#include "kvfuse/model/gguf.hpp"

namespace {

template <class F>
void expect_error_or_value(F&& read) {
  try {
    (void)read();
  } catch (const kvfuse::error&) {
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  try {
    const kvfuse::GGUFFile file = kvfuse::GGUFFile::parse(std::as_bytes(std::span(data, size)));
    for (const kvfuse::GGUFKeyValue& kv : file.metadata()) {
      (void)kvfuse::gguf_type_name(kv.value);
      expect_error_or_value([&] { return file.get_u32(kv.key); });
      expect_error_or_value([&] { return file.get_i64(kv.key); });
      expect_error_or_value([&] { return file.get_f32(kv.key); });
      expect_error_or_value([&] { return file.get_string(kv.key); });
      expect_error_or_value([&] { return file.get_string_array(kv.key).size(); });
      expect_error_or_value([&] { return file.get_i32_array(kv.key).size(); });
    }
    for (const kvfuse::GGUFTensorInfo& info : file.tensors()) {
      (void)file.raw(info);
      expect_error_or_value([&] { return file.dequantize(info); });  // error: an unsupported tensor type
    }
  } catch (const kvfuse::error&) {
  }
  return 0;
}
