// llama.cpp's reference values for tests/unit/qwen2.cpp, through its public C API (llama.h). Built by hand
// against the llama.cpp source scripts/fetch_llamacpp.sh fetches (see make_qwen2_cases.py, which runs it):
//   qwen2_llamacpp_reference template MODEL     the GGUF's chat template (llama_model_chat_template)
//   qwen2_llamacpp_reference tok MODEL          stdin: lines "<parse_special 0|1>\t<escaped text>";
//                                               stdout: llama_tokenize(text, add_special = true, parse_special),
//                                               one line of ids per input line
//   qwen2_llamacpp_reference eval MODEL f16|f32 N   stdin: prompt ids; full prefill in one batch with a K/V cache
//                                               of that type, one thread; stdout: "max_abs X" (max |logit| of
//                                               the last position), its 20 largest logits "id logit", then
//                                               "greedy <ids>": N argmax tokens, stopping after an EOG token;
//                                               weights in the plain CPU buffers (no repacking, no AMX), no
//                                               flash attention
//   qwen2_llamacpp_reference dequant IN OUT     every tensor to F32 (llama_model_quantize, LLAMA_FTYPE_ALL_F32)
// Text is escaped as in case_format.py: \\ \t \n \r and \xHH per byte.
#include <llama.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <numeric>
#include <string>
#include <vector>

namespace {

std::string unescape(const std::string& s) {
  std::string out;
  for (std::size_t i = 0; i < s.size(); ++i) {
    if (s[i] != '\\' || i + 1 == s.size()) {
      out += s[i];
      continue;
    }
    const char c = s[++i];
    if (c == 'x') {
      out += static_cast<char>(std::strtol(s.substr(i + 1, 2).c_str(), nullptr, 16));
      i += 2;
    } else {
      out += c == 'n' ? '\n' : c == 't' ? '\t' : c == 'r' ? '\r' : c;
    }
  }
  return out;
}

void quiet(ggml_log_level, const char*, void*) {}

}  // namespace

int main(int argc, char** argv) {
  const std::string mode = argc >= 3 ? argv[1] : "";
  if (!(mode == "template" || mode == "tok" || (mode == "eval" && argc == 5) || (mode == "dequant" && argc == 4))) {
    std::fprintf(stderr, "usage: %s template|tok MODEL | eval MODEL f16|f32 N | dequant IN OUT\n", argv[0]);
    return 2;
  }
  llama_log_set(quiet, nullptr);
  llama_backend_init();
  if (mode == "dequant") {
    llama_model_quantize_params p = llama_model_quantize_default_params();
    p.ftype = LLAMA_FTYPE_ALL_F32;
    p.allow_requantize = true;
    p.quantize_output_tensor = true;
    return static_cast<int>(llama_model_quantize(argv[2], argv[3], &p));
  }
  llama_model_params mp = llama_model_default_params();
  mp.vocab_only = mode != "eval";
  // No extra CPU buffer types (weight repacking, AMX): the AMX matmul of this llama.cpp crashes on these
  // quantized tensors with one thread; the plain CPU path computes the same products.
  mp.use_extra_bufts = false;
  llama_model* model = llama_model_load_from_file(argv[2], mp);
  if (model == nullptr) return 3;
  const llama_vocab* vocab = llama_model_get_vocab(model);
  if (mode == "template") {
    const char* t = llama_model_chat_template(model, nullptr);
    std::fputs(t != nullptr ? t : "", stdout);
    return 0;
  }
  if (mode == "tok") {
    for (std::string line; std::getline(std::cin, line);) {
      const std::size_t tab = line.find('\t');
      const std::string text = unescape(line.substr(tab + 1));
      std::vector<llama_token> ids(text.size() + 8);
      const int n = llama_tokenize(vocab, text.data(), static_cast<int32_t>(text.size()), ids.data(),
                                   static_cast<int32_t>(ids.size()), true, line.substr(0, tab) == "1");
      if (n < 0) return 4;
      for (int i = 0; i < n; ++i) std::printf(i > 0 ? " %d" : "%d", ids[static_cast<std::size_t>(i)]);
      std::printf("\n");
    }
    return 0;
  }
  const bool f32 = std::string(argv[3]) == "f32";
  const int n_gen = std::atoi(argv[4]);
  std::vector<llama_token> ids;
  for (llama_token t; std::cin >> t;) ids.push_back(t);
  llama_context_params cp = llama_context_default_params();
  cp.n_ctx = cp.n_batch = cp.n_ubatch = 4096;
  cp.n_threads = cp.n_threads_batch = 1;
  if (f32) cp.type_k = cp.type_v = GGML_TYPE_F32;
  cp.flash_attn_type = LLAMA_FLASH_ATTN_TYPE_DISABLED;  // attention as softmax(K Q) V, in the K / V cache's type
  llama_context* ctx = llama_init_from_model(model, cp);
  if (ctx == nullptr || ids.empty()) return 5;
  if (llama_decode(ctx, llama_batch_get_one(ids.data(), static_cast<int32_t>(ids.size()))) != 0) return 6;
  const int n_vocab = llama_vocab_n_tokens(vocab);
  const float* logits = llama_get_logits_ith(ctx, -1);
  std::vector<int> order(static_cast<std::size_t>(n_vocab));
  std::iota(order.begin(), order.end(), 0);
  std::partial_sort(order.begin(), order.begin() + 20, order.end(),
                    [&](int a, int b) { return logits[a] > logits[b]; });
  float max_abs = 0;
  for (int v = 0; v < n_vocab; ++v) max_abs = std::max(max_abs, std::fabs(logits[v]));
  std::printf("max_abs %.9g\n", static_cast<double>(max_abs));
  for (int i = 0; i < 20; ++i) std::printf("%d %.9g\n", order[i], static_cast<double>(logits[order[i]]));
  std::printf("greedy");
  llama_token next = order[0];
  for (int g = 0; g < n_gen; ++g) {
    std::printf(" %d", next);
    if (llama_vocab_is_eog(vocab, next)) break;
    if (llama_decode(ctx, llama_batch_get_one(&next, 1)) != 0) return 7;
    const float* l = llama_get_logits_ith(ctx, -1);
    next = static_cast<llama_token>(std::max_element(l, l + n_vocab) - l);
  }
  std::printf("\n");
  llama_free(ctx);
  llama_model_free(model);
  return 0;
}
