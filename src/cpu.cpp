// kvfuse::cpu compiled once: the out-of-class definitions of the CPU engine (GGUF reading, tokenizers, model
// config and weights, the forward pass, the ComputeBackend / FusionBackend models), which the headers leave out
// when KVFUSE_CPU_SEPARATE_COMPILATION is defined (core/config.hpp). Header-only use needs none of this; a
// program that includes kvfuse/cpu.hpp in many files compiles the engine once by defining the macro everywhere
// and linking this file (kvfuse's own binaries: the kvfuse_cpu_compiled target of CMakeLists.txt).
#ifndef KVFUSE_CPU_SEPARATE_COMPILATION
#error "src/cpu.cpp is compiled with KVFUSE_CPU_SEPARATE_COMPILATION defined (CMake: kvfuse_cpu_compiled)"
#endif

#include "kvfuse/model/gguf_impl.hpp"
#include "kvfuse/model/token_index_impl.hpp"
#include "kvfuse/model/bpe_impl.hpp"
#include "kvfuse/model/spm_impl.hpp"
#include "kvfuse/model/text_tokenizer_impl.hpp"
#include "kvfuse/backend/cpu/llama_config_impl.hpp"
#include "kvfuse/backend/cpu/llama_impl.hpp"
#include "kvfuse/backend/cpu_llama_impl.hpp"
