#pragma once
// Umbrella header of kvfuse::cpu: real models on the CPU — GGUF files, the byte-level BPE tokenizer and
// chat / RAG prompt layout, the Eigen reference Llama backend (CpuLlamaFusion runs every reuse method
// of FusionPipeline), with the stores and metrics it is used with, and the per-model correctness gate's
// teacher-forced evaluator and calibration files (eval/calibrate.hpp). Needs Eigen 3.4 and PCRE2 (link
// kvfuse::cpu). The policies alone need only kvfuse/kvfuse.hpp.

#include "kvfuse/eval.hpp"
#include "kvfuse/kvfuse.hpp"
#include "kvfuse/runtime.hpp"
#include "kvfuse/stores.hpp"

#include "kvfuse/model/gguf.hpp"
#include "kvfuse/model/tokenizer.hpp"

#include "kvfuse/backend/cpu/batch_engine.hpp"
#include "kvfuse/backend/cpu_llama.hpp"

#include "kvfuse/eval/calibrate.hpp"
