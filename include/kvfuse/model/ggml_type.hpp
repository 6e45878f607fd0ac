#pragma once
// GGMLType: the tensor types of ggml and GGUF files, with each type's name, block size and bytes per block.
//
// Source of truth: ggml (ggml-org/llama.cpp) — the type numbering of `enum ggml_type` in ggml/include/ggml.h
// and the block and byte sizes of `type_traits` in ggml/src/ggml.c (the Python `gguf` package's
// GGML_QUANT_SIZES). The numbers are the ones a GGUF tensor info stores.
//
// fmt-free and KVFUSE_HOST_DEVICE, so the dequantizers of model/ggml_quant.hpp (shared with CUDA kernels)
// use this very table.

#include <cstdint>

#include "kvfuse/core/config.hpp"

namespace kvfuse {

// ggml's type numbers (ggml.h `enum ggml_type`); gaps are numbers ggml retired (4, 5, 31-33, 36-38). A value
// read from a file may be any number: ggml_type_traits tells which ones are types.
enum class GGMLType : std::uint32_t {
  f32 = 0,
  f16 = 1,
  q4_0 = 2,
  q4_1 = 3,
  q5_0 = 6,
  q5_1 = 7,
  q8_0 = 8,
  q8_1 = 9,
  q2_k = 10,
  q3_k = 11,
  q4_k = 12,
  q5_k = 13,
  q6_k = 14,
  q8_k = 15,
  iq2_xxs = 16,
  iq2_xs = 17,
  iq3_xxs = 18,
  iq1_s = 19,
  iq4_nl = 20,
  iq3_s = 21,
  iq2_s = 22,
  iq4_xs = 23,
  i8 = 24,
  i16 = 25,
  i32 = 26,
  i64 = 27,
  f64 = 28,
  iq1_m = 29,
  bf16 = 30,
  tq1_0 = 34,
  tq2_0 = 35,
  mxfp4 = 39,
  nvfp4 = 40,
  q1_0 = 41,
};

// Per type: ggml's name ("Q4_1"), elements per block, bytes per block, and whether kvfuse dequantizes it
// (detail::dequantize_blocks, GGUFFile::dequantize). name == nullptr marks a number that is no ggml type.
struct GGMLTypeTraits {
  const char* name;
  std::int64_t block_size;
  std::int64_t type_size;
  bool dequantizable;
};

// Block sizes and byte sizes as in ggml's type_traits (ggml.c) / gguf-py GGML_QUANT_SIZES.
KVFUSE_HOST_DEVICE GGMLTypeTraits ggml_type_traits(GGMLType type) {
  switch (type) {
    case GGMLType::f32: return {"F32", 1, 4, true};
    case GGMLType::f16: return {"F16", 1, 2, true};
    case GGMLType::q4_0: return {"Q4_0", 32, 18, true};
    case GGMLType::q4_1: return {"Q4_1", 32, 20, true};
    case GGMLType::q5_0: return {"Q5_0", 32, 22, true};
    case GGMLType::q5_1: return {"Q5_1", 32, 24, true};
    case GGMLType::q8_0: return {"Q8_0", 32, 34, true};
    case GGMLType::q8_1: return {"Q8_1", 32, 40, false};
    case GGMLType::q2_k: return {"Q2_K", 256, 84, true};
    case GGMLType::q3_k: return {"Q3_K", 256, 110, true};
    case GGMLType::q4_k: return {"Q4_K", 256, 144, true};
    case GGMLType::q5_k: return {"Q5_K", 256, 176, true};
    case GGMLType::q6_k: return {"Q6_K", 256, 210, true};
    case GGMLType::q8_k: return {"Q8_K", 256, 292, false};
    case GGMLType::iq2_xxs: return {"IQ2_XXS", 256, 66, false};
    case GGMLType::iq2_xs: return {"IQ2_XS", 256, 74, false};
    case GGMLType::iq3_xxs: return {"IQ3_XXS", 256, 98, false};
    case GGMLType::iq1_s: return {"IQ1_S", 256, 50, false};
    case GGMLType::iq4_nl: return {"IQ4_NL", 32, 18, false};
    case GGMLType::iq3_s: return {"IQ3_S", 256, 110, false};
    case GGMLType::iq2_s: return {"IQ2_S", 256, 82, false};
    case GGMLType::iq4_xs: return {"IQ4_XS", 256, 136, false};
    case GGMLType::i8: return {"I8", 1, 1, false};
    case GGMLType::i16: return {"I16", 1, 2, false};
    case GGMLType::i32: return {"I32", 1, 4, false};
    case GGMLType::i64: return {"I64", 1, 8, false};
    case GGMLType::f64: return {"F64", 1, 8, false};
    case GGMLType::iq1_m: return {"IQ1_M", 256, 56, false};
    case GGMLType::bf16: return {"BF16", 1, 2, true};
    case GGMLType::tq1_0: return {"TQ1_0", 256, 54, false};
    case GGMLType::tq2_0: return {"TQ2_0", 256, 66, false};
    case GGMLType::mxfp4: return {"MXFP4", 32, 17, false};
    case GGMLType::nvfp4: return {"NVFP4", 64, 36, false};
    case GGMLType::q1_0: return {"Q1_0", 128, 18, false};
  }
  return {nullptr, 0, 0, false};
}

}  // namespace kvfuse
