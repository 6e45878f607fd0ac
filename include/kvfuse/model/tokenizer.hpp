#pragma once
// The tokenizer of kvfuse::cpu, one concern per header:
//   model/vocab.hpp          TokenizerVocab (a GGUF file's tokenizer tables), TokenType, kNoToken
//   model/bpe.hpp            BPETokenizer: llama.cpp's byte-level BPE (encode, decode, special tokens)
//   model/chat_template.hpp  ChatTemplate, ChatMessage (ChatML)
//   model/rag_prompt.hpp     build_rag_prompt, RagPrompt (one token range per passage)
//   internals (kvfuse::detail): model/pretokenizer.hpp (llama.cpp's pre-tokenizer regexes),
//   model/regex.hpp (PCRE2), model/byte_map.hpp (GPT-2's byte -> unicode map), model/utf8.hpp
//
// When to use
//   To turn text into the token ids a GGUF Llama-architecture model was trained with, to format chat
//   prompts for it (ChatML templates only, e.g. SmolLM2, Qwen2), and to build a RAG prompt whose passages
//   are separately tokenized chunks, which is what a chunk KV cache (CacheBlend, Epic, Cache-Craft) stores.
//   Not for SentencePiece ("llama"), WordPiece ("bert") or Unigram ("t5") vocabularies.
//
// Dependencies: PCRE2 8-bit (Debian libpcre2-dev; pkg-config module `libpcre2-8`), linked by kvfuse::cpu.

#include "kvfuse/model/bpe.hpp"
#include "kvfuse/model/chat_template.hpp"
#include "kvfuse/model/rag_prompt.hpp"
#include "kvfuse/model/vocab.hpp"
