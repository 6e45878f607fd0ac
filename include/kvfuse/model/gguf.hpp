#pragma once
// GGUFFile: a validating reader for GGUF v2 and v3 model files (the llama.cpp / ggml format), with fp32
// dequantization of every common ggml tensor type.
//
// When to use it: to load a model's hyper-parameters, tokenizer tables and weights into a kvfuse backend
// (the reference CPU backend, tests, tools). It reads the file through a read-only mmap and copies nothing
// but the metadata; `raw(info)` gives a tensor's bytes in place and `dequantize(info)` its values as fp32 in
// ggml element order (ne0 fastest: a 2-D weight with dims {ne0 = in_features, ne1 = out_features} comes out
// row-major as [ne1][ne0]).
//
// Format (ggml docs/gguf.md; all little-endian): "GGUF" magic, u32 version, u64 tensor count, u64 metadata
// count; metadata entries {string key, u32 value type, value}; tensor infos {string name, u32 n_dims,
// u64 dims[n_dims], u32 ggml type, u64 offset}; zero padding to `general.alignment` (u32, default 32); the
// data section, in which every tensor's offset is a multiple of the alignment. A string is a u64 length plus
// bytes; an array is a u32 element type, a u64 count and the elements (arrays may nest).
//
// Trust nothing: every count, length, offset and size is checked against the bytes that are actually there
// before it is used, so a truncated or corrupt file raises kvfuse::error naming what is wrong and where (key
// or tensor name, byte offset), never reads out of bounds, and never allocates more than a small multiple of
// the file size. Rejected: bad magic, versions other than 2 and 3 (and big-endian files), unknown value or
// tensor types, duplicate keys or tensor names, n_dims > 4, element counts overflowing int64, rows (ne0) that
// are not a whole number of blocks, misaligned or out-of-file tensor data, non-power-of-two alignment, bools
// other than 0/1, arrays nested deeper than gguf_max_array_depth. Checked again on use: raw() and
// dequantize() re-validate the GGUFTensorInfo they are given, so a hand-edited info cannot read outside the
// file either. (A file truncated by another process while mapped can still raise SIGBUS: mmap's contract.)
//
// The tensor types (GGMLType, ggml_type_traits) are in model/ggml_type.hpp, the block formats and
// dequantization math in model/ggml_quant.hpp (both KVFUSE_HOST_DEVICE, shared with CUDA kernels); this
// header adds the file handling and the checks.

#include <fcntl.h>
#include <fmt/format.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <map>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <variant>
#include <vector>

#include "kvfuse/core/config.hpp"
#include "kvfuse/core/error.hpp"
#include "kvfuse/model/ggml_quant.hpp"
#include "kvfuse/model/ggml_type.hpp"

namespace kvfuse {

// GGUF metadata value types (gguf.md `gguf_metadata_value_type`); the numbers are the file's.
enum class GGUFValueType : std::uint32_t {
  uint8 = 0,
  int8 = 1,
  uint16 = 2,
  int16 = 3,
  uint32 = 4,
  int32 = 5,
  float32 = 6,
  boolean = 7,
  string = 8,
  array = 9,
  uint64 = 10,
  int64 = 11,
  float64 = 12,
};

// Deepest array nesting accepted (an array of arrays is depth 2); deeper input is rejected, not recursed into.
inline constexpr int gguf_max_array_depth = 8;

// A metadata array: one vector of the element type; alternative i holds GGUFValueType i.
struct GGUFArray {
  std::variant<std::vector<std::uint8_t>, std::vector<std::int8_t>, std::vector<std::uint16_t>,
               std::vector<std::int16_t>, std::vector<std::uint32_t>, std::vector<std::int32_t>, std::vector<float>,
               std::vector<bool>, std::vector<std::string>, std::vector<GGUFArray>, std::vector<std::uint64_t>,
               std::vector<std::int64_t>, std::vector<double>>
      values;

