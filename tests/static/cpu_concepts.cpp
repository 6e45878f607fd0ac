// Static tests for kvfuse::cpu: the reference backend's session models ComputeBackend, and the cpu
// umbrella header compiles on its own.
#include "kvfuse/cpu.hpp"

static_assert(kvfuse::ComputeBackend<kvfuse::CpuLlamaSession>);
static_assert(!kvfuse::CostModeledCompute<kvfuse::CpuLlamaSession>);
static_assert(!std::is_copy_constructible_v<kvfuse::GGUFFile>);
static_assert(std::is_move_constructible_v<kvfuse::GGUFFile>);

int main() { return 0; }
