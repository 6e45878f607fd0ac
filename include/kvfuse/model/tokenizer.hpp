#pragma once
// The tokenizer of kvfuse::cpu, one concern per header:
//   model/vocab.hpp           TokenizerVocab (a GGUF file's tokenizer tables), TokenType, kNoToken
//   model/text_tokenizer.hpp  Tokenizer: llama.cpp's byte-level BPE or SentencePiece BPE, as the GGUF file
//                             says (encode, tokenize, decode, special tokens); BPETokenizer (BPE only)
//   model/chat_template.hpp   ChatTemplate, ChatMessage (ChatML)
//   internals (kvfuse::detail): model/bpe.hpp (BPEModel), model/spm.hpp (SPMModel), model/token_index.hpp
//   (TokenIndex: token texts, pieces, special-token partition), model/pretokenizer.hpp (llama.cpp's
//   pre-tokenizer regexes), model/regex.hpp (PCRE2), model/byte_map.hpp (GPT-2's byte -> unicode map),
//   model/utf8.hpp
//
// When to use
//   To turn text into the token ids a GGUF model was trained with — byte-level BPE (`tokenizer.ggml.model`
//   "gpt2": SmolLM2, Qwen2, Llama 3) or SentencePiece BPE ("llama": Llama 2, Gemma 3) — to format chat
//   prompts for it (ChatML templates only, e.g. SmolLM2, Qwen2). (The RAG prompt format of kvfuse's evaluation
//   harness, separately tokenized passages, is harness/include/kvfuse/harness/rag_prompt.hpp.)
//   Not for WordPiece ("bert"), Unigram ("t5") or RWKV vocabularies.
//
// Dependencies: PCRE2 8-bit (Debian libpcre2-dev; pkg-config module `libpcre2-8`), linked by kvfuse::cpu.

#include "kvfuse/model/chat_template.hpp"
#include "kvfuse/model/text_tokenizer.hpp"
#include "kvfuse/model/vocab.hpp"