  [[nodiscard]] GGUFValueType element_type() const noexcept { return static_cast<GGUFValueType>(values.index()); }
  [[nodiscard]] std::size_t size() const noexcept {
    return std::visit([](const auto& v) { return v.size(); }, values);
  }
};

// A metadata value; alternative i holds GGUFValueType i (so `value.index()` is the file's type number).
using GGUFValue = std::variant<std::uint8_t, std::int8_t, std::uint16_t, std::int16_t, std::uint32_t, std::int32_t,
                               float, bool, std::string, GGUFArray, std::uint64_t, std::int64_t, double>;

struct GGUFKeyValue {
  std::string key;
  GGUFValue value;
};

[[nodiscard]] inline GGUFValueType gguf_type(const GGUFValue& value) noexcept {
  return static_cast<GGUFValueType>(value.index());
}

// "uint32", "string", "array", ... ; "unknown" for a number outside the enum.
[[nodiscard]] inline std::string_view gguf_type_name(GGUFValueType type) noexcept {
  constexpr std::string_view names[] = {"uint8", "int8",   "uint16", "int16",  "uint32", "int32",  "float32",
                                        "bool",  "string", "array",  "uint64", "int64",  "float64"};
  const auto index = static_cast<std::uint32_t>(type);
  return index < std::size(names) ? names[index] : std::string_view("unknown");
}

// The full type of a value for messages: "uint32", "array of string", "array of array of int32".
[[nodiscard]] inline std::string gguf_type_name(const GGUFValue& value) {
  if (const auto* array = std::get_if<GGUFArray>(&value)) {
    std::string name = "array of ";
    const GGUFArray* inner = array;
    while (inner->element_type() == GGUFValueType::array) {
      const auto& nested = std::get<std::vector<GGUFArray>>(inner->values);
      if (nested.empty()) return name + "array";
      name += "array of ";
      inner = &nested.front();
    }
    return name + std::string(gguf_type_name(inner->element_type()));
  }
  return std::string(gguf_type_name(gguf_type(value)));
}

// ggml's name of a tensor type ("Q4_1"), or "type <n>" for a number that is no ggml type.
[[nodiscard]] inline std::string ggml_type_name(GGMLType type) {
  const GGMLTypeTraits traits = ggml_type_traits(type);
  return traits.name != nullptr ? std::string(traits.name) : fmt::format("type {}", static_cast<std::uint32_t>(type));
}

// One tensor of the file. dims are in ggml order (dims[0] = ne0, the fastest-varying, contiguous index);
// n_dims = dims.size() <= 4, and no dims means a scalar.
struct GGUFTensorInfo {
  std::string name;
  std::vector<std::int64_t> dims;
  GGMLType type = GGMLType::f32;
  std::uint64_t offset = 0;       // from the start of the data section, as stored in the file
  std::uint64_t file_offset = 0;  // from the start of the file
  std::uint64_t size = 0;         // bytes

