#pragma once
// Umbrella header of what runs kvfuse's policies on real threads and the real clock: FusionPipeline (the
// fusion loop over an engine's backends; its layer-pipelined loading reads stored KV on an I/O thread),
// run_threaded (Cake's bidirectional loader with the compute side on the calling thread and the loads on an
// I/O thread), run_composed (one request: Cake for the stored exact prefix, a fusion method for the reused
// chunks) and serve (an engine's step loop: TokenBudgetScheduler splits each step among decoding, plain and
// Cake requests). The policies alone: kvfuse/kvfuse.hpp.

#include "kvfuse/kvfuse.hpp"

#include "kvfuse/fusion/composed_request.hpp"
#include "kvfuse/fusion/connector.hpp"
#include "kvfuse/fusion/fusion_pipeline.hpp"
#include "kvfuse/schedule/serving_loop.hpp"
#include "kvfuse/schedule/threaded_loader.hpp"
