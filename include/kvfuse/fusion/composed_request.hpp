#pragma once
// run_composed: one request served by Cake and a fusion method together. A prompt is
// [stored exact prefix] + [reused chunks] + [query]: the longest exact prefix in the store (Cake's prefix
// entries, FusionPipeline::store_prefix), cut back to a chunk boundary, is prepared by Cake's bidirectional
// loader (Cake §4: compute from the front while loading from the back, on two threads, run_threaded); the
// chunks after it are assembled by the fusion method (FusionPipeline::run_after_prefix: CacheBlend, Epic's
// AttnLink, Cache-Craft, ...), whose recomputed rows never include the exact prefix. With FullRecompute the
// result is full prefill, whatever split Cake chose.
//
// The engine models a fusion backend (fusion/fusion_backend.hpp) and ComputeBackend (backend/concepts.hpp) on
// the same request KV; CpuLlamaFusion does. Not thread-safe: one request at a time per pipeline and engine.

#include <cstdint>
#include <span>

#include "kvfuse/backend/concepts.hpp"
#include "kvfuse/core/prompt.hpp"
#include "kvfuse/core/types.hpp"
#include "kvfuse/fusion/fusion_method.hpp"
#include "kvfuse/fusion/fusion_pipeline.hpp"
#include "kvfuse/schedule/bidirectional_loader.hpp"
#include "kvfuse/schedule/threaded_loader.hpp"

namespace kvfuse {

// Everything one composed request decided, as plain data.
struct ComposedResult {
  std::int64_t exact_prefix = 0;  // rows Cake prepared: the stored prefix cut back to a chunk boundary
  LoaderTrace prefix;             // Cake: which of them were computed and which loaded, and when
  FusionResult fusion;            // the fusion method on the rest: plan, logits, |S_l|, timings

  // Time to the first token: Cake's wall time, then the fusion method's online steps.
  [[nodiscard]] double ttft_ms() const noexcept { return prefix.ready_s * 1e3 + fusion.time.ttft_ms(); }
};

template <class Backend, KVStore Store>
  requires ComputeBackend<Backend>
ComposedResult run_composed(FusionPipeline<Backend, Store>& pipeline, std::span<const token_id> tokens,
                            const PromptLayout& layout, const FusionMethod& method, const LoaderConfig& cake) {
  layout.validate();
  detail::require(layout.num_tokens() == static_cast<std::int64_t>(tokens.size()),
                  "run_composed: the layout covers {} tokens but the prompt has {}", layout.num_tokens(), tokens.size());
  Backend& engine = pipeline.backend();
  ComposedResult out;
  engine.begin(tokens);
  const BidirectionalLoader<Backend, Store> loader(cake);
  const std::int64_t stored = loader.stored_prefix(engine, pipeline.store(), tokens);
  for (const PromptChunk& c : layout.chunks)
    if (c.range.end <= stored) out.exact_prefix = c.range.end;
  if (out.exact_prefix > 0)
    out.prefix = run_threaded(loader, engine, pipeline.store(), tokens.first(static_cast<std::size_t>(out.exact_prefix)));
  out.fusion = pipeline.run_after_prefix(tokens, layout, method, out.exact_prefix);
  return out;
}

}  // namespace kvfuse