  [[nodiscard]] std::int64_t n_elements() const noexcept {
    std::int64_t n = 1;
    for (const std::int64_t d : dims) n *= d;
    return n;
  }
  // Elements per row (ne0) and number of rows (ne1 * ne2 * ne3).
  [[nodiscard]] std::int64_t row_length() const noexcept { return dims.empty() ? 1 : dims[0]; }
  [[nodiscard]] std::int64_t n_rows() const noexcept {
    std::int64_t n = 1;
    for (std::size_t i = 1; i < dims.size(); ++i) n *= dims[i];
    return n;
  }
};

namespace detail {

// Bytes of a tensor of `type` with `dims`, or an error naming the tensor when the dims are negative, their
// product overflows int64, ne0 is not a whole number of blocks, or the type is not a ggml type.
inline std::uint64_t gguf_tensor_nbytes(std::string_view name, std::span<const std::int64_t> dims, GGMLType type) {
  const GGMLTypeTraits traits = ggml_type_traits(type);
  require(traits.name != nullptr, "GGUF: tensor '{}' has unknown ggml type {}", name, static_cast<std::uint32_t>(type));
  require(dims.size() <= 4, "GGUF: tensor '{}' has n_dims {} > 4", name, dims.size());
  // The product of the non-zero dims must fit, so that element and row counts never overflow, even of
  // tensors with a zero dim.
  std::int64_t nonzero = 1;
  bool empty = false;
  for (std::size_t i = 0; i < dims.size(); ++i) {
    require(dims[i] >= 0, "GGUF: tensor '{}' has a negative dim ne{} = {}", name, i, dims[i]);
    if (dims[i] == 0) {
      empty = true;
      continue;
    }
    require(nonzero <= INT64_MAX / dims[i],
            "GGUF: tensor '{}' element count overflows int64 at dim ne{} = {} ({} elements before it)", name, i,
            dims[i], nonzero);
    nonzero *= dims[i];
  }
  const std::int64_t elements = empty ? 0 : nonzero;
  const std::int64_t ne0 = dims.empty() ? 1 : dims[0];
  require(ne0 % traits.block_size == 0,
          "GGUF: tensor '{}' row length ne0 = {} is not a multiple of the {} block size {}", name, ne0, traits.name,
          traits.block_size);
  const std::int64_t blocks = elements / traits.block_size;
  require(blocks <= INT64_MAX / traits.type_size, "GGUF: tensor '{}' size ({} blocks of {} bytes) overflows int64",
          name, blocks, traits.type_size);
  return static_cast<std::uint64_t>(blocks * traits.type_size);
}

// Bounds-checked little-endian reads over the file's bytes. `what` is a string, or a callable returning one
// (built only when a check fails), naming the field for the error message.
class GGUFCursor {
 public:
  explicit GGUFCursor(std::span<const std::uint8_t> bytes) noexcept : bytes_(bytes) {}

  [[nodiscard]] std::uint64_t pos() const noexcept { return pos_; }
  [[nodiscard]] std::uint64_t remaining() const noexcept { return bytes_.size() - pos_; }

  template <class What>
  const std::uint8_t* take(std::uint64_t n, const What& what) {
    if (n > remaining()) {
      throw error(
          fmt::format("GGUF: truncated file: {} needs {} bytes at byte offset {}, but only {} of the "
                      "file's {} bytes remain",
                      describe(what), n, pos_, remaining(), bytes_.size()));
    }
    const std::uint8_t* p = bytes_.data() + pos_;
    pos_ += n;
    return p;
  }
  template <class What>
  std::uint32_t u32(const What& what) {
    return load_u32le(take(4, what));
  }
  template <class What>
  std::uint64_t u64(const What& what) {
    const std::uint8_t* p = take(8, what);
    return static_cast<std::uint64_t>(load_u32le(p)) | (static_cast<std::uint64_t>(load_u32le(p + 4)) << 32);
  }
  template <class What>
  std::string string(const What& what) {
    const std::uint64_t at = pos_;
    const std::uint64_t length = u64(what);
    if (length > remaining()) {
      throw error(
          fmt::format("GGUF: {}: string length {} at byte offset {} exceeds the {} bytes left in the file "
                      "(file size {})",
                      describe(what), length, at, remaining(), bytes_.size()));
    }
    const std::uint8_t* p = take(length, what);
    return std::string(reinterpret_cast<const char*>(p), static_cast<std::size_t>(length));
  }

  template <class What>
  static std::string describe(const What& what) {
    if constexpr (std::is_invocable_v<const What&>) {
      return what();
    } else {
      return std::string(what);
    }
  }

