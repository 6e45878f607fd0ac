#pragma once
// Umbrella header of the quality metrics a reuse method is judged by: KL divergence of next-token
// distributions against full prefill, exact match and ROUGE-L against the full-prefill answer, token F1
// against gold answers (SQuAD normalization). The policies alone: kvfuse/kvfuse.hpp.

#include "kvfuse/eval/metrics.hpp"
