// A tiny engine-side program: stores a chunk's KV under its content key, reads it back, and checks a
// prompt layout, using only kvfuse's public API. Exit code 0 means the package works for a consumer.
#include <array>
#include <cstddef>
#include <cstdio>
#include <vector>

#include "kvfuse/kvfuse.hpp"
#include "kvfuse/stores.hpp"

int main() {
  const std::array<kvfuse::token_id, 5> passage{101, 7592, 2088, 999, 102};
  const kvfuse::KVKey key{/*model=*/1, kvfuse::hash_tokens(passage)};

  kvfuse::InMemoryKVStore store;
  store.put(key, kvfuse::KVBlock{5, std::vector<std::byte>(40, std::byte{0x2a})});
  const auto block = store.get(key);
  if (!block || block->num_tokens != 5 || block->bytes.size() != 40 || store.bytes() != 40) {
    std::puts("InMemoryKVStore put/get round trip failed");
    return 1;
  }

  const auto layout = kvfuse::PromptLayout::from_lengths({5, 3}, 2);
  layout.validate();
  if (layout.num_tokens() != 10 || !(layout.query == kvfuse::TokenRange{8, 10})) {
    std::puts("PromptLayout::from_lengths built the wrong layout");
    return 1;
  }

  kvfuse::PromptLayout gap = layout;
  gap.query.begin = 9;  // leaves token 8 outside every chunk and the query
  try {
    gap.validate();
    std::puts("PromptLayout::validate accepted a layout with a gap");
    return 1;
  } catch (const kvfuse::error& e) {
    std::printf("kvfuse %d.%d.%d consumer OK (rejected bad layout: %s)\n", KVFUSE_VERSION_MAJOR,
                KVFUSE_VERSION_MINOR, KVFUSE_VERSION_PATCH, e.what());
  }
  return 0;
}
