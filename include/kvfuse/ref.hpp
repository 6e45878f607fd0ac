#pragma once
// Umbrella header of the CUDA kernels' argument structs, validation and CPU references (kvfuse::ref), with
// no CUDA needed: RoPE apply / inverse / shift, sparse-query attention, KV deviation + top-k, KV scatter /
// gather. The launchers taking the same structs: kvfuse/cuda.cuh (target kvfuse::cuda).

#include "kvfuse/ref/kv_scatter.hpp"
#include "kvfuse/ref/kv_topk.hpp"
#include "kvfuse/ref/rope.hpp"
#include "kvfuse/ref/sparse_attention.hpp"
