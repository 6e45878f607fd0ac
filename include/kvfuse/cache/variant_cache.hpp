#pragma once
// VariantCache — Cache-Craft's metadata store of chunk-cache variants: lookup by lowest CFO, f_r eviction.
//
// What it does: a chunk may have several stored KV "variants", each computed behind a different prefix
// (section 3.3, Fig. 18). The cache maps a chunk's content hash to its variants; each variant keeps the
// ChunkProfile computed by CCIScorer (stored prefix with its inter attention, CCI, ordered recompute-token
// list) and the KVKey under which the engine's KVStore holds its KV bytes (the cache owns no KV).
//   lookup(chunk, current prefix, scoring): scores every variant against the current prefix (β, γ, β', CFO:
//     eq. 6-8, 12, with the CCIScorerConfig of the method asking, CacheCraft::scoring: α, prefix coverage) and
//     returns the one with the lowest CFO with its N = ⌈CFO · |C|⌉ tokens to recompute (eq. 14);
//     the chosen variant's reuse frequency grows by f_r += 1/CFO.
//   insert(profile, kv): adds a variant for a new (chunk, prefix) pair; when the cache holds N × M variants
//     the variant with the lowest f_r is evicted first and returned so the engine can erase its KV.
// Paper: Cache-Craft ("Managing Chunk-Caches for Efficient Retrieval-Augmented Generation", SIGMOD 2025),
// section 3.3; CFO from sections 3.1-3.2.
//
// When to use: with CCIScorer, to keep the most reusable chunk-caches of a RAG workload under a fixed
// budget of stored KV instances. Use a plain prefix cache (vLLM-style) when prompts share exact prefixes.
//
// Defaults from the paper: N = 100 chunks, M = 5 variants (section 5.1, "Cache Storage").
// The paper's limit is N × M instances in total ("from one popular chunk with N × M variants to N × M
// chunks, each with a single variant"), so by default M does not cap a single chunk; set
// cap_variants_per_chunk to also hold every chunk to M variants (then a chunk's own lowest-f_r variant makes
// room for its new one).
//
// Decisions where the paper leaves room:
//  - f_r starts at 0. CFO = 0 (exact prefix match, or α = 0) would make 1/CFO infinite: the increment is
//    min(1/CFO, max_reuse_bonus), so a perfect match earns the capped bonus (default 1000, i.e. as much as
//    a match that recomputes 0.1 % of the chunk).
//  - Eviction happens on insert (the paper evicts "periodically"); the victim is the lowest f_r, ties to the
//    oldest variant (smallest id). A new variant is always admitted.
//  - No grace period (section 3.3 gives none): a new variant enters with f_r = 0, and every lookup that
//    chooses a variant adds min(1/CFO, max_reuse_bonus) > 0, so until a lookup first chooses it, a new
//    variant is the next eviction victim (after older never-chosen variants). Inserting into a full cache
//    thus evicts unused variants before any variant that was ever reused.
//  - The variant is chosen by CCI · (1 − β') (the CFO at α = 1: the same order for every α > 0, and still a
//    choice at α = 0, where every CFO is 0); ties go to the oldest variant. A variant for a (chunk, stored prefix) pair that is
//    already stored is not added again (the paper adds variants for a "unique chunk and prefix").
//  - f_r uses the same CFO as the token count (eq. 12, with α); section 3.3 writes CFO without α, which
//    picks the same variant.
//
// Thread safety: internally synchronized: every member may be called from any number of threads. lookup() chooses
// and records its access in one step; insert() evicts and admits in one step.

#include <algorithm>
#include <cstdint>
#include <limits>
#include <mutex>
#include <optional>
#include <span>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "kvfuse/core/error.hpp"
#include "kvfuse/core/types.hpp"
#include "kvfuse/select/cci_scorer.hpp"

namespace kvfuse {

struct VariantCacheConfig {
  std::int64_t num_chunks = 100;         // N (section 5.1)
  std::int64_t variants_per_chunk = 5;   // M (section 5.1)
  bool cap_variants_per_chunk = false;   // paper: only the N × M total is a limit
  double max_reuse_bonus = 1000.0;       // cap of the f_r increment 1/CFO (CFO = 0 earns exactly this)