 private:
  std::span<const std::uint8_t> bytes_;
  std::uint64_t pos_ = 0;
};

// Fewest bytes one value of `type` occupies in the file (a string: its length; an array: type and count).
[[nodiscard]] inline std::uint64_t gguf_min_value_size(GGUFValueType type) noexcept {
  switch (type) {
    case GGUFValueType::uint8:
    case GGUFValueType::int8:
    case GGUFValueType::boolean: return 1;
    case GGUFValueType::uint16:
    case GGUFValueType::int16: return 2;
    case GGUFValueType::uint32:
    case GGUFValueType::int32:
    case GGUFValueType::float32: return 4;
    case GGUFValueType::string:
    case GGUFValueType::uint64:
    case GGUFValueType::int64:
    case GGUFValueType::float64: return 8;
    case GGUFValueType::array: return 12;
  }
  return 1;
}

template <class T>
T gguf_load_scalar(const std::uint8_t* p) {
  if constexpr (std::is_same_v<T, float>) {
    return bits_float(load_u32le(p));
  } else if constexpr (std::is_same_v<T, double>) {
    const std::uint64_t bits =
        static_cast<std::uint64_t>(load_u32le(p)) | (static_cast<std::uint64_t>(load_u32le(p + 4)) << 32);
    return std::bit_cast<double>(bits);
  } else {
    using U = std::make_unsigned_t<T>;
    U bits = 0;
    for (std::size_t i = 0; i < sizeof(T); ++i) bits = static_cast<U>(bits | (static_cast<U>(p[i]) << (8 * i)));
    return static_cast<T>(bits);
  }
}

class GGUFValueReader {
 public:
  GGUFValueReader(GGUFCursor& cursor, std::string_view key) noexcept : cursor_(cursor), key_(key) {}

  GGUFValue value(std::uint32_t raw_type);

 private:
  [[nodiscard]] std::string what() const { return fmt::format("value of metadata key '{}'", key_); }

  GGUFValueType checked_type(std::uint32_t raw, std::uint64_t at) const {
    require(raw <= static_cast<std::uint32_t>(GGUFValueType::float64),
            "GGUF: metadata key '{}' has unknown value type {} (at byte offset {}; known: 0..12)", key_, raw, at);
    return static_cast<GGUFValueType>(raw);
  }

  template <std::size_t I, class T>
  GGUFValue scalar() {
    return GGUFValue(std::in_place_index<I>, gguf_load_scalar<T>(cursor_.take(sizeof(T), [this] { return what(); })));
  }

  bool boolean();

  GGUFArray array(int depth);

  // `count` fixed-size numbers; the caller checked that count * sizeof(T) bytes remain.
  template <class T>
  std::vector<T> numbers(std::uint64_t count) {
    const std::uint8_t* p = cursor_.take(count * sizeof(T), [this] { return what(); });
    std::vector<T> out(static_cast<std::size_t>(count));
    for (std::size_t i = 0; i < out.size(); ++i) out[i] = gguf_load_scalar<T>(p + i * sizeof(T));
    return out;
  }

  GGUFCursor& cursor_;
  std::string_view key_;
};

// A read-only private mapping of a whole file, unmapped on destruction. Move-only.
class MappedFile {
 public:
  MappedFile() noexcept = default;
  explicit MappedFile(const std::filesystem::path& path) {
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    require(fd >= 0, "GGUF: cannot open '{}': {}", path.string(), std::strerror(errno));
    struct stat st {};
    if (::fstat(fd, &st) != 0) {
      const int err = errno;
      ::close(fd);
      throw error(fmt::format("GGUF: cannot stat '{}': {}", path.string(), std::strerror(err)));
    }
    if (!S_ISREG(st.st_mode)) {
      ::close(fd);
      throw error(fmt::format("GGUF: '{}' is not a regular file", path.string()));
    }
    size_ = static_cast<std::size_t>(st.st_size);
    if (size_ > 0) {
      void* addr = ::mmap(nullptr, size_, PROT_READ, MAP_PRIVATE, fd, 0);
      const int err = errno;
      ::close(fd);
      require(addr != MAP_FAILED, "GGUF: cannot mmap '{}' ({} bytes): {}", path.string(), size_, std::strerror(err));
      addr_ = addr;
    } else {
      ::close(fd);
    }
  }
  MappedFile(MappedFile&& other) noexcept
      : addr_(std::exchange(other.addr_, nullptr)), size_(std::exchange(other.size_, 0)) {}
  MappedFile& operator=(MappedFile&& other) noexcept {
    if (this != &other) {
      unmap();
      addr_ = std::exchange(other.addr_, nullptr);
      size_ = std::exchange(other.size_, 0);
    }
    return *this;
  }
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;
  ~MappedFile() { unmap(); }

