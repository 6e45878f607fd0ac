#pragma once
// Umbrella header: everything host-side in kvfuse (no CUDA needed).

#include "kvfuse/core/config.hpp"
#include "kvfuse/core/dtype.hpp"
#include "kvfuse/core/error.hpp"
#include "kvfuse/core/prompt.hpp"
#include "kvfuse/core/status.hpp"
#include "kvfuse/core/types.hpp"

#include "kvfuse/backend/concepts.hpp"
#include "kvfuse/backend/disk_kv_store.hpp"
#include "kvfuse/backend/in_memory_store.hpp"
#include "kvfuse/backend/simulated.hpp"
#include "kvfuse/backend/tiered_kv_store.hpp"

#include "kvfuse/schedule/bidirectional_loader.hpp"
#include "kvfuse/schedule/loading_controller.hpp"
#include "kvfuse/schedule/preload_planner.hpp"
#include "kvfuse/schedule/token_budget_scheduler.hpp"

#include "kvfuse/select/attnlink_boundary.hpp"
#include "kvfuse/select/cci_scorer.hpp"
#include "kvfuse/select/focused_chunk_detector.hpp"
#include "kvfuse/select/hkvd_selector.hpp"

#include "kvfuse/cache/variant_cache.hpp"

#include "kvfuse/eval/metrics.hpp"
#include "kvfuse/fusion/fusion_method.hpp"

#include "kvfuse/split/kv_split.hpp"

// The CUDA kernels' argument structs and CPU references (the launchers: kvfuse/cuda.cuh).
#include "kvfuse/ref/kv_scatter.hpp"
#include "kvfuse/ref/kv_topk.hpp"
#include "kvfuse/ref/rope.hpp"
#include "kvfuse/ref/sparse_attention.hpp"
