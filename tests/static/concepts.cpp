// Static tests: every backend model satisfies its concept, and non-models are rejected.
#include "kvfuse/kvfuse.hpp"

namespace {
struct NotAStore {
  int get() { return 0; }
};
struct NotACompute {
  void compute_kv(kvfuse::TokenRange) {}
};
}  // namespace

static_assert(kvfuse::KVStore<kvfuse::InMemoryKVStore>);
static_assert(!kvfuse::KVStore<NotAStore>);
static_assert(!kvfuse::ComputeBackend<NotACompute>);
static_assert(!kvfuse::CostModeledStore<kvfuse::InMemoryKVStore>);

int main() { return 0; }
