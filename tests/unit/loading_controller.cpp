// LoadingController (CacheBlend section 5.1, footnotes 5 and 6). Expected values are worked out by hand,
// including the two examples of CacheBlend section 5 (Llama-7B and Llama-70B, 4K context, NVMe SSD).
#include <doctest/doctest.h>

#include <limits>
#include <vector>

#include "kvfuse/schedule/loading_controller.hpp"

// Each unit test file lives in its own namespace: the files are compiled together (a unity build).
namespace unit_loading_controller {

using kvfuse::LoadingController;
using kvfuse::LoadingControllerConfig;
using kvfuse::LoadingRequest;
using kvfuse::StorageDevice;

namespace {

// NVMe SSD at 4'194'304'000 B/s (about 4.2 GB/s): 64 MiB take 16 ms and 16 MiB take 4 ms.
const StorageDevice kNvme{"nvme", 0.1, 4194304000.0, 0.0};

// Llama-7B, 4K context: K and V of 4096 hidden dims in fp16 = 16 KiB per token per layer (64 MiB per layer);
// recomputing 15 % takes 3 ms per layer, so Prefill = 20 ms per layer (section 5).
LoadingRequest llama7b() { return {4096, 32, 16384.0, 0.020}; }
// Llama-70B, 4K context: 8 KV heads x 128 dims x K,V x fp16 = 4 KiB per token per layer (16 MiB per layer);
// recomputing 15 % takes 7 ms per layer, so Prefill = 7 / 0.15 ms per layer.
LoadingRequest llama70b() { return {4096, 80, 4096.0, 0.007 / 0.15}; }

}  // namespace

TEST_CASE("delay estimators follow footnotes 5 and 6") {
  const LoadingRequest r = llama7b();
  CHECK(r.kv_bytes_per_layer() == 67108864.0);
  CHECK(kvfuse::recompute_delay(r, 0.15) == doctest::Approx(0.003));
  CHECK(kvfuse::recompute_delay(r, 0.0) == 0.0);
  CHECK(kvfuse::recompute_delay(r, 1.0) == 0.020);
  CHECK(kvfuse::load_delay(r, kNvme) == doctest::Approx(0.016));
  // Latency adds once per layer fetch.
  const StorageDevice remote{"remote", 0.01, 4194304000.0, 0.005};
  CHECK(kvfuse::load_delay(r, remote) == doctest::Approx(0.021));
  // Storage: 64 MiB x 32 layers = 2 GiB = 2.147483648 GB at 0.1 per GB.
  CHECK(kvfuse::storage_cost(r, kNvme) == doctest::Approx(0.2147483648));
  CHECK_THROWS_WITH_AS((void)kvfuse::recompute_delay(r, -0.1), doctest::Contains("ratio -0.1"), kvfuse::error);
}

TEST_CASE("choose_ratio: loading is the bottleneck (Llama-7B from NVMe), the ratio rises above r*") {
  const LoadingController ctl;
  CHECK(ctl.config().min_ratio == 0.15);
  const kvfuse::RatioDecision d = ctl.choose_ratio(llama7b(), kNvme);
  CHECK(d.load_seconds == doctest::Approx(0.016));
  CHECK(d.matching_ratio == doctest::Approx(0.8));  // 16 ms / 20 ms
  CHECK(d.ratio == doctest::Approx(0.8));
  CHECK(d.recompute_seconds == doctest::Approx(0.016));
  CHECK(d.extra_delay_seconds == doctest::Approx(0.0));
  CHECK(d.loading_bound);
}

TEST_CASE("choose_ratio: recompute is the bottleneck (Llama-70B from NVMe), the ratio stays at r*") {
  const LoadingController ctl;
  const kvfuse::RatioDecision d = ctl.choose_ratio(llama70b(), kNvme);
  CHECK(d.load_seconds == doctest::Approx(0.004));
  CHECK(d.matching_ratio == doctest::Approx(0.004 / (0.007 / 0.15)));  // about 0.0857 < r*
  CHECK(d.ratio == 0.15);
  CHECK(d.recompute_seconds == doctest::Approx(0.007));
  CHECK(d.extra_delay_seconds == doctest::Approx(0.003));  // 7 ms recompute vs 4 ms loading
  CHECK_FALSE(d.loading_bound);

  // A higher quality floor r* = 0.3 lifts the ratio; the 7B case still wants 0.8.
  const LoadingController strict(LoadingControllerConfig{0.3});
  CHECK(strict.choose_ratio(llama70b(), kNvme).ratio == 0.3);
  CHECK(strict.choose_ratio(llama7b(), kNvme).ratio == doctest::Approx(0.8));
}

TEST_CASE("choose_ratio: caps at 1, and free recompute hides under any loading") {
  const LoadingController ctl;
  const StorageDevice hdd{"hdd", 0.02, 67108864.0, 0.0};  // 64 MiB per layer at 64 MiB/s: 1 s per layer
  const kvfuse::RatioDecision slow = ctl.choose_ratio(llama7b(), hdd);
  CHECK(slow.load_seconds == 1.0);
  CHECK(slow.matching_ratio == 1.0);
  CHECK(slow.ratio == 1.0);
  CHECK(slow.recompute_seconds == 0.020);
  CHECK(slow.extra_delay_seconds == 0.0);
  CHECK(slow.loading_bound);

  LoadingRequest free_recompute = llama7b();
  free_recompute.prefill_seconds_per_layer = 0.0;
  const kvfuse::RatioDecision f = ctl.choose_ratio(free_recompute, kNvme);
  CHECK(f.matching_ratio == 1.0);
  CHECK(f.ratio == 1.0);
  CHECK(f.extra_delay_seconds == 0.0);

  // Nothing to load and no latency: T_load = 0, so only r* is recomputed and all of it is extra delay.
  LoadingRequest empty = llama7b();
  empty.context_tokens = 0;
  const kvfuse::RatioDecision e = ctl.choose_ratio(empty, kNvme);
  CHECK(e.load_seconds == 0.0);
  CHECK(e.matching_ratio == 0.0);
  CHECK(e.ratio == 0.15);
  CHECK(e.extra_delay_seconds == doctest::Approx(0.003));
}

// Binary-exact setup: 1024 tokens x 1024 B = 2^20 B per layer, one layer, Prefill = 0.5 s per layer.
namespace {
const LoadingRequest kSmall{1024, 1, 1024.0, 0.5};
const std::vector<StorageDevice> kTiers = {
    {"gpu", 10.0, 1073741824.0, 0.0},  // 2^20 / 2^30 = 1/1024 s
    {"ram", 2.0, 67108864.0, 0.0},     // 2^20 / 2^26 = 1/64 s
    {"ssd", 0.5, 8388608.0, 0.0},      // 2^20 / 2^23 = 0.125 s
    {"hdd", 0.05, 2097152.0, 0.0},     // 2^20 / 2^21 = 0.5 s
    {"s3", 0.02, 1073741824.0, 0.25},  // 0.25 + 1/1024 s
};
}  // namespace

TEST_CASE("choose_device: the cheapest device that adds no delay") {
  const LoadingController ctl;
  // r = 0.25: T_recompute = 0.125; gpu, ram and ssd (exactly 0.125: T_recompute >= T_load) fit.
  const kvfuse::DeviceDecision d = ctl.choose_device(kSmall, kTiers, 0.25);
  CHECK(d.ratio == 0.25);
  CHECK(d.recompute_seconds == 0.125);
  REQUIRE(d.options.size() == 5);
  CHECK(d.options[0].load_seconds == 1.0 / 1024.0);
  CHECK(d.options[1].load_seconds == 1.0 / 64.0);
  CHECK(d.options[2].load_seconds == 0.125);
  CHECK(d.options[3].load_seconds == 0.5);
  CHECK(d.options[4].load_seconds == 0.25 + 1.0 / 1024.0);
  CHECK(d.options[2].storage_cost == doctest::Approx(0.5 * 1048576.0 / 1e9));
  CHECK(d.options[0].no_extra_delay);
  CHECK(d.options[1].no_extra_delay);
  CHECK(d.options[2].no_extra_delay);
  CHECK_FALSE(d.options[3].no_extra_delay);
  CHECK_FALSE(d.options[4].no_extra_delay);
  REQUIRE(d.device.has_value());
  CHECK(*d.device == 2);  // ssd: cheaper hdd and s3 are too slow
  CHECK(d.fastest == 0);

  // Default ratio r* = 0.15: T_recompute = 0.075, the ssd no longer fits -> ram.
  const kvfuse::DeviceDecision at_min = ctl.choose_device(kSmall, kTiers);
  CHECK(at_min.ratio == 0.15);
  REQUIRE(at_min.device.has_value());
  CHECK(*at_min.device == 1);

  // r = 1: T_recompute = 0.5, everything fits, the cheapest is s3.
  const kvfuse::DeviceDecision at_full = ctl.choose_device(kSmall, kTiers, 1.0);
  REQUIRE(at_full.device.has_value());
  CHECK(*at_full.device == 4);
}

TEST_CASE("choose_device: no device fits") {
  const LoadingController ctl;
  // r = 0.001: T_recompute = 0.0005 s, below even the gpu's 1/1024 s.
  const kvfuse::DeviceDecision d = ctl.choose_device(kSmall, kTiers, 0.001);
  CHECK_FALSE(d.device.has_value());
  CHECK(d.fastest == 0);
  for (const kvfuse::DeviceOption& o : d.options) CHECK_FALSE(o.no_extra_delay);
}

TEST_CASE("choose_device: equal costs go to the faster device, then to the earlier one") {
  const LoadingController ctl;
  const std::vector<StorageDevice> same_cost = {
      {"a", 1.0, 8388608.0, 0.0},   // 0.125 s
      {"b", 1.0, 67108864.0, 0.0},  // 1/64 s
      {"c", 1.0, 67108864.0, 0.0},  // 1/64 s
  };
  const kvfuse::DeviceDecision d = ctl.choose_device(kSmall, same_cost, 0.25);
  REQUIRE(d.device.has_value());
  CHECK(*d.device == 1);
  CHECK(d.fastest == 1);
}

namespace {

// Both choices reject `request`; the message names the field and its value (`needle`).
void check_rejected(const LoadingRequest& request, const char* needle) {
  CAPTURE(needle);
  const LoadingController ctl;
  CHECK_THROWS_WITH_AS((void)ctl.choose_ratio(request, kNvme), doctest::Contains(needle), kvfuse::error);
  CHECK_THROWS_WITH_AS((void)ctl.choose_device(request, kTiers), doctest::Contains(needle), kvfuse::error);
}

// Both choices reject `device`, alone or in a list of good ones; the message names the device, the field
// and its value (`needle`).
void check_rejected(const StorageDevice& device, const char* needle) {
  CAPTURE(needle);
  const LoadingController ctl;
  CHECK_THROWS_WITH_AS((void)ctl.choose_ratio(kSmall, device), doctest::Contains(needle), kvfuse::error);
  std::vector<StorageDevice> list = kTiers;
  list.push_back(device);
  CHECK_THROWS_WITH_AS((void)ctl.choose_device(kSmall, list), doctest::Contains(needle), kvfuse::error);
}

}  // namespace

TEST_CASE("LoadingController rejects bad inputs and names them") {
  CHECK_THROWS_WITH_AS(LoadingController(LoadingControllerConfig{1.5}), doctest::Contains("min_ratio 1.5"),
                       kvfuse::error);
  CHECK_THROWS_WITH_AS(LoadingController(LoadingControllerConfig{-0.2}), doctest::Contains("min_ratio -0.2"),
                       kvfuse::error);

  check_rejected(LoadingRequest{-1, 1, 1.0, 1.0}, "context_tokens -1");
  check_rejected(LoadingRequest{1, 0, 1.0, 1.0}, "num_layers 0");
  check_rejected(LoadingRequest{1, 1, -2.0, 1.0}, "kv_bytes_per_token_per_layer = -2");
  check_rejected(LoadingRequest{1, 1, 1.0, std::numeric_limits<double>::infinity()},
                 "prefill_seconds_per_layer = inf");
  check_rejected(LoadingRequest{1, 1, 1.0, -0.5}, "prefill_seconds_per_layer = -0.5");

  check_rejected(StorageDevice{"neg", 1.0, -1.0, 0.0}, "'neg': bandwidth_bytes_per_s = -1");
  check_rejected(StorageDevice{"zero", 1.0, 0.0, 0.0}, "'zero': bandwidth_bytes_per_s = 0");
  check_rejected(StorageDevice{"nanbw", 1.0, std::numeric_limits<double>::quiet_NaN(), 0.0},
                 "'nanbw': bandwidth_bytes_per_s = nan");
  check_rejected(StorageDevice{"lat", 1.0, 1.0, -0.1}, "'lat': latency_s = -0.1");
  check_rejected(StorageDevice{"cost", -3.0, 1.0, 0.0}, "'cost': cost_per_gb = -3");

  const LoadingController ctl;
  CHECK_THROWS_WITH_AS((void)ctl.choose_device(kSmall, std::vector<StorageDevice>{}),
                       doctest::Contains("device list is empty"), kvfuse::error);
  CHECK_THROWS_WITH_AS((void)ctl.choose_device(kSmall, kTiers, 1.2), doctest::Contains("ratio 1.2"), kvfuse::error);
}

}  // namespace unit_loading_controller