  [[nodiscard]] std::int64_t capacity() const noexcept { return num_chunks * variants_per_chunk; }

  void validate() const {
    detail::require(num_chunks >= 1, "VariantCacheConfig: num_chunks (N) = {} must be >= 1", num_chunks);
    detail::require(variants_per_chunk >= 1, "VariantCacheConfig: variants_per_chunk (M) = {} must be >= 1",
                    variants_per_chunk);
    detail::require(num_chunks <= std::numeric_limits<std::int64_t>::max() / variants_per_chunk,
                    "VariantCacheConfig: N x M = {} x {} overflows", num_chunks, variants_per_chunk);
    detail::require_finite_positive(max_reuse_bonus, "VariantCacheConfig: max_reuse_bonus");
  }
};

// Cache-Craft section 3.3: the f_r increment of one access, 1/CFO, capped at `max_bonus` (CFO = 0 → max_bonus).
[[nodiscard]] inline double reuse_frequency_increment(double cfo, double max_bonus) {
  detail::require_finite_nonneg(cfo, "reuse_frequency_increment: cfo");
  detail::require_finite_positive(max_bonus, "reuse_frequency_increment: max_bonus");
  return cfo == 0.0 ? max_bonus : std::min(1.0 / cfo, max_bonus);
}

// One stored variant, as inspected.
struct VariantEntry {
  std::uint64_t id = 0;            // unique, increasing in insertion order
  ChunkProfile profile;            // chunk id, stored prefix, CCI, ordered recompute-token list
  KVKey kv;                        // where the engine's KVStore holds this variant's KV
  double reuse_frequency = 0.0;    // f_r
};

// The variant chosen for a chunk in a new prompt.
struct VariantMatch {
  std::uint64_t variant_id = 0;
  KVKey kv;
  ChunkScore score;                // β, γ, β', CFO, N and the chunk-local tokens to recompute
  double reuse_frequency = 0.0;    // f_r after this access (unchanged by best())
};

struct VariantInsertResult {
  bool inserted = false;              // false: this (chunk, stored prefix) is already stored
  std::uint64_t variant_id = 0;       // the new variant, or the one already stored
  std::vector<VariantEntry> evicted;  // erase their KV from the KVStore
};

// Cache-Craft section 3.3: up to N × M chunk-cache variants keyed by chunk hash.
class VariantCache {
 public:
  explicit VariantCache(VariantCacheConfig config = {}) : config_(config) { config_.validate(); }

  [[nodiscard]] const VariantCacheConfig& config() const noexcept { return config_; }
  [[nodiscard]] std::int64_t capacity() const noexcept { return config_.capacity(); }
  [[nodiscard]] std::int64_t size() const {
    std::lock_guard lock(mutex_);
    return size_;
  }
  // Variants inserted and evicted since construction (erase() is not an eviction).
  [[nodiscard]] std::int64_t inserted_total() const {
    std::lock_guard lock(mutex_);
    return inserted_total_;
  }
  [[nodiscard]] std::int64_t evicted_total() const {
    std::lock_guard lock(mutex_);
    return evicted_total_;
  }
  // Number of distinct chunks with at least one variant.
  [[nodiscard]] std::int64_t num_chunks() const {
    std::lock_guard lock(mutex_);
    return static_cast<std::int64_t>(chunks_.size());
  }
  [[nodiscard]] bool contains(std::uint64_t chunk) const {
    std::lock_guard lock(mutex_);
    return chunks_.contains(chunk);
  }

