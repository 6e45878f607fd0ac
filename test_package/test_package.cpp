// Uses the packaged headers for real: a prompt layout and a KV round trip through InMemoryKVStore.
#include <cstddef>
#include <cstdio>
#include <vector>

#include "kvfuse/kvfuse.hpp"
#include "kvfuse/stores.hpp"

int main() {
  const auto layout = kvfuse::PromptLayout::from_lengths({4, 4}, 3);
  layout.validate();

  const std::vector<kvfuse::token_id> tokens{1, 2, 3, 4, 5, 6, 7, 8};
  const auto keys = kvfuse::prefix_chunk_keys(/*model=*/7, tokens, /*chunk=*/4);

  kvfuse::InMemoryKVStore store;
  for (const auto& key : keys) store.put(key, kvfuse::KVBlock{4, std::vector<std::byte>(16)});
  const auto block = store.get(keys.back());
  if (keys.size() != 2 || !block || block->num_tokens != 4 || layout.num_tokens() != 11) {
    std::puts("kvfuse test_package: unexpected result");
    return 1;
  }
  std::printf("kvfuse %d.%d.%d test_package OK: %zu chunk keys stored, prompt of %lld tokens\n",
              KVFUSE_VERSION_MAJOR, KVFUSE_VERSION_MINOR, KVFUSE_VERSION_PATCH, store.size(),
              static_cast<long long>(layout.num_tokens()));
  return 0;
}
