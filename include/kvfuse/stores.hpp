#pragma once
// Umbrella header of the KVStore models kvfuse ships (each next to a static_assert(kvfuse::KVStore<...>)):
// InMemoryKVStore, DiskKVStore (one checksummed file per key, atomic writes; POSIX), TieredKVStore
// (memory over disk), ThrottledKVStore (any store behind a link of limited bandwidth and latency) and AnyKVStore /
// AnyTieredKVStore (whichever store a flag picked, behind one type). The policies alone: kvfuse/kvfuse.hpp.

#include "kvfuse/kvfuse.hpp"

#include "kvfuse/backend/any_kv_store.hpp"
#include "kvfuse/backend/disk_kv_store.hpp"
#include "kvfuse/backend/in_memory_store.hpp"
#include "kvfuse/backend/throttled_kv_store.hpp"
#include "kvfuse/backend/tiered_kv_store.hpp"
