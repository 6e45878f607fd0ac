// kvfuse-logits: runs the reference CPU backend (CpuLlama) on one prompt and writes its logits, for
// conformance checks against other implementations (scripts/conformance.py compares with llama.cpp).
//
//   kvfuse-logits --model GGUF (--ids "1,2,3" | --text "..." [--chat]) [--out FILE.f32]
//                 [--last | --stride K] [--generate N] [--threads T] [--tokenize]
//
//   --ids       token ids, comma-separated (no tokenizer involved)
//   --text      UTF-8 text, tokenized by kvfuse's Tokenizer with control-token text parsed ("<|im_start|>"
//               becomes that token); BOS is prepended when the vocabulary says add_bos
//   --chat      wrap --text as one user message in the model's chat template with the generation prompt
//               (the template's default system message included)
//   --out       raw little-endian float32 logits, [rows][n_vocab], rows = the positions listed on stdout
//   --last      only the last position (the logits full prefill returns)
//   --stride K  positions n-1, n-1-K, n-1-2K, ... (written in ascending order); default 1 = every position
//   --generate  greedy continuation of N tokens (stops early at the vocabulary's EOS)
//   --threads   worker threads of the backend (default 0: one per hardware thread)
//   --tokenize  print the token ids and stop (no forward pass)
//
// stdout, one "key: value" line each: model, n_tokens, ids, positions, logits (file), prefill_s,
// generated_ids, generated_text (a JSON string). Errors (bad flags, paths, models, token ids) print
// "kvfuse-logits: <message>" to stderr and exit with status 2.
//
// How the logits of every position are obtained: full_prefill gives the KV of all n tokens and the logits of
// the last one. CpuLlama returns logits for one row per call, so the logits of position i < n-1 come from a
// partial_prefill that recomputes only row i, on every layer, against the full-prefill KV of rows 0 .. i-1
// (the cache truncated to i+1 rows, walking i downwards) — the computation full prefill does for row i, as a
// single-row pass. The exactness of that identity (partial prefill == full prefill) is tested in
// tests/unit/cpu_llama.cpp. Cost: one pass over the weights per position, so --stride helps on long prompts.

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <fstream>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "kvfuse/cpu.hpp"