  [[nodiscard]] std::span<const std::uint8_t> bytes() const noexcept {
    return {static_cast<const std::uint8_t*>(addr_), size_};
  }

  // Drops the mapped pages that hold `range` (all of them when empty; rounded out to whole pages) from this
  // process's memory (MADV_DONTNEED): the mapping stays valid and a later read faults them back in from the file,
  // unchanged (a read-only private mapping is never written). A range outside the mapping is ignored.
  void release_pages(std::span<const std::byte> range = {}) const noexcept;

 private:
  void unmap() noexcept {
    if (addr_ != nullptr) ::munmap(addr_, size_);
    addr_ = nullptr;
    size_ = 0;
  }

  void* addr_ = nullptr;
  std::size_t size_ = 0;
};

}  // namespace detail

class GGUFFile {
 public:
  // Maps `path` read-only and parses it; the mapping lives as long as the GGUFFile (moves keep it).
  [[nodiscard]] static GGUFFile open(const std::filesystem::path& path);

  // A reader that copied what it needs (LlamaWeights::from_gguf, tensor by tensor) gives the mapped pages of
  // `range` (empty: the whole file) back: the bytes stay readable (faulted in again on access), they just stop
  // counting in this process's resident memory. Nothing for a GGUFFile over caller-owned bytes (parse).
  void release_pages(std::span<const std::byte> range = {}) const noexcept { mapping_.release_pages(range); }

  // Parses bytes the caller owns (tests, fuzzing, embedded models); they must outlive the GGUFFile.
  [[nodiscard]] static GGUFFile parse(std::span<const std::byte> bytes) {
    GGUFFile file;
    file.parse_bytes({reinterpret_cast<const std::uint8_t*>(bytes.data()), bytes.size()});
    return file;
  }

  // A moved-from GGUFFile is empty (no bytes, metadata or tensors).
  GGUFFile(GGUFFile&& other) noexcept { *this = std::move(other); }
  GGUFFile& operator=(GGUFFile&& other) noexcept {
    if (this != &other) {
      mapping_ = std::move(other.mapping_);
      bytes_ = std::exchange(other.bytes_, {});
      version_ = other.version_;
      alignment_ = other.alignment_;
      data_offset_ = other.data_offset_;
      metadata_ = std::move(other.metadata_);
      key_index_ = std::move(other.key_index_);
      tensors_ = std::move(other.tensors_);
      tensor_index_ = std::move(other.tensor_index_);
      other.metadata_.clear();
      other.key_index_.clear();
      other.tensors_.clear();
      other.tensor_index_.clear();
    }
    return *this;
  }
  GGUFFile(const GGUFFile&) = delete;
  GGUFFile& operator=(const GGUFFile&) = delete;
  ~GGUFFile() = default;

  [[nodiscard]] std::uint32_t version() const noexcept { return version_; }
  [[nodiscard]] std::uint64_t alignment() const noexcept { return alignment_; }
  // Start of the data section (tensor offsets count from here), and the file size.
  [[nodiscard]] std::uint64_t data_offset() const noexcept { return data_offset_; }
  [[nodiscard]] std::uint64_t file_size() const noexcept { return bytes_.size(); }

