#pragma once
// Umbrella header of what runs kvfuse's policies on real threads and the real clock: run_threaded (Cake's
// bidirectional loader with the compute side on the calling thread and the loads on an I/O thread) and
// run_composed (one request: Cake for the stored exact prefix, a fusion method for the reused chunks).
// The policies alone: kvfuse/kvfuse.hpp.

#include "kvfuse/kvfuse.hpp"

#include "kvfuse/fusion/composed_request.hpp"
#include "kvfuse/schedule/threaded_loader.hpp"
