#pragma once
// ggml's block formats: what the bytes of a GGUF tensor of each quantized type mean, and their dequantization
// to fp32. The type numbers and block sizes are GGMLType / ggml_type_traits (model/ggml_type.hpp).
//
// Source of truth: ggml (ggml-org/llama.cpp) — the block layouts of ggml/src/ggml-common.h (block_q4_0 ...
// block_q6_K) and the reference dequantizers `dequantize_row_*` of ggml/src/ggml-quants.c. Every dequantizer
// here produces ggml's element order and performs ggml's fp32 operations in ggml's order (e.g. Q4_1: x*d + m,
// Q6_K: (d*scale)*q), so the results are bit-identical to ggml's and to the Python `gguf` package's
// `gguf.quants.dequantize`. Those round the product before adding the min; device code here does the same
// whatever nvcc's --fmad says (mul_add_rn), and so does host code unless the host compiler is allowed to fuse
// a*b + c into an FMA (GCC's default -ffp-contract=fast together with -mfma / -march=native): then Q4_1,
// Q5_1, Q2_K, Q4_K and Q5_K values can differ in the last bit. Default x86-64 builds have no FMA to fuse into.
//
// Everything is fmt-free and KVFUSE_HOST_DEVICE over raw little-endian bytes (no structs, no alignment
// assumptions, independent of the host's byte order), so a CUDA dequantization kernel runs these very
// functions. Bounds are the caller's job: kvfuse::GGUFFile (model/gguf.hpp) validates every size first.

#include <cstdint>

#include "kvfuse/core/config.hpp"
#include "kvfuse/core/dtype.hpp"
#include "kvfuse/model/ggml_type.hpp"

