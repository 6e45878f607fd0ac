#!/usr/bin/env python3
"""Writes tests/data/qwen2_cases.txt: llama.cpp's reference values for tests/unit/qwen2.cpp on
Qwen2.5-Coder-0.5B-Instruct (Q4_K_M GGUF, scripts/fetch_model.sh qwen2).

Reference: llama.cpp itself, through tests/data/qwen2_llamacpp_reference.cpp (its C API), built by hand against
the llama.cpp source scripts/fetch_llamacpp.sh fetches (llama-cpp-python 0.3.36's vendored copy):
  L=~/.cache/kvfuse/llama.cpp-0.3.36 B=build/llamacpp-ref
  cmake -S $L -B $B -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=OFF -DGGML_OPENMP=OFF -DLLAMA_CURL=OFF \\
        -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_TOOLS=OFF -DLLAMA_BUILD_SERVER=OFF \\
        -DLLAMA_BUILD_COMMON=OFF && cmake --build $B --target llama
  g++ -std=c++17 -O2 tests/data/qwen2_llamacpp_reference.cpp -I$L/include -I$L/ggml/include \\
      $B/src/libllama.a $B/ggml/src/libggml.a $B/ggml/src/libggml-cpu.a $B/ggml/src/libggml-base.a \\
      -lpthread -ldl -lm -o $B/qwen2_llamacpp_reference
  $B/qwen2_llamacpp_reference dequant MODEL $B/qwen2-f32.gguf       # every tensor F32 (2.5 GB)

Usage: python3 tests/data/make_qwen2_cases.py --reference $B/qwen2_llamacpp_reference --f32-model $B/qwen2-f32.gguf
           [--model PATH] [--musique PATH] [--out PATH]
Needs: pip install jinja2

Output format (case_format.py: TAB-separated, text escaped, ids space-separated), '#' starts a comment line:
  encode  <parse_special 0|1>  <text>  <ids>
          ids = llama_tokenize(text, add_special = true, parse_special) (Qwen2 adds no BOS)
  chat    <rendered text>  <ids>  <role>  <content>  [<role>  <content> ...]
          the GGUF's chat template rendered by jinja2 as transformers renders it (trim_blocks, lstrip_blocks,
          add_generation_prompt = true); ids = llama_tokenize(rendered, true, parse_special = true)
  rag     <ids>  <system>  <question>  <passage>  [<passage> ...]
          build_rag_prompt's ChatML layout as one string, ids = llama_tokenize(prompt, true, true)
  logits  <reference>  <prompt ids>  <max |logit|>  <id:logit ...>
          full prefill of the prompt in llama.cpp, its last position: the 20 largest logits
  greedy  <reference>  <prompt ids>  <ids>
          llama.cpp's greedy continuation (16 tokens, stopping after an end-of-generation token)
  <reference>: "f32" (every tensor dequantized to F32, F32 K/V cache: llama.cpp computing in fp32) or
  "q4_k_m" (the file as shipped, llama.cpp's defaults: Q8 activations in the quantized products, F16 K/V).
"""

import argparse
import datetime
import json
import os
import subprocess

import jinja2
from jinja2.sandbox import ImmutableSandboxedEnvironment

from case_format import cached_model_path, escape, ids_field

RAG_SYSTEM = "You answer questions using only the documents the user gives. Answer in a few words."
CHAT_SYSTEM = "You are a helpful assistant."
CHAT_QUESTION = "What is the capital of France, and what river runs through it?"

TEXTS = [
    "",
    "Hello world",
    "Hello, World! How are you?",
    " leading space",
    "  two leading spaces",
    "trailing spaces   ",
    "multiple   spaces    between",
    "   ",
    "tabs\tand\ttabs",
    "new\nline",
    "two\n\nnewlines and three\n\n\nend",
    "\r\n windows line\r\nend",
    "mixed \t \n whitespace \n\n\n end \n",
    "don't I'LL we're they've O'Neil's",
    "3.14159",
    "1,000,000",
    "12345678901234567890",
    "in 2024 and 1999.",
    " 42 is the answer",
    "a1b2c3 x86_64 v2.0.1",
    "...!!!???",
    "$100 + 50% = #1 @home ~ ^ | `",
    "C++ && || -> :: != ==",
    "def f(x):\n    return x * 2\n\n\nclass A:\n\tpass\n",
    "caf\u00e9 na\u00efve r\u00e9sum\u00e9 \u00c9cole \u00fcber Stra\u00dfe",
    "\u0395\u03bb\u03bb\u03b7\u03bd\u03b9\u03ba\u03ac and \u041f\u0440\u0438\u0432\u0435\u0442 \u043c\u0438\u0440",
    "\u65e5\u672c\u8a9e\u306e\u30c6\u30ad\u30b9\u30c8 \u4e2d\u6587\u5b57\u7b26 \ud55c\uad6d\uc5b4 \u0661\u0662\u0663",
    "emoji \U0001F600\U0001F389 and \U0001F469\u200d\U0001F469\u200d\U0001F467 family",
    "em\u2014dash \u2013 en \u2026 ellipsis \u201csmart quotes\u201d",
    "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n",
    "<|endoftext|>text<|im_end|>more",
    "<|fim_prefix|>a<|fim_suffix|>b<|fim_middle|>",
]


