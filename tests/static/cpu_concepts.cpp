// Static tests for kvfuse::cpu: the reference backend's session models ComputeBackend, Cake's threaded driver
// instantiates for it over the tiered store and the batch engine (Cake requests included) over that store behind
// a link, and the cpu umbrella header compiles on its own.
#include "kvfuse/cpu.hpp"
#include "kvfuse/runtime.hpp"

static_assert(kvfuse::ComputeBackend<kvfuse::CpuLlamaSession>);
static_assert(!kvfuse::CostModeledCompute<kvfuse::CpuLlamaSession>);
static_assert(!std::is_copy_constructible_v<kvfuse::GGUFFile>);
static_assert(std::is_move_constructible_v<kvfuse::GGUFFile>);

// Cake on the real backend with a real store: the threaded driver and the batch engine compile for them.
using CpuTieredStore = kvfuse::TieredKVStore<kvfuse::InMemoryKVStore, kvfuse::DiskKVStore>;
template kvfuse::LoaderTrace kvfuse::run_threaded(const kvfuse::BidirectionalLoader<kvfuse::CpuLlamaSession, CpuTieredStore>&,
                                                  kvfuse::CpuLlamaSession&, CpuTieredStore&,
                                                  std::span<const kvfuse::token_id>);
template class kvfuse::CpuBatchEngine<kvfuse::ThrottledKVStore<CpuTieredStore>>;

int main() { return 0; }