namespace kvfuse::detail {

// Little-endian loads from raw bytes.
KVFUSE_HOST_DEVICE std::uint16_t load_u16le(const std::uint8_t* p) {
  return static_cast<std::uint16_t>(p[0] | (p[1] << 8));
}
KVFUSE_HOST_DEVICE std::uint32_t load_u32le(const std::uint8_t* p) {
  return static_cast<std::uint32_t>(p[0]) | (static_cast<std::uint32_t>(p[1]) << 8) |
         (static_cast<std::uint32_t>(p[2]) << 16) | (static_cast<std::uint32_t>(p[3]) << 24);
}

// IEEE 754 binary16 -> binary32, exact for every input (normals, subnormals, signed zeros, infinities, NaNs
// with their payload): the storage conversion the kernels use (core/dtype.hpp).
KVFUSE_HOST_DEVICE float fp16_to_fp32(std::uint16_t h) { return kvfuse::to_float(kvfuse::f16{h}); }

// bfloat16 -> binary32: the top half of the fp32 bit pattern (ggml GGML_BF16_TO_FP32).
KVFUSE_HOST_DEVICE float bf16_to_fp32(std::uint16_t h) { return kvfuse::to_float(kvfuse::bf16{h}); }

KVFUSE_HOST_DEVICE float load_f16le(const std::uint8_t* p) { return fp16_to_fp32(load_u16le(p)); }

// a * b + c with the product rounded to float first, as ggml's reference C evaluates `x*d + m`.
KVFUSE_HOST_DEVICE float mul_add_rn(float a, float b, float c) {
#if defined(__CUDA_ARCH__)
  return __fadd_rn(__fmul_rn(a, b), c);  // never contracted into an FMA
#else
  return a * b + c;
#endif
}

// ---------------------------------------------------------------- one block -> block_size floats
// `x` points at one block (type_size bytes), `y` receives block_size floats.

KVFUSE_HOST_DEVICE void dequantize_block_f32(const std::uint8_t* x, float* y) { y[0] = bits_float(load_u32le(x)); }
KVFUSE_HOST_DEVICE void dequantize_block_f16(const std::uint8_t* x, float* y) { y[0] = load_f16le(x); }
KVFUSE_HOST_DEVICE void dequantize_block_bf16(const std::uint8_t* x, float* y) { y[0] = bf16_to_fp32(load_u16le(x)); }

// block_q4_0 {half d; u8 qs[16]}: y[j] = (lo(qs[j]) - 8) * d, y[j + 16] = (hi(qs[j]) - 8) * d.
KVFUSE_HOST_DEVICE void dequantize_block_q4_0(const std::uint8_t* x, float* y) {
  const float d = load_f16le(x);
  const std::uint8_t* qs = x + 2;
  for (int j = 0; j < 16; ++j) {
    const int x0 = (qs[j] & 0x0f) - 8;
    const int x1 = (qs[j] >> 4) - 8;
    y[j] = static_cast<float>(x0) * d;
    y[j + 16] = static_cast<float>(x1) * d;
  }
}

// block_q4_1 {half d; half m; u8 qs[16]}: y[j] = lo(qs[j]) * d + m, y[j + 16] = hi(qs[j]) * d + m.
KVFUSE_HOST_DEVICE void dequantize_block_q4_1(const std::uint8_t* x, float* y) {
  const float d = load_f16le(x);
  const float m = load_f16le(x + 2);
  const std::uint8_t* qs = x + 4;
  for (int j = 0; j < 16; ++j) {
    const int x0 = qs[j] & 0x0f;
    const int x1 = qs[j] >> 4;
    y[j] = mul_add_rn(static_cast<float>(x0), d, m);
    y[j + 16] = mul_add_rn(static_cast<float>(x1), d, m);
  }
}

// block_q5_0 {half d; u8 qh[4]; u8 qs[16]}: 5-bit quants, bit 4 of element j from bit j of qh; minus 16.
KVFUSE_HOST_DEVICE void dequantize_block_q5_0(const std::uint8_t* x, float* y) {
  const float d = load_f16le(x);
  const std::uint32_t qh = load_u32le(x + 2);
  const std::uint8_t* qs = x + 6;
  for (int j = 0; j < 16; ++j) {
    const int xh0 = static_cast<int>(((qh >> j) << 4) & 0x10u);
    const int xh1 = static_cast<int>((qh >> (j + 12)) & 0x10u);
    const int x0 = ((qs[j] & 0x0f) | xh0) - 16;
    const int x1 = ((qs[j] >> 4) | xh1) - 16;
    y[j] = static_cast<float>(x0) * d;
    y[j + 16] = static_cast<float>(x1) * d;
  }
}

// block_q5_1 {half d; half m; u8 qh[4]; u8 qs[16]}: 5-bit quants as q5_0, then q * d + m.
KVFUSE_HOST_DEVICE void dequantize_block_q5_1(const std::uint8_t* x, float* y) {
  const float d = load_f16le(x);
  const float m = load_f16le(x + 2);
  const std::uint32_t qh = load_u32le(x + 4);
  const std::uint8_t* qs = x + 8;
  for (int j = 0; j < 16; ++j) {
    const int xh0 = static_cast<int>(((qh >> j) << 4) & 0x10u);
    const int xh1 = static_cast<int>((qh >> (j + 12)) & 0x10u);
    const int x0 = (qs[j] & 0x0f) | xh0;
    const int x1 = (qs[j] >> 4) | xh1;
    y[j] = mul_add_rn(static_cast<float>(x0), d, m);
    y[j + 16] = mul_add_rn(static_cast<float>(x1), d, m);
  }
}

// block_q8_0 {half d; i8 qs[32]}: y[j] = qs[j] * d.
KVFUSE_HOST_DEVICE void dequantize_block_q8_0(const std::uint8_t* x, float* y) {
  const float d = load_f16le(x);
  for (int j = 0; j < 32; ++j) y[j] = static_cast<float>(static_cast<std::int8_t>(x[2 + j])) * d;
}

// block_q2_K {u8 scales[16]; u8 qs[64]; half d; half dmin}: 16 groups of 16; group scale d * (sc & 15),
// group min dmin * (sc >> 4); 2-bit quants, four groups share each byte of qs (shift 0, 2, 4, 6).
KVFUSE_HOST_DEVICE void dequantize_block_q2_k(const std::uint8_t* x, float* y) {
  const std::uint8_t* scales = x;
  const std::uint8_t* q = x + 16;
  const float d = load_f16le(x + 80);
  const float min = load_f16le(x + 82);
  int is = 0;
  for (int n = 0; n < 256; n += 128) {
    for (int shift = 0; shift < 8; shift += 2) {
      for (int half = 0; half < 2; ++half) {
        const std::uint8_t sc = scales[is++];
        const float dl = d * static_cast<float>(sc & 0xf);
        const float ml = min * static_cast<float>(sc >> 4);
        for (int l = 0; l < 16; ++l) {
          *y++ = mul_add_rn(dl, static_cast<float>((q[l + 16 * half] >> shift) & 3), -ml);
        }
      }
    }
    q += 32;
  }
}

// block_q3_K {u8 hmask[32]; u8 qs[64]; u8 scales[12]; half d}: 16 groups of 16 with signed 6-bit scales
// (low 4 bits in scales[0..7] nibbles, high 2 bits in scales[8..11]); 3-bit quants = 2 low bits from qs
// minus 4 unless the hmask bit is set.
KVFUSE_HOST_DEVICE void dequantize_block_q3_k(const std::uint8_t* x, float* y) {
  const std::uint8_t* hm = x;
  const std::uint8_t* q = x + 32;
  const std::uint8_t* s = x + 96;
  const float d_all = load_f16le(x + 108);
  int is = 0;
  std::uint8_t m = 1;
  for (int n = 0; n < 256; n += 128) {
    for (int shift = 0; shift < 8; shift += 2) {
      for (int half = 0; half < 2; ++half) {
        const int j = is++;
        const int low = j < 8 ? (s[j] & 0xf) : (s[j - 8] >> 4);
        const int high = (s[8 + j % 4] >> (2 * (j / 4))) & 3;
        const float dl = d_all * static_cast<float>((low | (high << 4)) - 32);
        for (int l = 0; l < 16; ++l) {
          const int k = l + 16 * half;
          *y++ = dl * static_cast<float>(((q[k] >> shift) & 3) - ((hm[k] & m) ? 0 : 4));
        }
      }
      m = static_cast<std::uint8_t>(m << 1);
    }
    q += 32;
  }
}

// The 6-bit scale and min of sub-block j (0..7) of a Q4_K / Q5_K block (ggml get_scale_min_k4).
KVFUSE_HOST_DEVICE void scale_min_k4(int j, const std::uint8_t* q, std::uint8_t& d, std::uint8_t& m) {
  if (j < 4) {
    d = q[j] & 63;
    m = q[j + 4] & 63;
  } else {
    d = static_cast<std::uint8_t>((q[j + 4] & 0xf) | ((q[j - 4] >> 6) << 4));
    m = static_cast<std::uint8_t>((q[j + 4] >> 4) | ((q[j] >> 6) << 4));
  }
}

// block_q4_K {half d; half dmin; u8 scales[12]; u8 qs[128]}: 8 sub-blocks of 32, y = d*sc * q - dmin*m; each
// 32 bytes of qs hold two sub-blocks (low nibbles first).
KVFUSE_HOST_DEVICE void dequantize_block_q4_k(const std::uint8_t* x, float* y) {
  const float d = load_f16le(x);
  const float min = load_f16le(x + 2);
  const std::uint8_t* scales = x + 4;
  const std::uint8_t* q = x + 16;
  for (int is = 0; is < 8; is += 2) {
    std::uint8_t sc = 0;
    std::uint8_t m = 0;
    scale_min_k4(is, scales, sc, m);
    const float d1 = d * static_cast<float>(sc);
    const float m1 = min * static_cast<float>(m);
    scale_min_k4(is + 1, scales, sc, m);
    const float d2 = d * static_cast<float>(sc);
    const float m2 = min * static_cast<float>(m);
    for (int l = 0; l < 32; ++l) *y++ = mul_add_rn(d1, static_cast<float>(q[l] & 0xf), -m1);
    for (int l = 0; l < 32; ++l) *y++ = mul_add_rn(d2, static_cast<float>(q[l] >> 4), -m2);
    q += 32;
  }
}

// block_q5_K {half d; half dmin; u8 scales[12]; u8 qh[32]; u8 qs[128]}: as Q4_K with a fifth bit per element
// from qh (bit 2*k for the low-nibble sub-block of pair k, bit 2*k+1 for the high one).
KVFUSE_HOST_DEVICE void dequantize_block_q5_k(const std::uint8_t* x, float* y) {
  const float d = load_f16le(x);
  const float min = load_f16le(x + 2);
  const std::uint8_t* scales = x + 4;
  const std::uint8_t* qh = x + 16;
  const std::uint8_t* ql = x + 48;
  std::uint8_t u1 = 1;
  std::uint8_t u2 = 2;
  for (int is = 0; is < 8; is += 2) {
    std::uint8_t sc = 0;
    std::uint8_t m = 0;
    scale_min_k4(is, scales, sc, m);
    const float d1 = d * static_cast<float>(sc);
    const float m1 = min * static_cast<float>(m);
    scale_min_k4(is + 1, scales, sc, m);
    const float d2 = d * static_cast<float>(sc);
    const float m2 = min * static_cast<float>(m);
    for (int l = 0; l < 32; ++l)
      *y++ = mul_add_rn(d1, static_cast<float>((ql[l] & 0xf) + ((qh[l] & u1) ? 16 : 0)), -m1);
    for (int l = 0; l < 32; ++l) *y++ = mul_add_rn(d2, static_cast<float>((ql[l] >> 4) + ((qh[l] & u2) ? 16 : 0)), -m2);
    ql += 32;
    u1 = static_cast<std::uint8_t>(u1 << 2);
    u2 = static_cast<std::uint8_t>(u2 << 2);
  }
}

// block_q6_K {u8 ql[128]; u8 qh[64]; i8 scales[16]; half d}: 16 groups of 16 with int8 scales; 6-bit quants
// (4 low bits from ql, 2 high bits from qh) minus 32; y = (d * scale) * q.
KVFUSE_HOST_DEVICE void dequantize_block_q6_k(const std::uint8_t* x, float* y) {
  const std::uint8_t* ql = x;
  const std::uint8_t* qh = x + 128;
  const std::uint8_t* sc = x + 192;
  const float d = load_f16le(x + 208);
  for (int n = 0; n < 256; n += 128) {
    for (int l = 0; l < 32; ++l) {
      const int is = l / 16;
      const int q1 = ((ql[l] & 0xf) | (((qh[l] >> 0) & 3) << 4)) - 32;
      const int q2 = ((ql[l + 32] & 0xf) | (((qh[l] >> 2) & 3) << 4)) - 32;
      const int q3 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
      const int q4 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
      y[l] = d * static_cast<float>(static_cast<std::int8_t>(sc[is])) * static_cast<float>(q1);
      y[l + 32] = d * static_cast<float>(static_cast<std::int8_t>(sc[is + 2])) * static_cast<float>(q2);
      y[l + 64] = d * static_cast<float>(static_cast<std::int8_t>(sc[is + 4])) * static_cast<float>(q3);
      y[l + 96] = d * static_cast<float>(static_cast<std::int8_t>(sc[is + 6])) * static_cast<float>(q4);
    }
    y += 128;
    ql += 64;
    qh += 32;
    sc += 8;
  }
}

// Dequantizes one block of `type` (see dequantize_block_*). Returns false, writing nothing, when the type is
// not dequantizable (ggml_type_traits(type).dequantizable).
KVFUSE_HOST_DEVICE bool dequantize_block(GGMLType type, const std::uint8_t* x, float* y) {
  switch (type) {
    case GGMLType::f32: dequantize_block_f32(x, y); return true;
    case GGMLType::f16: dequantize_block_f16(x, y); return true;
    case GGMLType::bf16: dequantize_block_bf16(x, y); return true;
    case GGMLType::q4_0: dequantize_block_q4_0(x, y); return true;
    case GGMLType::q4_1: dequantize_block_q4_1(x, y); return true;
    case GGMLType::q5_0: dequantize_block_q5_0(x, y); return true;
    case GGMLType::q5_1: dequantize_block_q5_1(x, y); return true;
    case GGMLType::q8_0: dequantize_block_q8_0(x, y); return true;
    case GGMLType::q2_k: dequantize_block_q2_k(x, y); return true;
    case GGMLType::q3_k: dequantize_block_q3_k(x, y); return true;
    case GGMLType::q4_k: dequantize_block_q4_k(x, y); return true;
    case GGMLType::q5_k: dequantize_block_q5_k(x, y); return true;
    case GGMLType::q6_k: dequantize_block_q6_k(x, y); return true;
    default: return false;
  }
}

// Dequantizes `n_blocks` consecutive blocks of `type` from `x` into `y` (n_blocks * block_size floats), in
// ggml's element order (ggml dequantize_row_*). Returns false, writing nothing, when the type is not
// dequantizable. The caller guarantees n_blocks * type_size readable bytes and room for the floats.
KVFUSE_HOST_DEVICE bool dequantize_blocks(GGMLType type, const std::uint8_t* x, std::int64_t n_blocks, float* y) {
  const GGMLTypeTraits traits = ggml_type_traits(type);
  if (!traits.dequantizable) return false;
  for (std::int64_t b = 0; b < n_blocks; ++b)
    dequantize_block(type, x + b * traits.type_size, y + b * traits.block_size);
  return true;
}

}  // namespace kvfuse::detail
