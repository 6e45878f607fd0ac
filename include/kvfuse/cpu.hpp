#pragma once
// Umbrella header of kvfuse::cpu: real models on the CPU — GGUF files, the byte-level BPE and SentencePiece
// tokenizers and the chat template, the Eigen reference Llama backend (CpuLlamaFusion runs every reuse method
// of FusionPipeline; CpuBatchEngine batches requests), with the stores it is used with. Needs Eigen 3.4 and
// PCRE2 (link kvfuse::cpu). The policies alone need only kvfuse/kvfuse.hpp.

#include "kvfuse/kvfuse.hpp"
#include "kvfuse/runtime.hpp"
#include "kvfuse/stores.hpp"

#include "kvfuse/model/gguf.hpp"
#include "kvfuse/model/tokenizer.hpp"

#include "kvfuse/backend/cpu/batch_engine.hpp"
#include "kvfuse/backend/cpu/compute_speed.hpp"
#include "kvfuse/backend/cpu_llama.hpp"

