// The unit-test binary's main: doctest, plus exit code 77 ("skipped" for CTest, SKIP_RETURN_CODE) when no
// check failed but a test case could not run (kvfuse_test::skip, tests/support/model_path.hpp).
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include "support/model_path.hpp"

int main(int argc, char** argv) {
  doctest::Context context(argc, argv);
  const int failed = context.run();
  if (context.shouldExit() || failed != 0) return failed;
  return kvfuse_test::skipped_cases() > 0 ? 77 : 0;
}
