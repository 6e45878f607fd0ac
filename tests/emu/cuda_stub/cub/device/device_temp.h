#pragma once
// Shared by the device-wide CUB stubs (tests/emu/README.md): CUB's two-phase temporary-storage protocol.
// d_temp_storage == nullptr: only the size is written. Otherwise the given size must cover it (else
// cudaErrorInvalidValue, like CUB), and the whole temporary storage is overwritten with 0xFF bytes before the
// inputs are read, as CUB's own use of it would: a temporary region that overlaps an input or an output
// shows up in the result. emu::cub_calls counts the calls that ran (not the size queries).
#include <cstddef>
#include <cstring>

#include "cuda_runtime_api.h"

namespace emu {

inline long long cub_calls = 0;

inline std::size_t round256(std::size_t bytes) { return (bytes + 255) / 256 * 256; }

// True when the call should run; `need` is the temporary storage it asks for.
inline bool cub_temp(void* d_temp_storage, std::size_t& temp_storage_bytes, std::size_t need, cudaError_t& error) {
  error = cudaSuccess;
  if (d_temp_storage == nullptr) {
    temp_storage_bytes = need;
    return false;
  }
  if (temp_storage_bytes < need) {
    error = cudaErrorInvalidValue;
    return false;
  }
  std::memset(d_temp_storage, 0xFF, need);
  ++cub_calls;
  return true;
}

}  // namespace emu