namespace {

constexpr std::string_view kUsage =
    "usage: kvfuse-logits --model GGUF (--ids \"1,2,3\" | --text \"...\" [--chat]) [--out FILE.f32]\n"
    "                     [--last | --stride K] [--generate N] [--threads T] [--tokenize]";

struct Args {
  std::string model;
  std::string ids;
  std::string text;
  bool has_ids = false;
  bool has_text = false;
  bool chat = false;
  std::string out;
  bool last = false;
  std::int64_t stride = 1;
  std::int64_t generate = 0;
  int threads = 0;
  bool tokenize_only = false;
};

// A whole decimal integer in [lo, hi]; `what` names it in the error.
std::int64_t parse_int(std::string_view s, std::int64_t lo, std::int64_t hi, std::string_view what) {
  std::size_t i = 0;
  while (i < s.size() && (s[i] == ' ' || s[i] == '\t')) ++i;
  std::size_t e = s.size();
  while (e > i && (s[e - 1] == ' ' || s[e - 1] == '\t')) --e;
  const std::string_view body = s.substr(i, e - i);
  bool ok = !body.empty();
  std::int64_t value = 0;
  for (std::size_t k = 0; ok && k < body.size(); ++k) {
    const char c = body[k];
    if (k == 0 && c == '-' && body.size() > 1) continue;
    if (c < '0' || c > '9' || value > (std::int64_t{1} << 40)) {
      ok = false;
      break;
    }
    value = value * 10 + (c - '0');
  }
  if (ok && body[0] == '-') value = -value;
  kvfuse::require(ok && value >= lo && value <= hi, "{} '{}' is not an integer in [{}, {}]", what, s, lo, hi);
  return value;
}

std::vector<kvfuse::token_id> parse_ids(std::string_view list) {
  std::vector<kvfuse::token_id> ids;
  std::size_t start = 0;
  for (;;) {
    const std::size_t comma = list.find(',', start);
    const std::string_view item = list.substr(start, comma == std::string_view::npos ? list.npos : comma - start);
    ids.push_back(
        static_cast<kvfuse::token_id>(parse_int(item, 0, INT32_MAX, fmt::format("--ids: item {}", ids.size()))));
    if (comma == std::string_view::npos) break;
    start = comma + 1;
  }
  return ids;
}

Args parse_args(int argc, char** argv) {
  Args a;
  const auto value = [&](int& i, std::string_view flag) -> std::string {
    kvfuse::require(i + 1 < argc, "{} needs a value\n{}", flag, kUsage);
    return argv[++i];
  };
  for (int i = 1; i < argc; ++i) {
    const std::string_view f = argv[i];
    if (f == "--model") {
      a.model = value(i, f);
    } else if (f == "--ids") {
      a.ids = value(i, f);
      a.has_ids = true;
    } else if (f == "--text") {
      a.text = value(i, f);
      a.has_text = true;
    } else if (f == "--chat") {
      a.chat = true;
    } else if (f == "--out") {
      a.out = value(i, f);
    } else if (f == "--last") {
      a.last = true;
    } else if (f == "--stride") {
      a.stride = parse_int(value(i, f), 1, INT32_MAX, "--stride");
    } else if (f == "--generate") {
      a.generate = parse_int(value(i, f), 0, 1 << 20, "--generate");
    } else if (f == "--threads") {
      a.threads = static_cast<int>(parse_int(value(i, f), 0, 1024, "--threads"));
    } else if (f == "--tokenize") {
      a.tokenize_only = true;
    } else if (f == "--help" || f == "-h") {
      fmt::print("{}\n", kUsage);
      std::exit(0);
    } else {
      kvfuse::require(false, "unknown flag '{}'\n{}", f, kUsage);
    }
  }
  kvfuse::require(!a.model.empty(), "--model is required\n{}", kUsage);
  kvfuse::require(a.has_ids != a.has_text, "give exactly one of --ids and --text\n{}", kUsage);
  kvfuse::require(!a.chat || a.has_text, "--chat needs --text");
  kvfuse::require(!(a.last && a.stride != 1), "--last and --stride {} exclude each other", a.stride);
  return a;
}

// A JSON string literal of UTF-8 text (control characters escaped).
std::string json_string(std::string_view s) {
  constexpr std::string_view plain = "\"\\\n\r\t";  // escaped as \" \\ \n \r \t
  constexpr std::string_view named = "\"\\nrt";
  std::string out = "\"";
  for (const char c : s) {
    if (const std::size_t k = plain.find(c); k != std::string_view::npos) {
      out += '\\';
      out += named[k];
    } else if (static_cast<unsigned char>(c) < 0x20) {
      out += fmt::format("\\u{:04x}", static_cast<unsigned>(static_cast<unsigned char>(c)));
    } else {
      out += c;
    }
  }
  return out + "\"";
}

void write_row(std::ofstream& out, std::span<const float> row, const std::string& path) {
  out.write(reinterpret_cast<const char*>(row.data()), static_cast<std::streamsize>(row.size_bytes()));
  kvfuse::require(static_cast<bool>(out), "--out: writing '{}' failed", path);
}

int run(const Args& a) {
  const kvfuse::GGUFFile file = kvfuse::GGUFFile::open(a.model);
  const kvfuse::Tokenizer tok = kvfuse::Tokenizer::from_gguf(file);

  std::vector<kvfuse::token_id> ids;
  if (a.has_ids) {
    ids = parse_ids(a.ids);
  } else {
    std::string text = a.text;
    if (a.chat) {
      kvfuse::require(!tok.chat_template().empty(), "--chat: {} has no chat template (a base model)",
                              a.model);
      const std::vector<kvfuse::ChatMessage> messages{{"user", a.text}};
      text = tok.format_chat(messages, /*add_generation_prompt=*/true);
    }
    if (tok.add_bos()) ids.push_back(tok.bos());
    const std::vector<kvfuse::token_id> body = tok.encode(text);
    ids.insert(ids.end(), body.begin(), body.end());
  }
  kvfuse::require(!ids.empty(), "the prompt has no tokens");
  const auto n = static_cast<std::int64_t>(ids.size());
  fmt::print("model: {}\nn_tokens: {}\nids: {}\n", a.model, n, fmt::join(ids, ","));
  if (a.tokenize_only) return 0;

  const kvfuse::CpuLlama model = kvfuse::CpuLlama::from_gguf(file, {.threads = a.threads});

  // Rows to write, ascending: n-1, n-1-stride, ... (only n-1 with --last).
  std::vector<std::int64_t> rows;
  for (std::int64_t i = n - 1; i >= 0; i -= a.last ? n : a.stride) rows.push_back(i);
  std::reverse(rows.begin(), rows.end());
  fmt::print("positions: {}\n", fmt::join(rows, ","));

  const auto t0 = std::chrono::steady_clock::now();
  kvfuse::LlamaPrefill prefill = model.full_prefill(ids);
  const double prefill_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  fmt::print("prefill_s: {:.3f}\n", prefill_s);

  const std::vector<kvfuse::token_id> generated =
      model.greedy_decode(prefill.kv, prefill.logits, a.generate, tok.eos());  // appends rows after row n-1

  if (!a.out.empty()) {
    std::ofstream out(a.out, std::ios::binary | std::ios::trunc);
    kvfuse::require(static_cast<bool>(out), "--out: cannot open '{}' for writing", a.out);
    const auto vocab = static_cast<std::size_t>(model.config().n_vocab);
    // Row j of the file sits at byte j * vocab * 4; rows are computed last first.
    const auto put = [&](std::size_t j, std::span<const float> logits) {
      out.seekp(static_cast<std::streamoff>(j * vocab * sizeof(float)));
      write_row(out, logits, a.out);
    };
    put(rows.size() - 1, prefill.logits);
    kvfuse::LlamaKVCache& kv = prefill.kv;
    // Walk i downwards, truncating the cache to rows 0 .. i: row i is recomputed against rows < i only.
    for (std::size_t j = rows.size() - 1; j-- > 0;) {
      const std::int64_t i = rows[j];
      kv.positions.resize(static_cast<std::size_t>(i + 1));
      for (std::size_t l = 0; l < kv.k.size(); ++l) {
        kv.k[l].resize(static_cast<std::size_t>((i + 1) * kv.kv_dim));
        kv.v[l].resize(static_cast<std::size_t>((i + 1) * kv.kv_dim));
      }
      const kvfuse::PartialPrefillResult r = model.partial_prefill(
          std::span<const kvfuse::token_id>(ids).first(static_cast<std::size_t>(i + 1)), kv, kvfuse::TokenSet{i}, {});
      put(j, r.logits);
    }
    fmt::print("logits: {} ({} x {} float32)\n", a.out, rows.size(), vocab);
  }

  fmt::print("generated_ids: {}\n", fmt::join(generated, ","));
  fmt::print("generated_text: {}\n", json_string(tok.decode(generated)));
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(parse_args(argc, argv));
  } catch (const kvfuse::error& e) {
    std::fflush(stdout);
    fmt::print(stderr, "kvfuse-logits: {}\n", e.what());
    return 2;
  } catch (const std::exception& e) {
    std::fflush(stdout);
    fmt::print(stderr, "kvfuse-logits: {}\n", e.what());
    return 1;
  }
}
