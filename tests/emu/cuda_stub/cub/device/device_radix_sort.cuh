#pragma once
// Stub of cub/device/device_radix_sort.cuh for the CPU emulation (tests/emu/README.md): the
// cub::DeviceRadixSort calls kv_topk.cuh makes (SortPairsDescending, SortKeys) on float and int32 keys, with
// CUB's temporary-storage protocol (device_temp.h) and CUB's key order: a stable sort of the "twiddled" key
// bits [begin_bit, end_bit) (floats: sign bit flipped for positives, every bit for negatives, so a negative
// NaN sorts below -inf and a positive one above +inf; -0.0 digits as +0.0, as this CCCL's
// ProcessFloatMinusZero does; signed integers: sign bit flipped).
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <numeric>
#include <type_traits>
#include <vector>

#include "cub/device/device_temp.h"
#include "cuda_runtime_api.h"

namespace cub {

namespace emu_detail {

inline std::uint32_t twiddle(float key) {
  std::uint32_t bits;
  std::memcpy(&bits, &key, 4);
  if (bits == 0x80000000u) bits = 0;  // -0.0 -> +0.0
  return (bits & 0x80000000u) != 0 ? ~bits : bits ^ 0x80000000u;
}
inline std::uint32_t twiddle(std::int32_t key) { return static_cast<std::uint32_t>(key) ^ 0x80000000u; }

template <class Key>
std::uint32_t digits(Key key, int begin_bit, int end_bit) {
  const std::uint32_t t = twiddle(key);
  const int bits = end_bit - begin_bit;
  const std::uint32_t mask = bits >= 32 ? ~0u : ((1u << bits) - 1u);
  return (t >> begin_bit) & mask;
}

// The stable order of [0, n) by key digits, ascending or descending.
template <class Key>
std::vector<std::int64_t> order(const Key* keys, std::int64_t n, int begin_bit, int end_bit, bool descending) {
  std::vector<std::int64_t> idx(static_cast<std::size_t>(n));
  std::iota(idx.begin(), idx.end(), std::int64_t{0});
  std::stable_sort(idx.begin(), idx.end(), [&](std::int64_t a, std::int64_t b) {
    const std::uint32_t x = digits(keys[a], begin_bit, end_bit), y = digits(keys[b], begin_bit, end_bit);
    return descending ? x > y : x < y;
  });
  return idx;
}

template <class Key, class Value, class NumItems>
cudaError_t sort(void* d_temp_storage, std::size_t& temp_storage_bytes, const Key* keys_in, Key* keys_out,
                 const Value* values_in, Value* values_out, NumItems num_items, int begin_bit, int end_bit,
                 bool descending, bool pairs) {
  static_assert(sizeof(Key) == 4, "the stub sorts 32-bit keys");
  const auto n = static_cast<std::int64_t>(num_items);
  std::size_t need = emu::round256(sizeof(Key) * static_cast<std::size_t>(n)) + 1024;
  if (pairs) need += emu::round256(sizeof(Value) * static_cast<std::size_t>(n));
  if (begin_bit < 0 || end_bit > 32 || begin_bit >= end_bit) return cudaErrorInvalidValue;
  cudaError_t error;
  if (!emu::cub_temp(d_temp_storage, temp_storage_bytes, need, error)) return error;
  const std::vector<std::int64_t> idx = order(keys_in, n, begin_bit, end_bit, descending);
  std::vector<Key> keys(static_cast<std::size_t>(n));
  std::vector<Value> values(pairs ? static_cast<std::size_t>(n) : 0);
  for (std::int64_t i = 0; i < n; ++i) {
    keys[static_cast<std::size_t>(i)] = keys_in[idx[static_cast<std::size_t>(i)]];
    if (pairs) values[static_cast<std::size_t>(i)] = values_in[idx[static_cast<std::size_t>(i)]];
  }
  std::copy(keys.begin(), keys.end(), keys_out);
  if (pairs) std::copy(values.begin(), values.end(), values_out);
  return cudaSuccess;
}

}  // namespace emu_detail

struct DeviceRadixSort {
  template <class Key, class Value, class NumItems>
  static cudaError_t SortPairsDescending(void* d_temp_storage, std::size_t& temp_storage_bytes, const Key* d_keys_in,
                                         Key* d_keys_out, const Value* d_values_in, Value* d_values_out,
                                         NumItems num_items, int begin_bit = 0, int end_bit = sizeof(Key) * 8,
                                         cudaStream_t = nullptr) {
    return emu_detail::sort(d_temp_storage, temp_storage_bytes, d_keys_in, d_keys_out, d_values_in, d_values_out,
                            num_items, begin_bit, end_bit, true, true);
  }
  template <class Key, class NumItems>
  static cudaError_t SortKeys(void* d_temp_storage, std::size_t& temp_storage_bytes, const Key* d_keys_in,
                              Key* d_keys_out, NumItems num_items, int begin_bit = 0, int end_bit = sizeof(Key) * 8,
                              cudaStream_t = nullptr) {
    return emu_detail::sort(d_temp_storage, temp_storage_bytes, d_keys_in, d_keys_out,
                            static_cast<const Key*>(nullptr), static_cast<Key*>(nullptr), num_items, begin_bit,
                            end_bit, false, false);
  }
};

}  // namespace cub
