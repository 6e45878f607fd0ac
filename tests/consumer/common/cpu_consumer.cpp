// Uses kvfuse::cpu from a consumer: PCRE2 (tokenizer) and Eigen (reference backend) must resolve through
// kvfuse's package config. A two-merge vocabulary: "a" "b" -> "ab", "ab" "c" -> "abc".
#include <cstdio>

#include "kvfuse/cpu.hpp"

int main() {
  kvfuse::TokenizerVocab vocab;
  vocab.pre = "gpt-2";
  vocab.tokens = {"a", "b", "c", "ab", "abc"};
  vocab.merges = {"a b", "ab c"};
  const kvfuse::BPETokenizer tok(vocab);
  const auto ids = tok.encode("abc");
  if (ids.size() != 1 || ids[0] != 4) {
    std::puts("kvfuse::cpu consumer: tokenizer gave the wrong ids");
    return 1;
  }
  static_assert(kvfuse::ComputeBackend<kvfuse::CpuLlamaSession>);
  std::puts("kvfuse::cpu consumer OK");
  return 0;
}
