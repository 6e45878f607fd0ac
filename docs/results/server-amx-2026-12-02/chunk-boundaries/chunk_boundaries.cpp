// Full prefill of one 524-token SmolLM2 prompt in one pass and in row blocks of 512, 100 and 64
// (CpuLlamaOptions::prefill_block_rows), with fp32 and bf16 products: the largest logit difference from one pass and
// how many greedy answer tokens agree. Built and run (2026-12-02, kvfuse of the commit that added this file):
//   g++ -O2 -std=c++20 -DNDEBUG -Iinclude -I/usr/include/eigen3 chunk_boundaries.cpp -o chunk_boundaries \
//       -lfmt -lpcre2-8 -lxxhash -lpthread && ./chunk_boundaries ~/.cache/kvfuse/SmolLM2-135M-Instruct.Q4_1.gguf
#include "kvfuse/cpu.hpp"
#include <cstdio>
#include <cmath>
using namespace kvfuse;
int main(int argc, char** argv){
  const GGUFFile file = GGUFFile::open(argv[1]);
  const Tokenizer tok = Tokenizer::from_gguf(file);
  std::string text;
  for (int i=0;i<12;++i) text += "The Rhine rises in the Swiss Alps and flows north through Germany into the Netherlands, where it reaches the North Sea. Lake Constance lies on the Rhine at the border of Germany, Switzerland and Austria. ";
  std::vector<ChatMessage> chat{{"user", text + "Which river flows through Lake Constance, and where does it rise?"}};
  auto ids = tok.encode(tok.format_chat(chat, true));
  printf("tokens %zu\n", ids.size());
  for (CpuProducts p : {CpuProducts::fp32, CpuProducts::bf16}) {
    std::vector<float> ref; std::vector<token_id> ref_ans;
    for (long block : {0L, 512L, 100L, 64L}) {
      CpuLlamaOptions o; o.threads = 2; o.products = p; o.prefill_block_rows = block;
      const CpuLlama model = CpuLlama::from_gguf(file, o);
      LlamaPrefill f = model.full_prefill(ids);
      auto ans = model.greedy_decode(f.kv, f.logits, 48, tok.eos());
      double md = 0; if (!ref.empty()) for (size_t i=0;i<ref.size();++i) md = std::max(md, (double)std::fabs(ref[i]-f.logits[i]));
      if (ref.empty()) { ref = f.logits; ref_ans = ans; }
      size_t same = 0; while (same < ans.size() && same < ref_ans.size() && ans[same]==ref_ans[same]) ++same;
      printf("%s block %ld: max |dlogit| vs one pass %.3g, answer tokens equal to one pass's: first %zu of %zu\n", products_name(p), block, md, same, ans.size());
    }
  }
}
