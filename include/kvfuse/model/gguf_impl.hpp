#pragma once
// The out-of-class member functions of model/gguf.hpp (the classes and what each does are there). gguf.hpp
// includes this file at its end unless KVFUSE_CPU_SEPARATE_COMPILATION is defined (core/config.hpp).

#include "kvfuse/model/gguf.hpp"

namespace kvfuse {
namespace detail {

KVFUSE_CPU_INLINE GGUFValue GGUFValueReader::value(std::uint32_t raw_type) {
  const GGUFValueType type = checked_type(raw_type, cursor_.pos() - 4);
  switch (type) {
    case GGUFValueType::uint8: return scalar<0, std::uint8_t>();
    case GGUFValueType::int8: return scalar<1, std::int8_t>();
    case GGUFValueType::uint16: return scalar<2, std::uint16_t>();
    case GGUFValueType::int16: return scalar<3, std::int16_t>();
    case GGUFValueType::uint32: return scalar<4, std::uint32_t>();
    case GGUFValueType::int32: return scalar<5, std::int32_t>();
    case GGUFValueType::float32: return scalar<6, float>();
    case GGUFValueType::boolean: return GGUFValue(std::in_place_index<7>, boolean());
    case GGUFValueType::string: return GGUFValue(std::in_place_index<8>, cursor_.string(what()));
    case GGUFValueType::array: return GGUFValue(std::in_place_index<9>, array(1));
    case GGUFValueType::uint64: return scalar<10, std::uint64_t>();
    case GGUFValueType::int64: return scalar<11, std::int64_t>();
    case GGUFValueType::float64: return scalar<12, double>();
  }
  return {};  // unreachable: checked_type accepted only the enumerators above
}

KVFUSE_CPU_INLINE bool GGUFValueReader::boolean() {
  const std::uint64_t at = cursor_.pos();
  const std::uint8_t b = *cursor_.take(1, [this] { return what(); });
  require(b <= 1, "GGUF: metadata key '{}' has bool value {} at byte offset {} (must be 0 or 1)", key_, b, at);
  return b == 1;
}

KVFUSE_CPU_INLINE GGUFArray GGUFValueReader::array(int depth) {
  require(depth <= gguf_max_array_depth,
          "GGUF: metadata key '{}' nests arrays deeper than {} levels (at byte offset {})", key_,
          gguf_max_array_depth, cursor_.pos());
  const auto header_what = [this] { return fmt::format("array header of metadata key '{}'", key_); };
  const std::uint64_t type_at = cursor_.pos();
  const GGUFValueType type = checked_type(cursor_.u32(header_what), type_at);
  const std::uint64_t count_at = cursor_.pos();
  const std::uint64_t count = cursor_.u64(header_what);
  const std::uint64_t min_size = gguf_min_value_size(type);
  require(count <= cursor_.remaining() / min_size,
          "GGUF: metadata key '{}' claims an array of {} {} elements (count at byte offset {}), but the {} bytes "
          "left in the file hold at most {}",
          key_, count, gguf_type_name(type), count_at, cursor_.remaining(), cursor_.remaining() / min_size);
  GGUFArray result;
  switch (type) {
    case GGUFValueType::uint8: result.values.emplace<0>(numbers<std::uint8_t>(count)); break;
    case GGUFValueType::int8: result.values.emplace<1>(numbers<std::int8_t>(count)); break;
    case GGUFValueType::uint16: result.values.emplace<2>(numbers<std::uint16_t>(count)); break;
    case GGUFValueType::int16: result.values.emplace<3>(numbers<std::int16_t>(count)); break;
    case GGUFValueType::uint32: result.values.emplace<4>(numbers<std::uint32_t>(count)); break;
    case GGUFValueType::int32: result.values.emplace<5>(numbers<std::int32_t>(count)); break;
    case GGUFValueType::float32: result.values.emplace<6>(numbers<float>(count)); break;
    case GGUFValueType::boolean: {
      auto& out = result.values.emplace<7>();
      out.reserve(count);
      for (std::uint64_t i = 0; i < count; ++i) out.push_back(boolean());
      break;
    }
    case GGUFValueType::string: {
      auto& out = result.values.emplace<8>();
      out.reserve(count);
      for (std::uint64_t i = 0; i < count; ++i) {
        out.push_back(cursor_.string([this, i] { return fmt::format("element {} of metadata key '{}'", i, key_); }));
      }
      break;
    }
    case GGUFValueType::array: {
      auto& out = result.values.emplace<9>();
      out.reserve(count);
      for (std::uint64_t i = 0; i < count; ++i) out.push_back(array(depth + 1));
      break;
    }
    case GGUFValueType::uint64: result.values.emplace<10>(numbers<std::uint64_t>(count)); break;
    case GGUFValueType::int64: result.values.emplace<11>(numbers<std::int64_t>(count)); break;
    case GGUFValueType::float64: result.values.emplace<12>(numbers<double>(count)); break;
  }
  return result;
}

KVFUSE_CPU_INLINE void MappedFile::release_pages(std::span<const std::byte> range) const noexcept {
  if (addr_ == nullptr) return;
  const auto base = reinterpret_cast<std::uintptr_t>(addr_);
  std::uintptr_t lo = base, hi = base + size_;
  if (!range.empty()) {
    lo = reinterpret_cast<std::uintptr_t>(range.data());
    hi = lo + range.size();
    if (lo < base || hi > base + size_) return;
  }
  const auto page = static_cast<std::uintptr_t>(::sysconf(_SC_PAGESIZE));
  lo = std::max(base, lo / page * page);
  hi = std::min(base + size_, (hi + page - 1) / page * page);
  if (hi > lo) (void)::madvise(reinterpret_cast<void*>(lo), hi - lo, MADV_DONTNEED);
}

}  // namespace detail

KVFUSE_CPU_INLINE GGUFFile GGUFFile::open(const std::filesystem::path& path) {
  GGUFFile file;
  file.mapping_ = detail::MappedFile(path);
  try {
    file.parse_bytes(file.mapping_.bytes());
  } catch (const error& e) {
    throw error(fmt::format("{} (file '{}')", e.what(), path.string()));
  }
  return file;
}

KVFUSE_CPU_INLINE float GGUFFile::get_f32(std::string_view key) const {
  const GGUFValue& v = value(key);
  if (const auto* f = std::get_if<float>(&v)) return *f;
  if (const auto* d = std::get_if<double>(&v)) return static_cast<float>(*d);
  throw wrong_type(key, v, "float32");
}

KVFUSE_CPU_INLINE const GGUFTensorInfo& GGUFFile::tensor(std::string_view name) const {
  const GGUFTensorInfo* info = find_tensor(name);
  if (info == nullptr)
    throw error(fmt::format("GGUF: tensor '{}' not found ({} tensors in the file)", name, tensors_.size()));
  return *info;
}

KVFUSE_CPU_INLINE std::vector<float> GGUFFile::dequantize_rows(const GGUFTensorInfo& info, std::int64_t first_row,
    std::int64_t n_rows) const {
  check_info(info);
  check_dequantizable(info, first_row, n_rows);
  std::vector<float> out(static_cast<std::size_t>(n_rows * info.row_length()));
  dequantize_rows_unchecked(info, first_row, n_rows, out.data());
  return out;
}

KVFUSE_CPU_INLINE void GGUFFile::dequantize_rows_into(const GGUFTensorInfo& info, std::int64_t first_row,
                                                      std::int64_t n_rows, std::span<float> out) const {
  check_info(info);
  check_dequantizable(info, first_row, n_rows);
  const auto needed = static_cast<std::uint64_t>(n_rows * info.row_length());
  detail::require(out.size() == needed,
                  "GGUF: dequantizing {} rows of tensor '{}' needs an output of {} floats, got {}", n_rows, info.name,
                  needed, out.size());
  dequantize_rows_unchecked(info, first_row, n_rows, out.data());
}

KVFUSE_CPU_INLINE void GGUFFile::check_info(const GGUFTensorInfo& info) const {
  const std::uint64_t expected = detail::gguf_tensor_nbytes(info.name, info.dims, info.type);
  detail::require(info.size == expected, "GGUF: tensor info '{}' has size {}, but its dims and type {} make {} bytes",
                  info.name, info.size, ggml_type_name(info.type), expected);
  detail::require(info.file_offset <= bytes_.size() && info.size <= bytes_.size() - info.file_offset,
                  "GGUF: tensor '{}' data [{}, +{} bytes) exceeds the file size {}", info.name, info.file_offset,
                  info.size, bytes_.size());
}

KVFUSE_CPU_INLINE void GGUFFile::check_dequantizable(const GGUFTensorInfo& info, std::int64_t first_row,
                                                     std::int64_t n_rows) {
  const GGMLTypeTraits traits = ggml_type_traits(info.type);
  if (!traits.dequantizable) {
    throw error(
        fmt::format("GGUF: unsupported tensor type {} of '{}' (kvfuse dequantizes F32, F16, BF16, Q4_0, "
                    "Q4_1, Q5_0, Q5_1, Q8_0, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K)",
                    ggml_type_name(info.type), info.name));
  }
  const std::int64_t rows = info.n_rows();
  detail::require(first_row >= 0 && n_rows >= 0 && first_row <= rows && n_rows <= rows - first_row,
                  "GGUF: rows [{}, {}+{}) are outside tensor '{}' with {} rows", first_row, first_row, n_rows,
                  info.name, rows);
}

KVFUSE_CPU_INLINE void GGUFFile::dequantize_rows_unchecked(const GGUFTensorInfo& info, std::int64_t first_row,
                                                           std::int64_t n_rows, float* out) const {
  const GGMLTypeTraits traits = ggml_type_traits(info.type);
  const std::int64_t blocks_per_row = info.row_length() / traits.block_size;
  const std::uint8_t* src =
      bytes_.data() + info.file_offset + static_cast<std::uint64_t>(first_row * blocks_per_row * traits.type_size);
  detail::dequantize_blocks(info.type, src, n_rows * blocks_per_row, out);
}

KVFUSE_CPU_INLINE void GGUFFile::parse_bytes(std::span<const std::uint8_t> bytes) {
  bytes_ = bytes;
  detail::GGUFCursor cursor(bytes);

  // Header.
  const std::uint8_t* magic = cursor.take(4, "the magic");
  if (std::memcmp(magic, "GGUF", 4) != 0) {
    throw error(
        fmt::format("GGUF: bad magic {:02x} {:02x} {:02x} {:02x} at byte offset 0, expected 47 47 55 46 "
                    "(\"GGUF\")",
                    magic[0], magic[1], magic[2], magic[3]));
  }
  version_ = cursor.u32("the version");
  if (version_ == 0x02000000u || version_ == 0x03000000u) {
    throw error(fmt::format("GGUF: big-endian files are not supported (version field reads 0x{:08x})", version_));
  }
  detail::require(version_ == 2 || version_ == 3, "GGUF: unsupported version {} (kvfuse reads versions 2 and 3)",
                  version_);
  const std::uint64_t n_tensors = cursor.u64("the tensor count");
  const std::uint64_t n_kv = cursor.u64("the metadata count");
  // Every entry needs at least a u64 key length, a u32 type and one value byte; every tensor info a u64
  // name length, u32 n_dims, u32 type and u64 offset.
  constexpr std::uint64_t min_kv = 13;
  constexpr std::uint64_t min_tensor = 24;
  const std::uint64_t rest = cursor.remaining();
  detail::require(
      n_kv <= rest / min_kv && n_tensors <= (rest - n_kv * min_kv) / min_tensor,
      "GGUF: header claims {} metadata entries and {} tensors, but the {} bytes after the header hold at most "
      "{} entries, or {} tensors",
      n_kv, n_tensors, rest, rest / min_kv, rest / min_tensor);

  // Metadata.
  metadata_.reserve(static_cast<std::size_t>(n_kv));
  for (std::uint64_t i = 0; i < n_kv; ++i) {
    std::string key = cursor.string([i] { return fmt::format("key of metadata entry {}", i); });
    detail::require(!key_index_.contains(key), "GGUF: duplicate metadata key '{}' (entry {})", key, i);
    const std::uint32_t type = cursor.u32([&key] { return fmt::format("type of metadata key '{}'", key); });
    GGUFValue value = detail::GGUFValueReader(cursor, key).value(type);
    key_index_.emplace(key, metadata_.size());
    metadata_.push_back({std::move(key), std::move(value)});
  }
  if (const GGUFValue* a = find("general.alignment")) {
    const auto* v = std::get_if<std::uint32_t>(a);
    if (v == nullptr) throw wrong_type("general.alignment", *a, "uint32");
    detail::require(*v != 0 && (*v & (*v - 1)) == 0, "GGUF: general.alignment = {} is not a power of two", *v);
    alignment_ = *v;
  }

  // Tensor infos.
  tensors_.reserve(static_cast<std::size_t>(n_tensors));
  for (std::uint64_t i = 0; i < n_tensors; ++i) {
    GGUFTensorInfo info;
    info.name = cursor.string([i] { return fmt::format("name of tensor {}", i); });
    detail::require(!tensor_index_.contains(info.name), "GGUF: duplicate tensor name '{}' (tensor {})", info.name, i);
    const auto field = [&info](std::string_view f) {
      return [&info, f] { return fmt::format("{} of tensor '{}'", f, info.name); };
    };
    const std::uint64_t n_dims_at = cursor.pos();
    const std::uint32_t n_dims = cursor.u32(field("n_dims"));
    detail::require(n_dims <= 4, "GGUF: tensor '{}' has n_dims {} > 4 (at byte offset {})", info.name, n_dims,
                    n_dims_at);
    for (std::uint32_t d = 0; d < n_dims; ++d) {
      const std::uint64_t dim_at = cursor.pos();
      const std::uint64_t dim = cursor.u64(field("dims"));
      detail::require(dim <= static_cast<std::uint64_t>(INT64_MAX),
                      "GGUF: tensor '{}' dim ne{} = {} exceeds int64 (at byte offset {})", info.name, d, dim, dim_at);
      info.dims.push_back(static_cast<std::int64_t>(dim));
    }
    info.type = static_cast<GGMLType>(cursor.u32(field("type")));
    const std::uint64_t offset_at = cursor.pos();
    info.offset = cursor.u64(field("data offset"));
    info.size = detail::gguf_tensor_nbytes(info.name, info.dims, info.type);
    detail::require(info.offset % alignment_ == 0,
                    "GGUF: tensor '{}' data offset {} (at byte offset {}) is not a multiple of the alignment {}",
                    info.name, info.offset, offset_at, alignment_);
    tensor_index_.emplace(info.name, tensors_.size());
    tensors_.push_back(std::move(info));
  }

  // Data section: starts at the next multiple of the alignment; every tensor must lie inside the file.
  data_offset_ = (cursor.pos() + alignment_ - 1) / alignment_ * alignment_;
  const std::uint64_t size = bytes.size();
  for (GGUFTensorInfo& info : tensors_) {
    const bool inside =
        data_offset_ <= size && info.offset <= size - data_offset_ && info.size <= size - data_offset_ - info.offset;
    if (!inside) {
      constexpr std::uint64_t no_overflow = std::uint64_t{1} << 62;  // data_offset_ < 2^62 too: sums fit
      if (info.offset <= no_overflow && info.size <= no_overflow) {
        throw error(fmt::format("GGUF: tensor '{}' data [{}, {}) exceeds the file size {}", info.name,
                                data_offset_ + info.offset, data_offset_ + info.offset + info.size, size));
      }
      throw error(
          fmt::format("GGUF: tensor '{}' data at offset {} (+ data section start {}) with {} bytes exceeds "
                      "the file size {}",
                      info.name, info.offset, data_offset_, info.size, size));
    }
    info.file_offset = data_offset_ + info.offset;
  }
}

}  // namespace kvfuse
