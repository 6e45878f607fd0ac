#pragma once
// Umbrella header of what runs kvfuse's policies on real threads and the real clock: FusionPipeline (the
// fusion loop over an engine's backends; its layer-pipelined loading reads stored KV on an I/O thread),
// run_threaded (Cake's bidirectional loader with the compute side on the calling thread and the loads on an
// I/O thread), run_composed (one request: Cake for the stored exact prefix, a fusion method for the reused
// chunks), FusionConnector (an engine's request-keyed hooks for the fusion methods) and CakeRequests (an engine's
// step loop: Cake requests' loads from the back, their compute side fed by TokenBudgetScheduler; the reference
// CPU backend's CpuBatchEngine, kvfuse/cpu.hpp, runs both). The policies alone: kvfuse/kvfuse.hpp.

#include "kvfuse/kvfuse.hpp"

#include "kvfuse/fusion/composed_request.hpp"
#include "kvfuse/fusion/connector.hpp"
#include "kvfuse/fusion/fusion_pipeline.hpp"
#include "kvfuse/schedule/cake_requests.hpp"
#include "kvfuse/schedule/threaded_loader.hpp"
