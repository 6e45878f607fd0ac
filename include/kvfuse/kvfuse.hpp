#pragma once
// Umbrella header of kvfuse's policies: what an engine needs to plan KV reuse (host C++20, no CUDA, no
// file I/O, no threads, no CPU reference kernels). Policies take plain data and return plain-data plans;
// the engine's backends (backend/concepts.hpp) execute them.
//
// The other umbrella headers, each for what it names:
//   kvfuse/stores.hpp      KVStore models: InMemoryKVStore, DiskKVStore (POSIX files), TieredKVStore
//   kvfuse/runtime.hpp     policies run on real threads: FusionPipeline (the fusion loop over an engine's
//                          backends, with its layer-pipelined I/O thread), run_threaded (Cake's loader),
//                          run_composed (both in one request)
//   kvfuse/cpu.hpp         the reference CPU backend: GGUF models, tokenizer, Eigen Llama (CpuLlamaFusion)
//   kvfuse/kernel_args/    the CUDA kernels' argument structs and validation (launchers: kvfuse/cuda.cuh)
// Not part of the library (harness/include/kvfuse/harness/, not installed: kvfuse's tools, benchmarks and tests):
// the quality metrics, the calibration runner and its file cache, the RAG prompt format, the simulated backends
// and the kernels' CPU references.

#include "kvfuse/core/config.hpp"
#include "kvfuse/core/dtype.hpp"
#include "kvfuse/core/error.hpp"
#include "kvfuse/core/hash.hpp"
#include "kvfuse/core/keys.hpp"
#include "kvfuse/core/prompt.hpp"
#include "kvfuse/core/rope.hpp"
#include "kvfuse/core/status.hpp"
#include "kvfuse/core/types.hpp"

#include "kvfuse/backend/concepts.hpp"

#include "kvfuse/schedule/bidirectional_loader.hpp"
#include "kvfuse/schedule/chunk_sizes.hpp"
#include "kvfuse/schedule/loading_controller.hpp"
#include "kvfuse/schedule/preload_planner.hpp"
#include "kvfuse/schedule/token_budget_scheduler.hpp"

#include "kvfuse/select/attnlink_boundary.hpp"
#include "kvfuse/select/cci_scorer.hpp"
#include "kvfuse/select/focused_chunk_detector.hpp"
#include "kvfuse/select/hkvd_selector.hpp"
#include "kvfuse/select/query_aware_selector.hpp"
#include "kvfuse/select/query_probe_selector.hpp"

#include "kvfuse/cache/variant_cache.hpp"

#include "kvfuse/split/kv_split.hpp"

#include "kvfuse/fusion/calibration.hpp"
#include "kvfuse/fusion/fusion_backend.hpp"
#include "kvfuse/fusion/fusion_method.hpp"
#include "kvfuse/fusion/layer_protocol.hpp"
#include "kvfuse/fusion/layer_schedule.hpp"
#include "kvfuse/fusion/planner.hpp"
