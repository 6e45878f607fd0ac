#pragma once
// A minimal GGUF v3 writer (F32 tensors; uint32 / float32 / string / array metadata) for hand-made model
// files in the CPU-backend tests.
#include <cstddef>
#include <cstdint>
#include <set>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include <Eigen/Core>

#include "kvfuse/backend/cpu/llama_config.hpp"

namespace kvfuse_test {

class GGUFWriter {
 public:
  [[nodiscard]] bool has(const std::string& key) const { return keys_.contains(key); }
  void u32(const std::string& key, std::uint32_t v) { entry(key, 4, &v, 4); }
  void f32(const std::string& key, float v) { entry(key, 6, &v, 4); }
  // An array of uint32, int32, float32 or bool.
  template <class T>
  void array(const std::string& key, const std::vector<T>& values) {
    string(meta_, key);
    put(meta_, std::uint32_t{9});
    if constexpr (std::is_same_v<T, bool>) {
      put(meta_, std::uint32_t{7});
      put(meta_, static_cast<std::uint64_t>(values.size()));
      for (const bool v : values) put(meta_, static_cast<std::uint8_t>(v ? 1 : 0));
    } else {
      static_assert(std::is_same_v<T, std::uint32_t> || std::is_same_v<T, std::int32_t> || std::is_same_v<T, float>);
      put(meta_, std::uint32_t{std::is_same_v<T, std::uint32_t> ? 4u : std::is_same_v<T, std::int32_t> ? 5u : 6u});
      put(meta_, static_cast<std::uint64_t>(values.size()));
      for (const T v : values) put(meta_, v);
    }
    added(key);
  }
  void str(const std::string& key, const std::string& v) {
    string(meta_, key);
    put(meta_, std::uint32_t{8});
    string(meta_, v);
    added(key);
  }
  // dims in ggml order (ne0 first); values in ggml order (ne0 fastest).
  void tensor(const std::string& name, std::vector<std::int64_t> dims, const float* values) {
    std::int64_t n = 1;
    for (std::int64_t d : dims) n *= d;
    tensors_.push_back({name, std::move(dims), std::vector<float>(values, values + n)});
  }
  void matrix(const std::string& name, const kvfuse::RowMatrix& m) { tensor(name, {m.cols(), m.rows()}, m.data()); }
  void vector(const std::string& name, const Eigen::VectorXf& v) { tensor(name, {v.size()}, v.data()); }

  [[nodiscard]] std::vector<std::byte> bytes() const {
    std::vector<std::byte> out;
    out.insert(out.end(), {std::byte{'G'}, std::byte{'G'}, std::byte{'U'}, std::byte{'F'}});
    put(out, std::uint32_t{3});
    put(out, static_cast<std::uint64_t>(tensors_.size()));
    put(out, kv_);
    out.insert(out.end(), meta_.begin(), meta_.end());
    std::uint64_t offset = 0;
    for (const Tensor& t : tensors_) {
      string(out, t.name);
      put(out, static_cast<std::uint32_t>(t.dims.size()));
      for (std::int64_t d : t.dims) put(out, static_cast<std::uint64_t>(d));
      put(out, std::uint32_t{0});  // F32
      put(out, offset);
      offset += (t.values.size() * 4 + 31) / 32 * 32;
    }
    out.resize((out.size() + 31) / 32 * 32);
    for (const Tensor& t : tensors_) {
      const auto* p = reinterpret_cast<const std::byte*>(t.values.data());
      out.insert(out.end(), p, p + t.values.size() * 4);
      out.resize((out.size() + 31) / 32 * 32);
    }
    return out;
  }

 private:
  struct Tensor {
    std::string name;
    std::vector<std::int64_t> dims;
    std::vector<float> values;
  };
  template <class T>
  static void put(std::vector<std::byte>& out, T v) {
    const auto* p = reinterpret_cast<const std::byte*>(&v);
    out.insert(out.end(), p, p + sizeof v);
  }
  static void string(std::vector<std::byte>& out, const std::string& s) {
    put(out, static_cast<std::uint64_t>(s.size()));
    const auto* p = reinterpret_cast<const std::byte*>(s.data());
    out.insert(out.end(), p, p + s.size());
  }
  void entry(const std::string& key, std::uint32_t type, const void* v, std::size_t size) {
    string(meta_, key);
    put(meta_, type);
    const auto* p = static_cast<const std::byte*>(v);
    meta_.insert(meta_.end(), p, p + size);
    added(key);
  }
  void added(const std::string& key) {
    keys_.insert(key);
    ++kv_;
  }
  std::vector<std::byte> meta_;
  std::set<std::string> keys_;
  std::uint64_t kv_ = 0;
  std::vector<Tensor> tensors_;
};

}  // namespace kvfuse_test