  // Adds a variant of profile.chunk_id computed behind profile.stored_prefix whose KV is stored under `kv`.
  VariantInsertResult insert(ChunkProfile profile, KVKey kv) {
    profile.validate();
    std::lock_guard lock(mutex_);
    VariantInsertResult result;
    if (const auto it = chunks_.find(profile.chunk_id); it != chunks_.end()) {
      detail::require(it->second.front().profile.size == profile.size,
                      "VariantCache::insert: chunk {:#x} has {} tokens but its stored variants have {}",
                      profile.chunk_id, profile.size, it->second.front().profile.size);
      for (const VariantEntry& v : it->second) {
        if (v.profile.stored_prefix == profile.stored_prefix) {
          result.variant_id = v.id;
          return result;
        }
      }
    }
    detail::require(!kv_keys_.contains(kv), "VariantCache::insert: KVKey {{model {:#x}, content {:#x}}} is already "
                    "stored for another variant", kv.model, kv.content);
    const std::uint64_t chunk = profile.chunk_id;
    if (config_.cap_variants_per_chunk && chunks_.contains(chunk) &&
        static_cast<std::int64_t>(chunks_.at(chunk).size()) >= config_.variants_per_chunk) {
      result.evicted.push_back(evict(chunk));
    } else if (size_ >= capacity()) {
      result.evicted.push_back(evict(victim_chunk()));
    }
    VariantEntry entry;
    entry.id = next_id_++;
    entry.profile = std::move(profile);
    entry.kv = kv;
    result.inserted = true;
    result.variant_id = entry.id;
    kv_keys_.insert(kv);
    chunks_[chunk].push_back(std::move(entry));
    ++size_;
    ++inserted_total_;
    evicted_total_ += static_cast<std::int64_t>(result.evicted.size());
    return result;
  }

  // The variant of `chunk` with the lowest CFO behind `current_prefix` (ids of the chunks before it in the
  // new prompt, in order), scored with the method's CCIScorerConfig (α, eq. 12; prefix coverage); nullopt when
  // the chunk has no variant. The choice does not depend on α (CFO = α · CCI · (1 − β'): the lowest
  // CCI · (1 − β') wins). Does not change f_r.
  [[nodiscard]] std::optional<VariantMatch> best(std::uint64_t chunk, std::span<const std::uint64_t> current_prefix,
                                                 const CCIScorerConfig& scoring) const {
    std::lock_guard lock(mutex_);
    return best_locked(chunk, current_prefix, scoring);
  }

  // best(), and records the access: f_r += 1/CFO of the chosen variant (capped, section 3.3).
  std::optional<VariantMatch> lookup(std::uint64_t chunk, std::span<const std::uint64_t> current_prefix,
                                     const CCIScorerConfig& scoring) {
    std::lock_guard lock(mutex_);
    std::optional<VariantMatch> m = best_locked(chunk, current_prefix, scoring);
    if (m) m->reuse_frequency = record_use_locked(m->variant_id, m->score.cfo);
    return m;
  }

  // Records one use of variant `variant_id` at fix overhead `cfo` (a match from best() that a request then
  // used): f_r += 1/CFO, capped (section 3.3). Returns the new f_r.
  double record_use(std::uint64_t variant_id, double cfo) {
    std::lock_guard lock(mutex_);
    return record_use_locked(variant_id, cfo);
  }

  // Removes variant `variant_id` (e.g. its KV left the engine's store); returns whether it was there.
  bool erase(std::uint64_t variant_id) {
    std::lock_guard lock(mutex_);
    for (auto it = chunks_.begin(); it != chunks_.end(); ++it) {
      auto& variants = it->second;
      const auto v = std::find_if(variants.begin(), variants.end(),
                                  [variant_id](const VariantEntry& e) { return e.id == variant_id; });
      if (v == variants.end()) continue;
      kv_keys_.erase(v->kv);
      variants.erase(v);
      if (variants.empty()) chunks_.erase(it);
      --size_;
      return true;
    }
    return false;
  }

  // Every stored variant, by id (insertion order).
  [[nodiscard]] std::vector<VariantEntry> entries() const {
    std::lock_guard lock(mutex_);
    std::vector<VariantEntry> out;
    out.reserve(static_cast<std::size_t>(size_));
    for (const auto& [chunk, variants] : chunks_) out.insert(out.end(), variants.begin(), variants.end());
    std::sort(out.begin(), out.end(), [](const VariantEntry& x, const VariantEntry& y) { return x.id < y.id; });
    return out;
  }

