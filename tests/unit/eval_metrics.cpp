// eval metrics: every expected value below is worked out by hand from the SQuAD / MuSiQue definitions.
#include <doctest/doctest.h>

#include <cmath>
#include <limits>
#include <span>
#include <string>
#include <vector>

#include "kvfuse/harness/metrics.hpp"

// Each unit test file lives in its own namespace: the files are compiled together (a unity build).
namespace unit_eval_metrics {

using kvfuse::eval::answer_tokens;
using kvfuse::eval::exact_match;
using kvfuse::eval::kl_divergence;
using kvfuse::eval::log_softmax;
using kvfuse::eval::max_token_f1;
using kvfuse::eval::normalize_answer;
using kvfuse::eval::rouge_l;
using kvfuse::eval::token_f1;

TEST_CASE("normalize_answer lowercases, drops punctuation and articles, collapses whitespace") {
  CHECK(normalize_answer("The  Eiffel-Tower!") == "eiffeltower");
  CHECK(normalize_answer("  A man, a plan, an  Canal: Panama! ") == "man plan canal panama");
  CHECK(normalize_answer("Hello\tWorld\n\r") == "hello world");
  CHECK(normalize_answer("1,000 km.") == "1000 km");
  CHECK(normalize_answer("don't_stop`{~}") == "dontstop");
  CHECK(normalize_answer("") == "");
  CHECK(normalize_answer("The a AN !?") == "");
}

TEST_CASE("normalize_answer removes articles only as whole words, after punctuation is gone") {
  CHECK(normalize_answer("theatre and anthem, then Ann") == "theatre and anthem then ann");
  // Punctuation goes first, so "the-end" is one word "theend" and keeps its "the".
  CHECK(normalize_answer("the-end") == "theend");
  CHECK(normalize_answer("the end") == "end");
  CHECK(normalize_answer("(the)") == "");
}

TEST_CASE("normalize_answer keeps non-ASCII bytes and treats them as word characters") {
  CHECK(normalize_answer("Café THE Zürich") == "café zürich");
  CHECK(normalize_answer("ÜBER") == "Über");  // only ASCII is lowercased
  CHECK(normalize_answer("Thé") == "thé");    // not the article "the"
  CHECK(normalize_answer("a—b") == "a—b");    // a non-ASCII dash is not punctuation
}

TEST_CASE("answer_tokens splits the normalized answer") {
  CHECK(answer_tokens("The Big  Apple.") == std::vector<std::string>{"big", "apple"});
  CHECK(answer_tokens("an").empty());
  CHECK(answer_tokens("").empty());
}

TEST_CASE("exact_match compares normalized answers") {
  CHECK(exact_match("The Eiffel Tower", "eiffel   tower!"));
  CHECK(exact_match("", "the"));
  CHECK_FALSE(exact_match("Eiffel Tower", "Eiffel Towers"));
  CHECK_FALSE(exact_match("tower eiffel", "eiffel tower"));
}

TEST_CASE("token_f1 is SQuAD's multiset-overlap F1") {
  // pred {cat, sat}, gold {cat, sat, down}: P = 2/2, R = 2/3 -> 2·(2/3)/(5/3) = 0.8.
  CHECK(token_f1("the cat sat", "a cat sat down") == doctest::Approx(0.8));
  // Overlap is a multiset: pred {cat x3}, gold {cat, dog}: c = 1, P = 1/3, R = 1/2 -> 0.4.
  CHECK(token_f1("cat cat cat", "cat dog") == doctest::Approx(0.4));
  // {x, x, y} vs {x, x, z}: c = 2, P = R = 2/3.
  CHECK(token_f1("x x y", "x x z") == doctest::Approx(2.0 / 3.0));
  CHECK(token_f1("sat cat", "Cat, sat.") == doctest::Approx(1.0));
  CHECK(token_f1("dog", "cat") == 0.0);
}

TEST_CASE("token_f1 on empty answers: 1 when both are empty, 0 when one is") {
  CHECK(token_f1("the", "!!") == 1.0);
  CHECK(token_f1("", "") == 1.0);
  CHECK(token_f1("the", "cat") == 0.0);
  CHECK(token_f1("cat", "") == 0.0);
}

TEST_CASE("max_token_f1 takes the best gold and rejects an empty gold list") {
  const std::vector<std::string> golds{"London", "Paris", "Paris, France"};
  CHECK(max_token_f1("paris france", golds) == doctest::Approx(1.0));
  // {paris, france} vs {paris}: P = 1/2, R = 1 -> 2/3.
  CHECK(max_token_f1("paris france", std::span(golds).first(2)) == doctest::Approx(2.0 / 3.0));
  CHECK(max_token_f1("berlin", golds) == 0.0);
  const std::vector<std::string> none;
  CHECK_THROWS_WITH_AS((void)max_token_f1("paris", none), doctest::Contains("golds is empty"), kvfuse::error);
}

TEST_CASE("rouge_l is the LCS F-measure over answer tokens") {
  // LCS x z w = 3, P = R = 3/4.
  CHECK(rouge_l("x y z w", "x z w v") == doctest::Approx(0.75));
  // LCS x z = 2, P = 2/3, R = 2/5 -> (8/15)/(16/15) = 0.5.
  CHECK(rouge_l("x y z", "x q z r s") == doctest::Approx(0.5));
  // Order matters (token_f1 would be 1): LCS 1, P = R = 1/2.
  CHECK(rouge_l("x y", "y x") == doctest::Approx(0.5));
  // LCS 1, P = 1/3, R = 1 -> (2/3)/(4/3) = 0.5.
  CHECK(rouge_l("x x x", "x") == doctest::Approx(0.5));
  // p q r s t vs q s p t r: no 4 of the 5 appear in order in both; q s t does -> P = R = 3/5.
  CHECK(rouge_l("p q r s t", "q s p t r") == doctest::Approx(0.6));
  CHECK(rouge_l("The X, y.", "x Y") == doctest::Approx(1.0));
  CHECK(rouge_l("x y", "z w") == 0.0);
}

TEST_CASE("rouge_l on empty answers: 1 when both are empty, 0 when one is") {
  CHECK(rouge_l("", "an") == 1.0);
  CHECK(rouge_l("the", "x") == 0.0);
  CHECK(rouge_l("x", "") == 0.0);
}

TEST_CASE("log_softmax is stable and normalized") {
  const std::vector<float> two{0.0F, 0.0F};
  const std::vector<double> half = log_softmax(two);
  REQUIRE(half.size() == 2);
  CHECK(half[0] == doctest::Approx(-std::log(2.0)));
  CHECK(half[1] == doctest::Approx(-std::log(2.0)));

  const std::vector<float> skewed{static_cast<float>(std::log(3.0)), 0.0F};
  const std::vector<double> quarters = log_softmax(skewed);
  CHECK(quarters[0] == doctest::Approx(std::log(0.75)).epsilon(1e-6));
  CHECK(quarters[1] == doctest::Approx(std::log(0.25)).epsilon(1e-6));

  // exp(1000) overflows; max subtraction keeps it at -ln 3.
  const std::vector<float> big{1000.0F, 1000.0F, 1000.0F};
  for (const double v : log_softmax(big)) CHECK(v == doctest::Approx(-std::log(3.0)));

  const std::vector<float> one{5.0F};
  CHECK(log_softmax(one) == std::vector<double>{0.0});
}

TEST_CASE("log_softmax rejects empty input and non-finite logits, naming them") {
  CHECK_THROWS_WITH_AS((void)log_softmax(std::vector<float>{}), doctest::Contains("empty"), kvfuse::error);
  const std::vector<float> with_nan{0.0F, std::numeric_limits<float>::quiet_NaN()};
  CHECK_THROWS_WITH_AS((void)log_softmax(with_nan), doctest::Contains("logits[1] = nan"), kvfuse::error);
  const std::vector<float> with_inf{-std::numeric_limits<float>::infinity(), 0.0F};
  CHECK_THROWS_WITH_AS((void)log_softmax(with_inf), doctest::Contains("logits[0] = -inf"), kvfuse::error);
}

TEST_CASE("kl_divergence is KL(P_ref || P) of the two softmaxes") {
  const std::vector<float> logits{1.0F, 2.0F, 3.0F};
  CHECK(kl_divergence(logits, logits) == 0.0);

  // P_ref = (1/2, 1/2), P = (3/4, 1/4): 0.5 ln(2/3) + 0.5 ln 2 = 0.5 ln(4/3).
  const std::vector<float> uniform{0.0F, 0.0F};
  const std::vector<float> skewed{static_cast<float>(std::log(3.0)), 0.0F};
  CHECK(kl_divergence(uniform, skewed) == doctest::Approx(0.143841036).epsilon(1e-6));
  // The other direction: 0.75 ln(1.5) + 0.25 ln(0.5).
  CHECK(kl_divergence(skewed, uniform) == doctest::Approx(0.130812036).epsilon(1e-6));

  // A permutation shares the normalizer Z = 1 + e + e^2, so KL = sum p_ref_i (x_i − y_i) = −2 p0 + p1 + p2
  // = 1 − 3/Z.
  const std::vector<float> ref{0.0F, 1.0F, 2.0F};
  const std::vector<float> perm{2.0F, 0.0F, 1.0F};
  const double expected = 1.0 - 3.0 / (1.0 + std::exp(1.0) + std::exp(2.0));
  CHECK(kl_divergence(ref, perm) == doctest::Approx(expected));
  // Adding a constant to all logits of either side changes nothing.
  const std::vector<float> ref_shifted{10.0F, 11.0F, 12.0F};
  const std::vector<float> perm_shifted{-3.0F, -5.0F, -4.0F};
  CHECK(kl_divergence(ref_shifted, perm_shifted) == doctest::Approx(expected));

  // Nearly all mass moves to the other token: KL = 200 (1 − 2 e^-200 / (1 + e^-200)) ≈ 200, no overflow.
  const std::vector<float> left{0.0F, -200.0F};
  const std::vector<float> right{-200.0F, 0.0F};
  CHECK(kl_divergence(left, right) == doctest::Approx(200.0));
}

TEST_CASE("kl_divergence rejects mismatched, empty and non-finite input, naming them") {
  const std::vector<float> three{0.0F, 1.0F, 2.0F};
  const std::vector<float> two{0.0F, 1.0F};
  CHECK_THROWS_WITH_AS((void)kl_divergence(three, two), doctest::Contains("has 3 entries but logits has 2"),
                       kvfuse::error);
  CHECK_THROWS_WITH_AS((void)kl_divergence(std::vector<float>{}, std::vector<float>{}), doctest::Contains("empty"),
                       kvfuse::error);
  const std::vector<float> with_inf{0.0F, std::numeric_limits<float>::infinity()};
  CHECK_THROWS_WITH_AS((void)kl_divergence(two, with_inf), doctest::Contains("logits[1] = inf"), kvfuse::error);
}

TEST_CASE("teacher_forced: mean KL and top-1 agreement over an answer's tokens; bad input named") {
  const std::vector<std::vector<float>> full = {{1.0f, 2.0f, 3.0f}, {3.0f, 0.0f, 0.0f}, {0.0f, 5.0f, 1.0f}};
  const kvfuse::eval::TeacherForced same = kvfuse::eval::teacher_forced(full, full);
  CHECK(same.kl_mean == 0.0);
  CHECK(same.top1_agreement == 1.0);
  CHECK(same.tokens == 3);
  std::vector<std::vector<float>> method = full;
  method[1] = {0.0f, 3.0f, 0.0f};  // another top-1 on token 1
  const kvfuse::eval::TeacherForced t = kvfuse::eval::teacher_forced(full, method);
  CHECK(t.top1_agreement == doctest::Approx(2.0 / 3.0));
  CHECK(t.kl_mean == doctest::Approx(kl_divergence(full[1], method[1]) / 3.0));
  CHECK(t.kl_mean > 0.0);
  CHECK_THROWS_WITH_AS((void)kvfuse::eval::teacher_forced(full, std::span(method).first(2)),
                       doctest::Contains("3 reference distributions but 2"), kvfuse::error);
  CHECK_THROWS_AS((void)kvfuse::eval::teacher_forced({}, {}), kvfuse::error);
}

}  // namespace unit_eval_metrics
