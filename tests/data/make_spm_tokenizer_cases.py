#!/usr/bin/env python3
"""Writes tests/data/spm_tokenizer_cases.txt: reference token ids for tests/unit/tokenizer_spm.cpp.

Reference tokenizer: llama.cpp itself, through llama-cpp-python's ctypes bindings, on the Gemma 3 270M GGUF
(tokenizer.ggml.model "llama", i.e. llama.cpp's SentencePiece tokenizer llm_tokenizer_spm). The model is
loaded with Llama(model_path, vocab_only=True); ids come from llama_tokenize(vocab, text, add_special,
parse_special) and text from llama_detokenize(vocab, ids, remove_special=False, unparse_special), called
directly so that no Python-side post-processing is involved.

Cases in the committed file were produced by llama-cpp-python 0.3.36 built from its sdist
(CMAKE_ARGS="-DGGML_NATIVE=ON -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF"), whose vendored
llama.cpp is commit 0c1e57098bba43ac29e6e3b677cdceebdd22334f; the model file was gemma-3-270m-q4_k_m.gguf.

Usage: python3 tests/data/make_spm_tokenizer_cases.py [--model PATH] [--musique PATH] [--out PATH]
Needs: pip install llama-cpp-python (any build; the tokenizer does not depend on the CPU features)

Output format, one record per line, fields separated by TAB, '#' starts a comment line:
  encode  <parse_special 0|1>  <add_bos 0|1>  <text>  <ids>
          ids = llama_tokenize(text, add_special = add_bos, parse_special)
  decode  <special 0|1>  <ids>  <text>
          text = llama_detokenize(ids, remove_special = false, unparse_special = special)
  eog     <ids>
          every id llama_vocab_is_eog says ends generation
  rag     <ids>  <system>  <question>  <passage>  [<passage> ...]
          ids = llama_tokenize(prompt, add_special = true, parse_special = false) of build_rag_prompt's plain
          layout (no chat template): "{system}\\n" + "Document: {passage}\\n" each + "Question: {question}\\nAnswer:"
Text fields are escaped: \\\\ \\t \\n \\r, and \\xHH for every other byte outside printable ASCII (UTF-8 bytes
one by one). <ids> is a space-separated list of decimal token ids (empty for no tokens).
"""

import argparse
import ctypes
import json
import os
import sys

import llama_cpp

from case_format import cached_model_path, escape, ids_field

RAG_SYSTEM = "You answer questions using only the documents given. Answer in a few words."

TEXTS = [
    "",
    "Hello world",
    "Hello, World! How are you?",
    "The quick brown fox jumps over the lazy dog.",
    " leading space",
    "  two leading spaces",
    "trailing spaces   ",
    "multiple   spaces    between",
    "   ",
    " ",
    "tabs\tand\ttabs",
    "\t\tleading tabs",
    "new\nline",
    "two\n\nnewlines and three\n\n\nend",
    "\n",
    "\r\n windows line\r\nend",
    "mixed \t \n whitespace \n\n\n end \n",
    "line ending with space \nnext",
    "don't I'LL we're they've",
    "3.14159",
    "1,000,000",
    "12345678901234567890",
    "in 2024 and 1999.",
    " 42 is the answer",
    "a1b2c3 x86_64 v2.0.1",
    "...!!!???",
    "(a) [b] {c} <d>",
    "$100 + 50% = #1 @home ~ ^ | `",
    "C++ && || -> :: != ==",
    "a_b-c.d/e\\f",
    "=" * 40,
    "def f(x):\n    return x * 2\n",
    "caf\u00e9 na\u00efve r\u00e9sum\u00e9 \u00c9cole \u00fcber Stra\u00dfe",
    "e\u0301 combining acute, n\u0303 tilde",
    "\u0395\u03bb\u03bb\u03b7\u03bd\u03b9\u03ba\u03ac and \u041f\u0440\u0438\u0432\u0435\u0442 \u043c\u0438\u0440",
    "\u65e5\u672c\u8a9e\u306e\u30c6\u30ad\u30b9\u30c8 \u4e2d\u6587\u5b57\u7b26 \ud55c\uad6d\uc5b4",
    "emoji \U0001F600\U0001F389 and \U0001F469\u200d\U0001F469\u200d\U0001F467 family \U0001F1EB\U0001F1F7",
    "\U0001F44B",
    "zero\u200bwidth nbsp\u00a0here ideographic\u3000space",
    "em\u2014dash \u2013 en \u2026 ellipsis \u201csmart quotes\u201d",
    "U+2581 itself: \u2581 and \u2581\u2581x",
    # byte fallback: characters Gemma's vocabulary has no token for
    "control\x01char and \x7f del \x00 nul",
    "private use \ue000\uf8ff and plane 15 \U000F0000 plane 16 \U0010FFFD",
    "rare CJK extension B \U00020000\U0002A6D6 and Linear B \U00010000",
    # control and user-defined token text
    "<start_of_turn>user\nHi<end_of_turn>\n<start_of_turn>model\n",
    "<bos>text<eos>more",
    "<pad><unk><mask>",
    "<start_of_turn",
    "x<start_of_image>y<end_of_image>",
    "a</s>b: user-defined in the file, a control token to llama.cpp",
    "[multimodal] and <unused0> <unused6241>",
    "<h1>html</h1> <br>",
]


