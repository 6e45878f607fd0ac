#pragma once
// Umbrella header of what runs kvfuse's policies on real threads and the real clock: run_threaded (Cake's
// bidirectional loader with the compute side on the calling thread and the loads on an I/O thread).
// The policies alone: kvfuse/kvfuse.hpp.

#include "kvfuse/kvfuse.hpp"

#include "kvfuse/schedule/threaded_loader.hpp"