  // The variants of one chunk, by id; empty when it has none.
  [[nodiscard]] std::vector<VariantEntry> variants(std::uint64_t chunk) const {
    std::lock_guard lock(mutex_);
    const auto it = chunks_.find(chunk);
    return it == chunks_.end() ? std::vector<VariantEntry>{} : it->second;
  }

 private:
  std::optional<VariantMatch> best_locked(std::uint64_t chunk, std::span<const std::uint64_t> current_prefix,
                                          const CCIScorerConfig& scoring) const {
    const auto it = chunks_.find(chunk);
    if (it == chunks_.end()) return std::nullopt;
    auto [index, score] = choose(it->second, current_prefix, scoring);
    const VariantEntry& v = it->second[index];
    return VariantMatch{v.id, v.kv, std::move(score), v.reuse_frequency};
  }

  double record_use_locked(std::uint64_t variant_id, double cfo) {
    const double increment = reuse_frequency_increment(cfo, config_.max_reuse_bonus);
    for (auto& [chunk, variants] : chunks_)
      for (VariantEntry& v : variants)
        if (v.id == variant_id) return v.reuse_frequency += increment;
    throw error(fmt::format("VariantCache::record_use: no variant {}", variant_id));
  }

  // Eviction order: lowest f_r, then oldest.
  static bool evict_before(const VariantEntry& x, const VariantEntry& y) noexcept {
    return x.reuse_frequency < y.reuse_frequency || (x.reuse_frequency == y.reuse_frequency && x.id < y.id);
  }

  // Index and score of the lowest-CFO variant among a chunk's (non-empty, id-ordered) variants; a strict '<'
  // leaves CFO ties with the oldest. Every variant gets β, γ, β' and CFO (eq. 6-8, 12); only the winner gets
  // its N and recompute TokenSet (eq. 14).
  std::pair<std::size_t, ChunkScore> choose(const std::vector<VariantEntry>& variants,
                                            std::span<const std::uint64_t> current_prefix,
                                            const CCIScorerConfig& scoring) const {
    // Ranked by the CFO at α = 1, so that α = 0 (every CFO 0) still picks the best-matching variant.
    const auto unscaled = [](const ChunkScore& s) { return cache_fix_overhead(s.cci, s.beta_adjusted, 1.0); };
    std::pair<std::size_t, ChunkScore> out{0, detail::score_cfo(variants[0].profile, current_prefix, scoring)};
    for (std::size_t k = 1; k < variants.size(); ++k) {
      ChunkScore s = detail::score_cfo(variants[k].profile, current_prefix, scoring);
      if (unscaled(s) < unscaled(out.second)) out = {k, std::move(s)};
    }
    detail::fill_recompute(out.second, variants[out.first].profile);
    return out;
  }

  // The chunk that holds the global eviction victim.
  [[nodiscard]] std::uint64_t victim_chunk() const {
    const VariantEntry* victim = nullptr;
    for (const auto& [chunk, variants] : chunks_)
      for (const VariantEntry& v : variants)
        if (victim == nullptr || evict_before(v, *victim)) victim = &v;
    return victim->profile.chunk_id;
  }

  // Removes and returns the eviction victim among the variants of `chunk`.
  VariantEntry evict(std::uint64_t chunk) {
    auto& variants = chunks_.at(chunk);
    const auto it = std::min_element(variants.begin(), variants.end(), evict_before);
    VariantEntry out = std::move(*it);
    variants.erase(it);
    if (variants.empty()) chunks_.erase(chunk);
    kv_keys_.erase(out.kv);
    --size_;
    return out;
  }

  VariantCacheConfig config_;
  mutable std::mutex mutex_;  // guards everything below
  std::unordered_map<std::uint64_t, std::vector<VariantEntry>> chunks_;  // each vector in id order
  std::unordered_set<KVKey, KVKeyHash> kv_keys_;
  std::int64_t size_ = 0;
  std::int64_t inserted_total_ = 0;
  std::int64_t evicted_total_ = 0;
  std::uint64_t next_id_ = 0;
};

}  // namespace kvfuse
