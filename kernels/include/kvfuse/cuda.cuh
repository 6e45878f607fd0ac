#pragma once
// Umbrella header of kvfuse::cuda: every kernel launcher (docs/kernels.md). Include it from .cu files
// compiled by nvcc; the argument structs alone are in kvfuse/kernel_args/*.hpp (no CUDA).

#include "kvfuse/cuda/kv_scatter.cuh"
#include "kvfuse/cuda/kv_topk.cuh"
#include "kvfuse/cuda/rope.cuh"
#include "kvfuse/cuda/sparse_attention.cuh"
#include "kvfuse/cuda/status.cuh"
