#pragma once
// Umbrella header of the KVStore models kvfuse ships (each next to a static_assert(kvfuse::KVStore<...>)):
// InMemoryKVStore, DiskKVStore (one checksummed file per key, atomic writes; POSIX) and TieredKVStore
// (memory over disk). The policies alone: kvfuse/kvfuse.hpp.

#include "kvfuse/kvfuse.hpp"

#include "kvfuse/backend/disk_kv_store.hpp"
#include "kvfuse/backend/in_memory_store.hpp"
#include "kvfuse/backend/tiered_kv_store.hpp"