  // ---------------------------------------------------------------- metadata
  // All entries in file order.
  [[nodiscard]] const std::vector<GGUFKeyValue>& metadata() const noexcept { return metadata_; }
  [[nodiscard]] bool contains(std::string_view key) const { return find(key) != nullptr; }
  // The value of `key`, or nullptr when absent.
  [[nodiscard]] const GGUFValue* find(std::string_view key) const {
    const auto it = key_index_.find(key);
    return it == key_index_.end() ? nullptr : &metadata_[it->second].value;
  }
  // The value of `key`; throws naming the key when absent.
  [[nodiscard]] const GGUFValue& value(std::string_view key) const {
    const GGUFValue* v = find(key);
    if (v == nullptr) throw error(fmt::format("GGUF: metadata key '{}' not found", key));
    return *v;
  }

  // Integer getters accept any integer type whose value fits the requested one; otherwise, and for
  // non-integers, they throw naming the key, its actual type and value. The overloads with a fallback
  // return it when the key is absent (a present key of the wrong type still throws).
  [[nodiscard]] std::uint32_t get_u32(std::string_view key) const { return integer<std::uint32_t>(key, "uint32"); }
  [[nodiscard]] std::int32_t get_i32(std::string_view key) const { return integer<std::int32_t>(key, "int32"); }
  [[nodiscard]] std::uint64_t get_u64(std::string_view key) const { return integer<std::uint64_t>(key, "uint64"); }
  [[nodiscard]] std::int64_t get_i64(std::string_view key) const { return integer<std::int64_t>(key, "int64"); }
  [[nodiscard]] std::uint32_t get_u32(std::string_view key, std::uint32_t fallback) const {
    return contains(key) ? get_u32(key) : fallback;
  }
  // float32, or float64 rounded to float.
  [[nodiscard]] float get_f32(std::string_view key) const;
  [[nodiscard]] float get_f32(std::string_view key, float fallback) const {
    return contains(key) ? get_f32(key) : fallback;
  }
  [[nodiscard]] bool get_bool(std::string_view key) const { return exactly<bool>(key, "bool"); }
  [[nodiscard]] bool get_bool(std::string_view key, bool fallback) const {
    return contains(key) ? get_bool(key) : fallback;
  }
  [[nodiscard]] const std::string& get_string(std::string_view key) const {
    return exactly<std::string>(key, "string");
  }
  [[nodiscard]] const GGUFArray& get_array(std::string_view key) const { return exactly<GGUFArray>(key, "array"); }
  [[nodiscard]] const std::vector<std::string>& get_string_array(std::string_view key) const {
    return array_of<std::string>(key, "array of string");
  }
  [[nodiscard]] std::span<const std::int32_t> get_i32_array(std::string_view key) const {
    return array_of<std::int32_t>(key, "array of int32");
  }
  [[nodiscard]] std::span<const std::uint32_t> get_u32_array(std::string_view key) const {
    return array_of<std::uint32_t>(key, "array of uint32");
  }
  [[nodiscard]] std::span<const float> get_f32_array(std::string_view key) const {
    return array_of<float>(key, "array of float32");
  }

  // ---------------------------------------------------------------- tensors
  // All tensors in file order.
  [[nodiscard]] const std::vector<GGUFTensorInfo>& tensors() const noexcept { return tensors_; }
  [[nodiscard]] const GGUFTensorInfo* find_tensor(std::string_view name) const {
    const auto it = tensor_index_.find(name);
    return it == tensor_index_.end() ? nullptr : &tensors_[it->second];
  }
  // Throws naming the tensor when absent.
  [[nodiscard]] const GGUFTensorInfo& tensor(std::string_view name) const;

  // The tensor's bytes inside the file (the mapping or the caller's buffer).
  [[nodiscard]] std::span<const std::byte> raw(const GGUFTensorInfo& info) const {
    check_info(info);
    return {reinterpret_cast<const std::byte*>(bytes_.data() + info.file_offset), static_cast<std::size_t>(info.size)};
  }

