// kvfuse-bench's main: Google Benchmark's own, after refusing a check-only build (kvfuse/harness/bench_build.hpp).
#include <benchmark/benchmark.h>

#include "kvfuse/harness/bench_build.hpp"

int main(int argc, char** argv) {
  kvfuse::harness::refuse_check_only_build("kvfuse-bench");
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