class Reference:
    def __init__(self, path):
        self.llm = llama_cpp.Llama(model_path=path, vocab_only=True, verbose=False)
        self.vocab = llama_cpp.llama_model_get_vocab(self.llm.model)

    def tokenize(self, text, add_special, parse_special):
        data = text.encode("utf-8")
        capacity = len(data) + 8
        buf = (llama_cpp.llama_token * capacity)()
        n = llama_cpp.llama_tokenize(self.vocab, data, len(data), buf, capacity, add_special, parse_special)
        if n < 0:
            raise RuntimeError(f"llama_tokenize needs {-n} tokens for {text!r}")
        return list(buf[:n])

    def detokenize(self, ids, special):
        arr = (llama_cpp.llama_token * max(1, len(ids)))(*ids)
        capacity = 64 + 64 * len(ids)
        buf = ctypes.create_string_buffer(capacity)
        n = llama_cpp.llama_detokenize(self.vocab, arr, len(ids), buf, capacity, False, special)
        if n < 0:
            raise RuntimeError(f"llama_detokenize needs {-n} bytes")
        return buf.raw[:n]


def rag_prompt(system, passages, question):
    return f"{system.strip()}\n" + "".join(f"Document: {p.strip()}\n" for p in passages) + \
        f"Question: {question}\nAnswer:"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default=cached_model_path("KVFUSE_GEMMA3_MODEL", "gemma-3-270m-q4_k_m.gguf"))
    ap.add_argument("--musique", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "..",
                                                     "shared", "data", "musique_dev.json"))
    ap.add_argument("--musique-texts", type=int, default=20, help="MuSiQue passages and questions to encode")
    ap.add_argument("--out", default=os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                                  "spm_tokenizer_cases.txt"))
    args = ap.parse_args()

    ref = Reference(args.model)
    with open(args.musique) as f:
        musique = json.load(f)
    # Questions 0.., one passage each from the first ones, then the questions themselves.
    musique_texts = []
    for q in range(args.musique_texts // 2):
        musique_texts.append(musique[q]["ctxs"][q % len(musique[q]["ctxs"])]["text"])
        musique_texts.append(musique[q]["question"])

    lines = [
        "# Reference token ids for tests/unit/tokenizer_spm.cpp, written by tests/data/make_spm_tokenizer_cases.py.",
        f"# Model: {os.path.basename(args.model)}; llama-cpp-python {llama_cpp.__version__} (llama.cpp's "
        "llm_tokenizer_spm).",
        "# Format: see the script's docstring.",
    ]
    for text in TEXTS + musique_texts:
        for parse_special in (1, 0):
            if parse_special == 0 and "<" not in text:
                continue
            for add_bos in (1, 0) if text in TEXTS else (1,):
                ids = ref.tokenize(text, bool(add_bos), bool(parse_special))
                lines.append("\t".join(["encode", str(parse_special), str(add_bos), escape(text), ids_field(ids)]))

    # Decoding: every token type (control, user-defined, normal with U+2581, byte tokens of one character).
    decode_texts = ["<bos>Hello world<eos>", "<start_of_turn>user\n\tcaf\u00e9\U000F0000 \u65e5\u672c<end_of_turn>\n",
                    "  two\n\n\nspaces \U0001F600", "<pad><unk><mask>[multimodal]<unused0>"]
    for text in decode_texts:
        ids = ref.tokenize(text, False, True)
        for special in (1, 0):
            lines.append("\t".join(["decode", str(special), ids_field(ids), escape(ref.detokenize(ids, bool(special)))]))
    byte0 = ref.tokenize("\x00", False, False)[0]  # the id of "<0x00>"; "<0xHH>" is byte0 + 0xHH
    singles = [[2], [1], [3], [106], [107], [212], ref.tokenize(" ", False, False), [byte0 + 0xC3, byte0 + 0xA9],
               [byte0 + 0xE6], [2, byte0 + 0x20, byte0 + 0x41]]
    for ids in singles:
        for special in (1, 0):
            lines.append("\t".join(["decode", str(special), ids_field(ids), escape(ref.detokenize(ids, bool(special)))]))

    n_vocab = llama_cpp.llama_vocab_n_tokens(ref.vocab)
    lines.append("\t".join(["eog", ids_field(i for i in range(n_vocab) if llama_cpp.llama_vocab_is_eog(ref.vocab, i))]))

    for q, n_passages in ((0, 3), (1, 10)):
        passages = [c["text"] for c in musique[q]["ctxs"][:n_passages]]
        ids = ref.tokenize(rag_prompt(RAG_SYSTEM, passages, musique[q]["question"]), True, False)
        lines.append("\t".join(["rag", ids_field(ids), escape(RAG_SYSTEM), escape(musique[q]["question"])] +
                               [escape(p) for p in passages]))

    with open(args.out, "w", encoding="ascii", newline="\n") as f:
        f.write("\n".join(lines) + "\n")
    print(f"wrote {len(lines)} lines to {args.out}", file=sys.stderr)


if __name__ == "__main__":
    main()
