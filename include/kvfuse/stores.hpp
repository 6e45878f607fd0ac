#pragma once
// Umbrella header of the KVStore models kvfuse ships (each next to a static_assert(kvfuse::KVStore<...>)):
// InMemoryKVStore, DiskKVStore (one checksummed file per key, atomic writes; POSIX), TieredKVStore
// (memory over disk) and ThrottledKVStore (any store behind a link of limited bandwidth and latency). The policies alone: kvfuse/kvfuse.hpp.

#include "kvfuse/kvfuse.hpp"

#include "kvfuse/backend/disk_kv_store.hpp"
#include "kvfuse/backend/in_memory_store.hpp"
#include "kvfuse/backend/throttled_kv_store.hpp"
#include "kvfuse/backend/tiered_kv_store.hpp"