  // All elements as fp32, in ggml order (ne0 fastest). Throws naming the tensor and its type when the type
  // is not dequantizable.
  [[nodiscard]] std::vector<float> dequantize(const GGUFTensorInfo& info) const {
    check_info(info);  // before n_rows(): the dims of an unchecked info may overflow
    return dequantize_rows(info, 0, info.n_rows());
  }
  // Rows [first_row, first_row + n_rows) (a row = ne0 elements), e.g. the embeddings of a few tokens.
  [[nodiscard]] std::vector<float> dequantize_rows(const GGUFTensorInfo& info, std::int64_t first_row,
                                                   std::int64_t n_rows) const;
  // dequantize() into caller memory; out.size() must be info.n_elements().
  void dequantize_into(const GGUFTensorInfo& info, std::span<float> out) const {
    check_info(info);
    dequantize_rows_into(info, 0, info.n_rows(), out);
  }
  void dequantize_rows_into(const GGUFTensorInfo& info, std::int64_t first_row, std::int64_t n_rows,
                            std::span<float> out) const;

 private:
  GGUFFile() = default;

  static error wrong_type(std::string_view key, const GGUFValue& v, std::string_view expected) {
    return error(fmt::format("GGUF: metadata key '{}' has type {}, expected {}", key, gguf_type_name(v), expected));
  }

  template <class T>
  const T& exactly(std::string_view key, std::string_view expected) const {
    const GGUFValue& v = value(key);
    const T* p = std::get_if<T>(&v);
    if (p == nullptr) throw wrong_type(key, v, expected);
    return *p;
  }

  template <class T>
  const std::vector<T>& array_of(std::string_view key, std::string_view expected) const {
    const GGUFValue& v = value(key);
    if (const auto* array = std::get_if<GGUFArray>(&v)) {
      if (const auto* values = std::get_if<std::vector<T>>(&array->values)) return *values;
    }
    throw wrong_type(key, v, expected);
  }

  template <class T>
  T integer(std::string_view key, std::string_view expected) const {
    const GGUFValue& v = value(key);
    return std::visit(
        [&](const auto& x) -> T {
          using X = std::decay_t<decltype(x)>;
          if constexpr (std::is_integral_v<X> && !std::is_same_v<X, bool>) {
            if (!std::in_range<T>(x)) {
              throw error(fmt::format("GGUF: metadata key '{}' = {} ({}) does not fit in {}", key, x, gguf_type_name(v),
                                      expected));
            }
            return static_cast<T>(x);
          } else {
            throw wrong_type(key, v, fmt::format("an integer ({})", expected));
          }
        },
        v);
  }

  // The info must describe bytes inside this file, with the size its dims and type imply.
  void check_info(const GGUFTensorInfo& info) const;

  // The type must be dequantizable and the rows inside the (checked) tensor.
  static void check_dequantizable(const GGUFTensorInfo& info, std::int64_t first_row, std::int64_t n_rows);

  void dequantize_rows_unchecked(const GGUFTensorInfo& info, std::int64_t first_row, std::int64_t n_rows,
                                 float* out) const;

  void parse_bytes(std::span<const std::uint8_t> bytes);

  detail::MappedFile mapping_;
  std::span<const std::uint8_t> bytes_;
  std::uint32_t version_ = 0;
  std::uint64_t alignment_ = 32;
  std::uint64_t data_offset_ = 0;
  std::vector<GGUFKeyValue> metadata_;
  std::map<std::string, std::size_t, std::less<>> key_index_;
  std::vector<GGUFTensorInfo> tensors_;
  std::map<std::string, std::size_t, std::less<>> tensor_index_;
};

}  // namespace kvfuse

// The member functions' definitions (header-only unless KVFUSE_CPU_SEPARATE_COMPILATION: core/config.hpp).
#ifndef KVFUSE_CPU_SEPARATE_COMPILATION
#include "kvfuse/model/gguf_impl.hpp"
#endif
