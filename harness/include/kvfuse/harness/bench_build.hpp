#pragma once
// A benchmark built only to check that it compiles (KVFUSE_BENCH_CHECK_ONLY: the ci preset builds kvfuse's host
// benchmarks at -O0) measures nothing worth reporting, so it refuses to run. Measure with the bench preset.
#include <cstdio>
#include <cstdlib>

namespace kvfuse::harness {

// Called first in every host benchmark's main: exits with status 2 and says why in a check-only build.
inline void refuse_check_only_build([[maybe_unused]] const char* program) {
#ifdef KVFUSE_BENCH_CHECK_ONLY
  std::fprintf(stderr,
               "%s: this build only checks that the benchmarks compile (KVFUSE_BENCH_CHECK_ONLY=ON, -O0: the ci "
               "preset); measure with the bench preset's build: cmake --preset bench && cmake --build --preset bench\n",
               program);
  std::exit(2);
#endif
}

}  // namespace kvfuse::harness
