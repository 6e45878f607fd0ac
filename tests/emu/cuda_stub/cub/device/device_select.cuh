#pragma once
// Stub of cub/device/device_select.cuh for the CPU emulation (tests/emu/README.md): cub::DeviceSelect::If and
// ::Flagged, stable compactions of the items the predicate or the flags keep, with CUB's temporary-storage protocol
// (device_temp.h). Temporary storage: 256 bytes plus 16 per tile of 1024 items (of the order CUB asks).
#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "cub/device/device_temp.h"
#include "cuda_runtime_api.h"

namespace cub {

struct DeviceSelect {
  template <class InputIt, class OutputIt, class NumSelectedIt, class NumItems, class SelectOp>
  static cudaError_t If(void* d_temp_storage, std::size_t& temp_storage_bytes, InputIt d_in, OutputIt d_out,
                        NumSelectedIt d_num_selected_out, NumItems num_items, SelectOp select_op,
                        cudaStream_t = nullptr) {
    const auto n = static_cast<std::int64_t>(num_items);
    const std::size_t need = 256 + 16 * static_cast<std::size_t>((n + 1023) / 1024);
    cudaError_t error;
    if (!emu::cub_temp(d_temp_storage, temp_storage_bytes, need, error)) return error;
    std::int64_t selected = 0;
    for (std::int64_t i = 0; i < n; ++i) {
      const auto item = d_in[i];
      if (select_op(item)) d_out[selected++] = item;
    }
    *d_num_selected_out = selected;
    return cudaSuccess;
  }

  // The items whose flag is nonzero, in order; the same temporary storage as If.
  template <class InputIt, class FlagIt, class OutputIt, class NumSelectedIt, class NumItems>
  static cudaError_t Flagged(void* d_temp_storage, std::size_t& temp_storage_bytes, InputIt d_in, FlagIt d_flags,
                             OutputIt d_out, NumSelectedIt d_num_selected_out, NumItems num_items,
                             cudaStream_t = nullptr) {
    const auto n = static_cast<std::int64_t>(num_items);
    const std::size_t need = 256 + 16 * static_cast<std::size_t>((n + 1023) / 1024);
    cudaError_t error;
    if (!emu::cub_temp(d_temp_storage, temp_storage_bytes, need, error)) return error;
    std::int64_t selected = 0;
    for (std::int64_t i = 0; i < n; ++i) {
      if (d_flags[i] != 0) d_out[selected++] = d_in[i];
    }
    *d_num_selected_out = static_cast<std::remove_reference_t<decltype(*d_num_selected_out)>>(selected);
    return cudaSuccess;
  }
};

}  // namespace cub