class Reference:
    def __init__(self, tool, model):
        self.tool, self.model = tool, model

    def run(self, args, stdin):
        return subprocess.run([self.tool] + args, input=stdin, capture_output=True, text=True, check=True).stdout

    def template(self):
        return self.run(["template", self.model], "")

    def tokenize(self, texts_special):
        """[(text, parse_special)] -> [ids]: one llama_tokenize per text."""
        out = self.run(["tok", self.model], "".join(f"{int(s)}\t{escape(t)}\n" for t, s in texts_special))
        return [[int(i) for i in line.split()] for line in out.split("\n")[:len(texts_special)]]

    def eval(self, model, kv_type, ids, n_gen=16):
        lines = self.run(["eval", model, kv_type, str(n_gen)], ids_field(ids)).splitlines()
        max_abs = float(lines[0].split()[1])
        top = [(int(a), float(b)) for a, b in (line.split() for line in lines[1:21])]
        greedy = [int(i) for i in lines[21].split()[1:]]
        return max_abs, top, greedy


def render_chat(source, messages):
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    return env.from_string(source).render(messages=messages, add_generation_prompt=True)


def rag_text(passages, question):
    docs = "".join(f"Document: {p.strip()}\n" for p in passages)
    return (f"<|im_start|>system\n{RAG_SYSTEM}<|im_end|>\n<|im_start|>user\n{docs}Question: {question}<|im_end|>\n"
            "<|im_start|>assistant\n")


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    ap = argparse.ArgumentParser()
    ap.add_argument("--reference", required=True, help="the built qwen2_llamacpp_reference")
    ap.add_argument("--model", default=cached_model_path("KVFUSE_QWEN2_MODEL",
                                                         "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf"))
    ap.add_argument("--f32-model", required=True, help="the model with every tensor F32 (the tool's dequant)")
    ap.add_argument("--musique", default=os.path.join(here, "..", "..", "..", "shared", "data", "musique_dev.json"))
    ap.add_argument("--out", default=os.path.join(here, "qwen2_cases.txt"))
    args = ap.parse_args()
    ref = Reference(args.reference, args.model)
    questions = json.load(open(args.musique))
    musique = []
    for q in questions[:2]:
        musique += [c["text"] for c in q["ctxs"][:4]] + [q["question"]]

    lines = [
        "# llama.cpp's reference values for tests/unit/qwen2.cpp, written by tests/data/make_qwen2_cases.py.",
        f"# Model: {os.path.basename(args.model)}; llama.cpp 0.3.36 (llama-cpp-python's vendored copy); "
        f"jinja2 {jinja2.__version__}; {datetime.date.today().isoformat()}.",
        "# Format: see the script's docstring.",
    ]
    encodes = [(t, s) for t in TEXTS + musique for s in (True, False)]
    for (text, special), ids in zip(encodes, ref.tokenize(encodes)):
        lines.append(f"encode\t{int(special)}\t{escape(text)}\t{ids_field(ids)}")

    source = ref.template()
    chats = [
        [{"role": "system", "content": CHAT_SYSTEM}, {"role": "user", "content": CHAT_QUESTION}],
        [{"role": "user", "content": CHAT_QUESTION}],  # the template's default system message
        [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"},
         {"role": "assistant", "content": "Hello! How can I help?"}, {"role": "user", "content": "Count to 3."}],
    ]
    rendered = [render_chat(source, m) for m in chats]
    for messages, text, ids in zip(chats, rendered, ref.tokenize([(t, True) for t in rendered])):
        fields = [escape(x) for m in messages for x in (m["role"], m["content"])]
        lines.append("\t".join(["chat", escape(text), ids_field(ids)] + fields))

    rags = [(q["question"], [c["text"] for c in q["ctxs"][:n]]) for q, n in
            zip(questions[:2], (2, 3))]
    for (question, passages), ids in zip(rags, ref.tokenize([(rag_text(p, q), True) for q, p in rags])):
        lines.append("\t".join(["rag", ids_field(ids), escape(RAG_SYSTEM), escape(question)] +
                               [escape(p) for p in passages]))

    prompt = ref.tokenize([(rendered[0], True)])[0]
    for name, model, kv in (("f32", args.f32_model, "f32"), ("q4_k_m", args.model, "f16")):
        max_abs, top, greedy = ref.eval(model, kv, prompt)
        lines.append(f"logits\t{name}\t{ids_field(prompt)}\t{max_abs!r}\t" +
                     " ".join(f"{i}:{v!r}" for i, v in top))
        lines.append(f"greedy\t{name}\t{ids_field(prompt)}\t{ids_field(greedy)}")
    with open(args.out, "w", encoding="utf-8") as f:
        f.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
