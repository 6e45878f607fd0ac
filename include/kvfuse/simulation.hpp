#pragma once
// Umbrella header of the simulated backends: SimulatedCompute and SimulatedStore model their costs (a cost
// model plus a time-varying ResourceTrace), so BidirectionalLoader::run replays them in virtual time,
// deterministically (Cake's Table 3 setting, best_static_split). The policies alone: kvfuse/kvfuse.hpp.

#include "kvfuse/kvfuse.hpp"

#include "kvfuse/backend/simulated.hpp"
