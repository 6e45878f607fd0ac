#pragma once
// Rotary position embedding (RoPE; Su et al., "RoFormer: Enhanced Transformer with Rotary Position
// Embedding", §3.2.2): the pairing of a head's elements, the frequency settings of a model, and the ONE
// function that computes the frequencies θ_i. The CPU Llama backend (backend/cpu/llama.hpp) and the RoPE
// kernels and their CPU references (kernel_args/rope.hpp, kvfuse/cuda/rope.cuh) all take their θ_i from it; the
// element math that rotates with them is detail/rope.hpp.
//
// Pair i of a head of dimension d is rotated by the angle p · θ_i at position p:
//   θ_i = base^(−2i/d) / freq_factor_i, then scaled (RopeScaling), i = 0 .. d/2 − 1,
//   (a, b) -> (a cos φ − b sin φ,  a sin φ + b cos φ).
//
// fmt-free and CUDA-free (printf-style refusals, core/status.hpp): CUDA translation units include it.

#include <cmath>
#include <cstdint>
#include <cstring>

#include "kvfuse/core/status.hpp"

namespace kvfuse {

// Which elements of a head form pair i.
enum class RopePairing : int {
  // (x[2i], x[2i+1]): llama.cpp LLAMA_ROPE_TYPE_NORM, what GGUF Llama models use. The HF→GGUF converter
  // permutes the rows of W_q and W_k so that this pairing on GGUF weights equals half_split on HF weights.
  interleaved = 0,
  // (x[i], x[i + d/2]): "neox" / Hugging Face rotate_half (LLAMA_ROPE_TYPE_NEOX).
  half_split = 1,
};

// Frequency scaling of the θ_i (HF config.json rope_scaling.rope_type).
enum class RopeScaling : int {
  none = 0,    // θ_i = base^(−2i/d)                          ("default")
  linear = 1,  // θ_i / factor                                ("linear", position interpolation)
  llama3 = 2,  // Llama 3.1 wavelength-dependent scaling      ("llama3")
};

// Settings of the θ table, as a model's config states them.
struct RopeFrequencyConfig {
  std::int64_t head_dim = 128;
  std::int64_t rotary_dim = 0;  // 0 = head_dim; anything else (partial rotary) is refused: unsupported
  double base = 10000.0;        // rope_theta (GGUF {arch}.rope.freq_base)
  RopeScaling scaling = RopeScaling::none;
  double factor = 1.0;                    // linear, llama3 (Llama 3.1: 8)
  double low_freq_factor = 1.0;           // llama3 (Llama 3.1: 1)
  double high_freq_factor = 4.0;          // llama3 (Llama 3.1: 4)
  double original_max_position = 8192.0;  // llama3: original_max_position_embeddings (Llama 3.1: 8192)
  // head_dim / 2 per-pair divisors of θ_i (GGUF tensor rope_freqs.weight, in which llama.cpp's converter
  // stores Llama 3.1's scaling), or nullptr for none. Not combined with RopeScaling::llama3.
  const float* freq_factors = nullptr;
};

// Maps an HF rope_scaling.rope_type to RopeScaling: "default" (or "" / "none") → none, "linear",
// "llama3"; any other name ("yarn", "dynamic", "longrope", ...) is refused: unsupported.
[[nodiscard]] inline Status rope_scaling_from_name(const char* name, RopeScaling& scaling) noexcept {
  if (name == nullptr) return refuse(Status::invalid_argument, "rope: scaling type name is null");
  if (std::strcmp(name, "default") == 0 || std::strcmp(name, "none") == 0 || name[0] == '\0') {
    scaling = RopeScaling::none;
  } else if (std::strcmp(name, "linear") == 0) {
    scaling = RopeScaling::linear;
  } else if (std::strcmp(name, "llama3") == 0) {
    scaling = RopeScaling::llama3;
  } else {
    return refuse(Status::unsupported, "rope: scaling type \"%s\" is not supported (default, linear, llama3)", name);
  }
  return Status::success;
}

namespace rope_checks {

[[nodiscard]] inline bool positive_finite(double v) noexcept { return std::isfinite(v) && v > 0; }

}  // namespace rope_checks

// THE frequency table: fills theta[0 .. head_dim/2) with
//   θ_i = base^(−2i/d) / freq_factor_i, then scaled, in double.
// linear divides by factor. llama3 is Meta's Llama 3.1 apply_scaling (HF _compute_llama3_parameters): with
// wavelength λ_i = 2π/θ_i, λ_low = original_max_position / low_freq_factor, λ_high = original_max_position /
// high_freq_factor:  λ_i < λ_high → θ_i;  λ_i > λ_low → θ_i / factor;  otherwise, with
// s = (original_max_position / λ_i − low_freq_factor) / (high_freq_factor − low_freq_factor),
// (1 − s)·θ_i / factor + s·θ_i.
// The CPU backend uses these doubles as they are (detail::rope_cos_sin); the kernels round them to float
// once (the float overload in kernel_args/rope.hpp). Any positive even head_dim. Refuses partial rotary and
// unknown scaling (unsupported) and bad values (invalid_argument); writes nothing then.
[[nodiscard]] inline Status rope_frequencies(const RopeFrequencyConfig& c, double* theta) noexcept {
  if (c.head_dim <= 0 || c.head_dim % 2 != 0)
    return refuse(Status::invalid_argument, "rope_frequencies: head_dim %lld is not a positive even number",
                  static_cast<long long>(c.head_dim));
  if (c.rotary_dim != 0 && c.rotary_dim != c.head_dim)
    return refuse(Status::unsupported,
                  "rope_frequencies: partial rotary (rotary_dim %lld of head_dim %lld) is not supported",
                  static_cast<long long>(c.rotary_dim), static_cast<long long>(c.head_dim));
  if (theta == nullptr) return refuse(Status::invalid_argument, "rope_frequencies: theta pointer is null");
  if (!rope_checks::positive_finite(c.base))
    return refuse(Status::invalid_argument, "rope_frequencies: base %g is not a positive finite number", c.base);
  switch (c.scaling) {
    case RopeScaling::none: break;
    case RopeScaling::linear:
      if (!rope_checks::positive_finite(c.factor))
        return refuse(Status::invalid_argument, "rope_frequencies: linear scaling factor %g is not positive", c.factor);
      break;
    case RopeScaling::llama3:
      if (!rope_checks::positive_finite(c.factor))
        return refuse(Status::invalid_argument, "rope_frequencies: llama3 factor %g is not positive", c.factor);
      if (!rope_checks::positive_finite(c.low_freq_factor) || !rope_checks::positive_finite(c.high_freq_factor) ||
          !(c.high_freq_factor > c.low_freq_factor))
        return refuse(Status::invalid_argument,
                      "rope_frequencies: llama3 low_freq_factor %g and high_freq_factor %g must be positive and "
                      "increasing",
                      c.low_freq_factor, c.high_freq_factor);
      if (!rope_checks::positive_finite(c.original_max_position))
        return refuse(Status::invalid_argument, "rope_frequencies: llama3 original_max_position %g is not positive",
                      c.original_max_position);
      if (c.freq_factors != nullptr)
        return refuse(Status::invalid_argument,
                      "rope_frequencies: llama3 scaling with freq_factors would scale twice (rope_freqs.weight "
                      "already holds Llama 3.1's scaling)");
      break;
    default:
      return refuse(Status::unsupported, "rope_frequencies: unknown scaling type %d", static_cast<int>(c.scaling));
  }
  const std::int64_t pairs = c.head_dim / 2;
  if (c.freq_factors != nullptr) {
    for (std::int64_t i = 0; i < pairs; ++i)
      if (!rope_checks::positive_finite(static_cast<double>(c.freq_factors[i])))
        return refuse(Status::invalid_argument, "rope_frequencies: freq_factors[%lld] = %g is not a positive finite "
                      "number", static_cast<long long>(i), static_cast<double>(c.freq_factors[i]));
  }
  for (std::int64_t i = 0; i < pairs; ++i) {
    double t = std::pow(c.base, -2.0 * static_cast<double>(i) / static_cast<double>(c.head_dim));
    if (c.freq_factors != nullptr) t /= static_cast<double>(c.freq_factors[i]);
    if (c.scaling == RopeScaling::linear) {
      t /= c.factor;
    } else if (c.scaling == RopeScaling::llama3) {
      constexpr double two_pi = 6.283185307179586476925;
      const double wavelength = two_pi / t;
      const double low_wavelength = c.original_max_position / c.low_freq_factor;
      const double high_wavelength = c.original_max_position / c.high_freq_factor;
      if (wavelength > low_wavelength) {
        t /= c.factor;
      } else if (wavelength >= high_wavelength) {
        const double s = (c.original_max_position / wavelength - c.low_freq_factor) /
                         (c.high_freq_factor - c.low_freq_factor);
        t = (1.0 - s) * t / c.factor + s * t;
      }
    }
    theta[i] = t;
  }
  return Status::success;
}

}  // namespace kvfuse
