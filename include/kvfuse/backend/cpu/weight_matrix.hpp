#pragma once
// WeightMatrix: a weight matrix W [rows][cols] of the reference CPU backend (row-major, a projection is
// y = W x), held as the model file stores it: fp32 values, or rows of ggml blocks (any dequantizable GGMLType,
// model/ggml_quant.hpp) that are dequantized when used — a Q4_1 matrix takes 5 bits a weight instead of 32.
// Dequantization gives ggml's reference bits (detail::dequantize_blocks_cpu: AVX2 for the common types, the same
// values), so a row dequantized here is bit-identical to GGUFFile::dequantize of the same tensor.
//
// The products (CpuLlama::project) dequantize the rows of a panel of outputs at a time and run the dense
// kernels of detail/cpu_kernels.hpp on them; the output head's (CpuLlama::matvec_rows) dequantizes in registers
// where it can (backend/cpu/quantized_gemv.hpp).

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <utility>
#include <vector>

#include <Eigen/Core>

#include "kvfuse/backend/cpu/dequantize.hpp"
#include "kvfuse/core/error.hpp"
#include "kvfuse/model/ggml_quant.hpp"
#include "kvfuse/model/ggml_type.hpp"

namespace kvfuse {

using RowMatrix = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;

class WeightMatrix {
 public:
  WeightMatrix() = default;  // 0 x 0

  // fp32 values (implicit: a RowMatrix, or any Eigen expression, is a WeightMatrix).
  WeightMatrix(RowMatrix values)  // NOLINT(google-explicit-constructor)
      : rows_(values.rows()), cols_(values.cols()), values_(std::move(values)) {}
  template <class Derived>
  WeightMatrix(const Eigen::MatrixBase<Derived>& values)  // NOLINT(google-explicit-constructor)
      : WeightMatrix(RowMatrix(values)) {}

  // rows x cols of `type` from ggml blocks (rows * cols / block_size blocks, each row whole blocks), copied.
  [[nodiscard]] static WeightMatrix from_blocks(GGMLType type, std::int64_t rows, std::int64_t cols,
                                                std::span<const std::byte> bytes) {
    const GGMLTypeTraits traits = ggml_type_traits(type);
    detail::require(traits.dequantizable, "WeightMatrix: ggml type {} is not dequantizable", traits.name);
    detail::require(rows >= 0 && cols >= 0 && cols % traits.block_size == 0,
                    "WeightMatrix: {} x {} of {} (rows must be whole blocks of {})", rows, cols, traits.name,
                    traits.block_size);
    const std::int64_t row_bytes = cols / traits.block_size * traits.type_size;
    detail::require(static_cast<std::int64_t>(bytes.size()) == rows * row_bytes,
                    "WeightMatrix: {} bytes for {} x {} of {} ({} expected)", bytes.size(), rows, cols, traits.name,
                    rows * row_bytes);
    WeightMatrix w;
    w.type_ = type;
    w.rows_ = rows;
    w.cols_ = cols;
    w.row_bytes_ = row_bytes;
    w.blocks_.resize(bytes.size());
    if (!bytes.empty()) std::memcpy(w.blocks_.data(), bytes.data(), bytes.size());
    return w;
  }

  [[nodiscard]] std::int64_t rows() const noexcept { return rows_; }
  [[nodiscard]] std::int64_t cols() const noexcept { return cols_; }
  [[nodiscard]] std::int64_t size() const noexcept { return rows_ * cols_; }
  [[nodiscard]] GGMLType type() const noexcept { return type_; }
  // fp32 values in memory (values() and row() apply); otherwise blocks, read with dequantize_rows.
  [[nodiscard]] bool is_f32() const noexcept { return type_ == GGMLType::f32; }
  // Bytes of the weights held.
  [[nodiscard]] std::size_t bytes() const noexcept {
    return is_f32() ? static_cast<std::size_t>(size()) * sizeof(float) : blocks_.size();
  }

  // The weights as held: the fp32 values, or the ggml blocks (model fingerprints hash these).
  [[nodiscard]] std::span<const std::byte> raw() const noexcept {
    if (is_f32()) return std::as_bytes(std::span(values_.data(), static_cast<std::size_t>(values_.size())));
    return std::as_bytes(std::span(blocks_));
  }

  // The fp32 values (is_f32() only).
  [[nodiscard]] const RowMatrix& values() const {
    detail::require(is_f32(), "WeightMatrix: values() of a {} matrix", ggml_type_traits(type_).name);
    return values_;
  }

  // The blocks of row r and the bytes of one row of blocks (not is_f32()).
  [[nodiscard]] const std::uint8_t* row_blocks(std::int64_t r) const noexcept { return blocks_.data() + r * row_bytes_; }
  [[nodiscard]] std::int64_t row_bytes() const noexcept { return row_bytes_; }

  // Rows [first, first + n) as fp32 into out (n * cols floats).
  void dequantize_rows(std::int64_t first, std::int64_t n, float* out) const {
    if (n <= 0) return;
    if (is_f32()) {
      std::memcpy(out, values_.data() + first * cols_, static_cast<std::size_t>(n * cols_) * sizeof(float));
      return;
    }
    const GGMLTypeTraits traits = ggml_type_traits(type_);
    detail::dequantize_blocks_cpu(type_, blocks_.data() + first * row_bytes_, n * cols_ / traits.block_size, out);
  }

  // Elements [first, first + count) in row-major order as fp32.
  [[nodiscard]] std::vector<float> elements(std::int64_t first, std::int64_t count) const {
    std::vector<float> out(static_cast<std::size_t>(count));
    if (count <= 0) return out;
    const std::int64_t r0 = first / cols_;
    const std::int64_t r1 = (first + count - 1) / cols_ + 1;
    std::vector<float> rows(static_cast<std::size_t>((r1 - r0) * cols_));
    dequantize_rows(r0, r1 - r0, rows.data());
    std::memcpy(out.data(), rows.data() + (first - r0 * cols_), static_cast<std::size_t>(count) * sizeof(float));
    return out;
  }

  // All values as fp32.
  [[nodiscard]] RowMatrix dense() const {
    RowMatrix m(rows_, cols_);
    dequantize_rows(0, rows_, m.data());
    return m;
  }

  // Whether every value is finite.
  [[nodiscard]] bool all_finite() const {
    if (is_f32()) return values_.allFinite();
    std::vector<float> row(static_cast<std::size_t>(cols_));
    for (std::int64_t r = 0; r < rows_; ++r) {
      dequantize_rows(r, 1, row.data());
      for (const float v : row)
        if (!std::isfinite(v)) return false;
    }
    return true;
  }

 private:
  GGMLType type_ = GGMLType::f32;
  std::int64_t rows_ = 0;
  std::int64_t cols_ = 0;
  RowMatrix values_;                  // f32
  std::int64_t row_bytes_ = 0;        // other types: bytes of one row of blocks
  std::vector<std::uint8_t> blocks_;  // rows_ * row_bytes_
};

}  // namespace kvfuse
