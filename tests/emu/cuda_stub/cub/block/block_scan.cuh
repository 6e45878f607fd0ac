#pragma once
// Stub of cub/block/block_scan.cuh for the CPU emulation (tests/emu/README.md): cub::BlockScan<T, Threads>
// ExclusiveSum of one item per thread, through TempStorage (every thread publishes its item, one
// __syncthreads, each sums the items of the lower threads). Like CUB's, TempStorage is uninitialized shared
// memory owned by the caller, and reusing it needs a __syncthreads first.
#include "cuda_runtime.h"

namespace cub {

template <class T, int Threads>
class BlockScan {
 public:
  struct TempStorage {
    T items[Threads];
  };
  explicit BlockScan(TempStorage& storage) : storage_(storage) {}

  void ExclusiveSum(T input, T& output) {
    const auto tid = static_cast<int>(threadIdx.x);
    if (static_cast<int>(blockDim.x) != Threads) emu::fail("cub::BlockScan: the block size is not Threads");
    storage_.items[tid] = input;
    __syncthreads();
    T sum{};
    for (int i = 0; i < tid; ++i) sum += storage_.items[i];
    output = sum;
  }

 private:
  TempStorage& storage_;
};

}  // namespace cub
