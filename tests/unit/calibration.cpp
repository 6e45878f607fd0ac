// The per-model correctness gate: calibrate() picks the cheapest setting within a teacher-forced budget or
// refuses the method with what it measured; TeacherForcedEvaluator on the small Llama; calibration files.
#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>
#include <string>
#include <variant>
#include <vector>

#include <doctest/doctest.h>

#include "kvfuse/cpu.hpp"
#include "kvfuse/harness/calibrate.hpp"
#include "kvfuse/harness/metrics.hpp"

#include "../support/error_of.hpp"
#include "../support/fusion_prompts.hpp"
#include "../support/small_llama.hpp"
#include "../support/test_util.hpp"

// Each unit test file lives in its own namespace: the files are compiled together (a unity build).
namespace unit_calibration {

using namespace kvfuse;
using kvfuse_test::error_of;

namespace {

// A stand-in measurement for the policy tests: naive reuse's KL, then one KL per setting, cheapest first.
struct ScriptedEvaluate {
  std::vector<double> kl;  // per setting, cheapest first
  std::vector<std::string> asked;
  double naive_kl = 1.0;
  CalibrationMeasure operator()(const FusionMethod& m) {
    asked.push_back(method_name(m));
    if (std::holds_alternative<NaiveReuse>(m)) return {0.0, naive_kl, 0.5};
    const std::size_t i = asked.size() - 2;  // after naive reuse
    return {0.1 * static_cast<double>(i + 1), kl.at(i), kl.at(i) < 0.05 ? 1.0 : 0.8};
  }
};

}  // namespace

TEST_CASE("calibrate: the cheapest setting within budget, measured cheapest first, stopping there") {
  ScriptedEvaluate e{{0.9, 0.3, 0.04, 0.01}, {}};
  const Calibration c = calibrate(7, "cacheblend", CalibrationBudget{0.05, 0.95}, e);
  CHECK(e.asked == std::vector<std::string>{"naive", "cacheblend@0.05", "cacheblend@0.1", "cacheblend"});
  CHECK(c.naive.kl_answer_mean == 1.0);
  REQUIRE(c.chosen);
  CHECK(*c.chosen == "cacheblend");
  CHECK(method_name(c.method()) == "cacheblend");
  REQUIRE(c.points.size() == 3);
  CHECK(!c.points[0].admitted);
  CHECK(c.points[2].admitted);
  CHECK(c.points[2].measure.kl_answer_mean == 0.04);
  // Every family's settings parse and are listed cheapest first (their knob grows).
  for (const std::string_view listed : kCalibrationFamilies) {
    const std::string family(listed);
    CAPTURE(family);
    const std::vector<std::string> s = calibration_settings(family);
    CHECK(s.size() >= 4);
    for (const std::string& name : s) CHECK(method_name(parse_method(name)) == name);
  }
}

TEST_CASE("calibrate never admits a setting worse than naive reuse, even within budget") {
  // Naive reuse at KL 0.02: the settings at 0.04 and 0.03 are within the 0.05 budget but lose to doing nothing.
  ScriptedEvaluate e{{0.04, 0.03, 0.02, 0.01}, {}, 0.02};
  const Calibration c = calibrate(7, "attnlink", CalibrationBudget{0.05, 0.95}, e);
  REQUIRE(c.chosen);
  CHECK(*c.chosen == "attnlink");  // the third setting, KL 0.02 == naive's
  REQUIRE(c.points.size() == 3);
  CHECK(!c.points[0].admitted);
  CHECK(!c.points[1].admitted);
  CHECK(c.naive.kl_answer_mean == 0.02);
  // Every setting worse than naive: refused, and the error says naive reuse was the bar.
  ScriptedEvaluate worse{{0.04, 0.04, 0.04, 0.04, 0.04}, {}, 0.001};
  const Calibration r = calibrate(7, "attnlink", CalibrationBudget{0.05, 0.95}, worse);
  CHECK(!r.chosen);
  CHECK(error_of([&] { (void)r.method(); }).find("no worse than naive reuse (KL 0.0010") != std::string::npos);
}

TEST_CASE("calibrate refuses a method no setting of which is within budget, naming what it measured") {
  ScriptedEvaluate e{{0.9, 0.8, 0.7, 0.6, 0.5, 0.4}, {}};
  const Calibration c = calibrate(0xabc, "cacheblend", CalibrationBudget{0.05, 0.95}, e);
  CHECK(!c.chosen);
  CHECK(c.points.size() == calibration_settings("cacheblend").size());
  const std::string why = error_of([&] { (void)c.method(); });
  CHECK(why.find("refuses cacheblend for model 0000000000000abc") != std::string::npos);
  CHECK(why.find("cacheblend@0.5: KL 0.4000, top-1 0.800") != std::string::npos);
  // Bad input is named.
  CHECK(error_of([&] { (void)calibrate(1, "naive", CalibrationBudget{}, e); }).find("unknown method family 'naive'") !=
        std::string::npos);
  CHECK(error_of([&] { (void)calibrate(1, "cacheblend", CalibrationBudget{-1.0, 0.9}, e); })
            .find("max_kl_answer = -1") != std::string::npos);
  const auto nan_kl = [](const FusionMethod& m) {
    const bool naive = std::holds_alternative<NaiveReuse>(m);
    return CalibrationMeasure{0.2, naive ? 0.1 : std::numeric_limits<double>::quiet_NaN(), 1.0};
  };
  CHECK(error_of([&] { (void)calibrate(1, "attnlink", CalibrationBudget{}, nan_kl); }).find("attnlink@1 measured KL nan") !=
        std::string::npos);
}

TEST_CASE("TeacherForcedEvaluator on the small Llama: full prefill is exact, the gate admits or refuses by budget") {
  using namespace kvfuse_test;
  const CpuLlama model = small_llama();
  InMemoryKVStore store;
  CpuLlamaFusion engine(model);
  FusionPipeline pipeline(engine, store);
  std::vector<eval::CalibrationPrompt> prompts;
  for (const Prompt& p : {assemble({kSystem, kA, kB, kC}, kQuery), assemble({kSystem, kC, kA}, chunk_tokens(4, 9))}) {
    pipeline.store_chunk_caches(p.tokens, p.layout);
    prompts.push_back({p.tokens, p.layout});
  }
  eval::TeacherForcedEvaluator evaluate(model, pipeline, prompts, 6, /*eos=*/95);
  const CalibrationMeasure full = evaluate(FullRecompute{});
  CHECK(full.kl_answer_mean == 0.0);
  CHECK(full.top1_agreement == 1.0);
  CHECK(full.recompute_fraction == 1.0);
  const CalibrationMeasure naive = evaluate(NaiveReuse{});
  CHECK(naive.kl_answer_mean > 0.0);
  CHECK(naive.recompute_fraction < 1.0);
  // The same run measured again gives the same figures (the evaluator holds no state between settings).
  const CalibrationMeasure again = evaluate(NaiveReuse{});
  CHECK(again.kl_answer_mean == naive.kl_answer_mean);

  // A budget naive reuse itself meets: the cheapest setting is chosen after one measurement.
  const Calibration loose = calibrate(model.fingerprint(), "cacheblend", CalibrationBudget{naive.kl_answer_mean, 0.0},
                                      evaluate);
  REQUIRE(loose.chosen);
  CHECK(*loose.chosen == "cacheblend@0.05");
  CHECK(loose.points.size() == 1);
  // No reuse of a deviating cache is exact: a zero-KL budget refuses every setting.
  const Calibration strict = calibrate(model.fingerprint(), "attnlink", CalibrationBudget{0.0, 1.0}, evaluate);
  CHECK(!strict.chosen);
  CHECK(strict.points.size() == calibration_settings("attnlink").size());
  for (const CalibrationPoint& p : strict.points) {
    CAPTURE(p.method);
    CHECK(p.measure.kl_answer_mean > 0.0);
    CHECK(p.measure.recompute_fraction < 1.0);
  }
  CHECK(error_of([&] { (void)strict.method(); }).find("refuses attnlink") != std::string::npos);
  CHECK(error_of([&] { eval::TeacherForcedEvaluator bad(model, pipeline, {}, 6, 95); }).find("no sample prompts") !=
        std::string::npos);
  // The same prompts with their chunk caches computed behind the system chunk are another sample set.
  std::vector<eval::CalibrationPrompt> behind = prompts;
  for (eval::CalibrationPrompt& p : behind) {
    p.layout.chunks.front().cached = false;
    p.layout.chunk_context = p.layout.chunks.front().range.end;
    pipeline.store_chunk_caches(p.tokens, p.layout);
  }
  const eval::TeacherForcedEvaluator evaluate_behind(model, pipeline, behind, 6, 95);
  CHECK(evaluate_behind.samples_hash() != evaluate.samples_hash());
}

TEST_CASE("calibration files: round trip, and a corrupt, truncated or foreign file is an error naming it") {
  const kvfuse_test::TempDir dir;
  const CalibrationBudget budget{0.05, 0.95};
  ScriptedEvaluate e{{0.9, 0.01}, {}};
  const Calibration c = calibrate(0x1234, "attnlink", budget, e);
  const std::filesystem::path path = eval::calibration_file(dir.path, 0x1234, "attnlink", budget, 99);
  CHECK(path.filename().string().starts_with("0000000000001234-attnlink-"));
  CHECK(eval::calibration_file(dir.path, 0x1234, "attnlink", CalibrationBudget{0.1, 0.95}, 99) != path);
  eval::save_calibration(path, c, 99, "none");
  const Calibration back = eval::load_calibration(path, 0x1234, "attnlink", budget, 99, "none");
  CHECK(back.chosen == c.chosen);
  REQUIRE(back.points.size() == c.points.size());
  for (std::size_t i = 0; i < c.points.size(); ++i) {
    CHECK(back.points[i].method == c.points[i].method);
    CHECK(back.points[i].measure.kl_answer_mean == c.points[i].measure.kl_answer_mean);  // exact round trip
    CHECK(back.points[i].measure.recompute_fraction == c.points[i].measure.recompute_fraction);
    CHECK(back.points[i].admitted == c.points[i].admitted);
  }
  CHECK(back.naive.kl_answer_mean == c.naive.kl_answer_mean);
  CHECK(back.naive.top1_agreement == c.naive.top1_agreement);
  CHECK(error_of([&] { (void)eval::load_calibration(path, 0x9999, "attnlink", budget, 99, "none"); })
            .find("calibrated for another model") != std::string::npos);
  CHECK(error_of([&] { (void)eval::load_calibration(path, 0x1234, "cacheblend", budget, 99, "none"); })
            .find("calibrates another family") != std::string::npos);
  CHECK(error_of([&] {
          (void)eval::load_calibration(path, 0x1234, "attnlink", CalibrationBudget{0.1, 0.95}, 99, "none");
        })
            .find("another budget") != std::string::npos);
  CHECK(error_of([&] { (void)eval::load_calibration(path, 0x1234, "attnlink", budget, 98, "none"); })
            .find("other sample prompts") != std::string::npos);
  // Measured on caches computed alone: not a calibration of caches behind a chunk context.
  CHECK(error_of([&] { (void)eval::load_calibration(path, 0x1234, "attnlink", budget, 99, "system"); })
            .find("behind chunk context 'none' (asked for 'system')") != std::string::npos);
  CHECK(error_of([&] { eval::save_calibration(path, c, 99, "two words"); }).find("'two words'") != std::string::npos);

  std::string text;
  {
    std::ifstream in(path);
    text.assign(std::istreambuf_iterator<char>(in), {});
  }
  const auto rewrite = [&](const std::string& t) { std::ofstream(path, std::ios::trunc) << t; };
  rewrite(text.substr(0, text.rfind("chosen")));
  CHECK(error_of([&] { (void)eval::load_calibration(path, 0x1234, "attnlink", budget, 99, "none"); })
            .find("no chosen / refused record") != std::string::npos);
  std::string bad = text;
  bad.replace(bad.find("point attnlink@1 "), 17, "point attnlink@1 x");
  rewrite(bad);
  const std::string why = error_of([&] { (void)eval::load_calibration(path, 0x1234, "attnlink", budget, 99, "none"); });
  CHECK(why.find("line 8") != std::string::npos);
  // A file without naive reuse's record (version 1 had none) is refused.
  std::string no_naive = text;
  no_naive.erase(no_naive.find("naive "), no_naive.find('\n', no_naive.find("naive ")) - no_naive.find("naive ") + 1);
  rewrite(no_naive);
  CHECK(error_of([&] { (void)eval::load_calibration(path, 0x1234, "attnlink", budget, 99, "none"); })
            .find("no naive record") != std::string::npos);
  CHECK(why.find(path.string()) != std::string::npos);
  // Version 2 (no chunk-context record) measured caches computed alone: read as "none", refused for another.
  std::string v2 = text;
  v2.replace(v2.find("kvfuse-calibration 3"), 20, "kvfuse-calibration 2");
  v2.erase(v2.find("chunk-context none\n"), 19);
  rewrite(v2);
  CHECK(eval::load_calibration(path, 0x1234, "attnlink", budget, 99, "none").chosen == c.chosen);
  CHECK(error_of([&] { (void)eval::load_calibration(path, 0x1234, "attnlink", budget, 99, "system"); })
            .find("version 2") != std::string::npos);
  std::string no_context = text;
  no_context.erase(no_context.find("chunk-context none\n"), 19);
  rewrite(no_context);
  CHECK(error_of([&] { (void)eval::load_calibration(path, 0x1234, "attnlink", budget, 99, "none"); })
            .find("no chunk-context record") != std::string::npos);
  rewrite("garbage\n");
  CHECK(error_of([&] { (void)eval::load_calibration(path, 0x1234, "attnlink", budget, 99, "none"); })
            .find("not a kvfuse calibration file") != std::string::npos);
  CHECK(error_of([&] { (void)eval::load_calibration(dir.path / "absent", 0x1234, "attnlink", budget, 99, "none"); })
            .find("cannot open") != std::string::npos);
}

}  // namespace unit_calibration
