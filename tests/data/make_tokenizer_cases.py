#!/usr/bin/env python3
"""Writes tests/data/tokenizer_cases.txt: reference token ids for tests/unit/tokenizer.cpp.

Reference tokenizer: Hugging Face `tokenizers`, built from the GGUF's own vocabulary and merges by
transformers' GGUF tokenizer converter (transformers.integrations.gguf.gguf_tokenizer_mapping.
convert_gguf_tokenizer; the metadata is read with the `gguf` package because transformers' own GGUF reader
needs torch). The converter gives every byte-level file a plain ByteLevel pre-tokenizer, so the
pre-tokenizer of each case is set explicitly:
  smollm  Sequence[Digits(individual_digits=True), ByteLevel(add_prefix_space=False, use_regex=True)],
          the pre-tokenizer of SmolLM2's tokenizer.json (llama.cpp: "\\p{N}", then the GPT-2 regex);
  gpt-2   ByteLevel(add_prefix_space=False, use_regex=True);
  llama3  Split(llama.cpp's Llama 3 regex, isolated) + ByteLevel(use_regex=False), BPE ignore_merges;
  default Split isolated by each of llama.cpp's four default regexes + ByteLevel(use_regex=False).
Control tokens (token type 3) are added as special tokens by the converter; parse_special = 0 cases are
encoded with `encode_special_tokens = True` (special-token text tokenized as plain text).
Chat cases are rendered from the GGUF's chat template with jinja2, configured as transformers renders
chat templates (trim_blocks, lstrip_blocks).

Usage: python3 tests/data/make_tokenizer_cases.py [--model PATH] [--musique PATH] [--out PATH]
Needs: pip install gguf transformers tokenizers jinja2   (no torch)

Output format, one record per line, fields separated by TAB, '#' starts a comment line:
  encode  <pre-tokenizer>  <parse_special 0|1>  <text>  <ids>
  chat    <add_generation_prompt 0|1>  <rendered text>  <ids>  <role>  <content>  [<role>  <content> ...]
  rag     <ids>  <system>  <question>  <passage>  [<passage> ...]
Text fields are escaped: \\\\ \\t \\n \\r, and \\xHH for every other byte outside printable ASCII (UTF-8 bytes
one by one). <ids> is a space-separated list of decimal token ids (empty for no tokens).
"""

import argparse
import importlib.metadata
import json
import os
import sys

import gguf
import jinja2
import tokenizers
import transformers
from jinja2.sandbox import ImmutableSandboxedEnvironment
from tokenizers import Regex, Tokenizer, pre_tokenizers
from transformers.integrations.gguf.gguf_tokenizer_mapping import convert_gguf_tokenizer

from case_format import cached_model_path, escape, ids_field

GPT2_REGEX = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"
LLAMA3_REGEX = (r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
                r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
DEFAULT_REGEXES = [r"[\p{P}\$\+<=>\^~\|]+", GPT2_REGEX, r"\p{N}+", r"[0-9][0-9][0-9]"]

RAG_SYSTEM = "You answer questions using only the documents the user gives. Answer in a few words."

TEXTS = [
    "",
    "Hello world",
    "Hello, World! How are you?",
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
    "don't",
    "I'LL",
    "we're they've I'm he'd it's you'll",
    "'s alone and ' apostrophe '",
    "O'Neil's rock'n'roll",
    "3.14159",
    "1,000,000",
    "12345678901234567890",
    "in 2024 and 1999.",
    " 42 is the answer",
    "a1b2c3 x86_64 v2.0.1",
    "\u0663\u0664\u0665 Arabic-Indic digits",
    "\u216b roman twelve, \u00bd half, x\u00b2 squared",
    "caf\u00e9 na\u00efve r\u00e9sum\u00e9",
    "e\u0301 combining acute, n\u0303 tilde",
    "\u0395\u03bb\u03bb\u03b7\u03bd\u03b9\u03ba\u03ac and \u041f\u0440\u0438\u0432\u0435\u0442 \u043c\u0438\u0440",
    "\u65e5\u672c\u8a9e\u306e\u30c6\u30ad\u30b9\u30c8 \u4e2d\u6587\u5b57\u7b26 \ud55c\uad6d\uc5b4",
    "emoji \U0001F600\U0001F389 and \U0001F469\u200d\U0001F469\u200d\U0001F467 family \U0001F1EB\U0001F1F7",
    "zero\u200bwidth nbsp\u00a0here ideographic\u3000space",
    "em\u2014dash \u2013 en \u2026 ellipsis",
    "\u201csmart quotes\u201d \u2018single\u2019",
    "...!!!???",
    "(a) [b] {c} <d>",
    "$100 + 50% = #1 @home ~ ^ | `",
    "C++ && || -> :: != ==",
    "a_b-c.d/e\\f",
    "=" * 40,
    "def f(x):\n    return x * 2\n",
    "<|im_start|>user\nhi<|im_end|>\n",
    "text<|endoftext|>more",
    "<|im_start|><|im_end|>",
    "<|im_start",
    "<reponame>x<repo_name>y<file_sep>",
    "\U0001F44B",
    "control\x01char and \x7f del",
    "t\x04he th\x14e: SmolLM2 has no token for U+0004 or U+0014",
    "plane five \U00050000 has lead byte F1, no token either",
]

CHATS = [
    (True, [("user", "Hi there!")]),
    (False, [("user", "Hi there!")]),
    (True, [("system", "You are terse."), ("user", "What is 2+2?")]),
    (True, [("system", "Be brief."), ("user", "Name a color."), ("assistant", "Blue."), ("user", "Another?")]),
    (True, []),
    (True, [("user", "line one\nline two\n\n  indented")]),
]


def read_tokenizer_dict(path):
    reader = gguf.GGUFReader(path)

    def get(key, default=None):
        field = reader.fields.get(key)
        return default if field is None else field.contents()

    d = {
        "tokenizer_type": get("tokenizer.ggml.model"),
        "pre_tokenizer_type": get("tokenizer.ggml.pre"),
        "tokens": get("tokenizer.ggml.tokens"),
        "token_type": get("tokenizer.ggml.token_type"),
        "merges": get("tokenizer.ggml.merges"),
        "bos_token_id": get("tokenizer.ggml.bos_token_id"),
        "eos_token_id": get("tokenizer.ggml.eos_token_id"),
    }
    return d, get("general.architecture"), get("tokenizer.chat_template")


def with_pre_tokenizer(base, name):
    tok = Tokenizer.from_str(base.to_str())
    no_regex = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    if name == "smollm":
        tok.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Digits(individual_digits=True),
            pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=True)])
    elif name == "gpt-2":
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=True)
    elif name == "llama3":
        j = json.loads(tok.to_str())
        j["model"]["ignore_merges"] = True
        tok = Tokenizer.from_str(json.dumps(j))
        tok.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(LLAMA3_REGEX), behavior="isolated"), no_regex])
    elif name == "default":
        tok.pre_tokenizer = pre_tokenizers.Sequence(
            [pre_tokenizers.Split(Regex(r), behavior="isolated") for r in DEFAULT_REGEXES] + [no_regex])
    else:
        raise SystemExit(f"no reference pre-tokenizer for {name!r}")
    return tok


def encode(tok, text, parse_special):
    tok.encode_special_tokens = not parse_special
    ids = tok.encode(text, add_special_tokens=False).ids
    tok.encode_special_tokens = False
    return ids


def rag_user_message(passages, question):
    return "".join(f"Document: {p.strip()}\n" for p in passages) + f"Question: {question}"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default=cached_model_path("KVFUSE_MODEL", "SmolLM2-135M-Instruct.Q4_1.gguf"))
    ap.add_argument("--musique", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "..",
                                                     "shared", "data", "musique_dev.json"))
    ap.add_argument("--rag-questions", type=int, default=1,
                    help="MuSiQue questions to write rag records for (all 10 passages each beyond the first)")
    ap.add_argument("--out", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "tokenizer_cases.txt"))
    args = ap.parse_args()

    tokenizer_dict, architecture, chat_template = read_tokenizer_dict(args.model)
    if tokenizer_dict["pre_tokenizer_type"] != "smollm":
        raise SystemExit(f"expected SmolLM2's tokenizer (pre 'smollm'), got {tokenizer_dict['pre_tokenizer_type']!r}")
    base, _ = convert_gguf_tokenizer(architecture, tokenizer_dict)
    refs = {name: with_pre_tokenizer(base, name) for name in ("smollm", "gpt-2", "llama3", "default")}

    with open(args.musique) as f:
        musique = json.load(f)
    passages = [c["text"] for c in musique[0]["ctxs"][:3]]
    question = musique[0]["question"]

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    template = env.from_string(chat_template)

    lines = [
        "# Reference token ids for tests/unit/tokenizer.cpp, written by tests/data/make_tokenizer_cases.py.",
        f"# Model: {os.path.basename(args.model)}; transformers {transformers.__version__}, tokenizers "
        f"{tokenizers.__version__}, gguf {importlib.metadata.version('gguf')}, jinja2 {jinja2.__version__}.",
        "# Format: see the script's docstring.",
    ]
    texts = TEXTS + passages
    for name, ref in refs.items():
        for text in texts:
            for parse_special in (1, 0):
                if parse_special == 0 and "<" not in text:
                    continue
                ids = encode(ref, text, parse_special)
                lines.append("\t".join(["encode", name, str(parse_special), escape(text), ids_field(ids)]))

    for add_gen, chat in CHATS:
        messages = [{"role": r, "content": c} for r, c in chat]
        rendered = template.render(messages=messages, add_generation_prompt=add_gen)
        ids = encode(refs["smollm"], rendered, 1)
        fields = ["chat", str(int(add_gen)), escape(rendered), ids_field(ids)]
        for r, c in chat:
            fields += [escape(r), escape(c)]
        lines.append("\t".join(fields))

    for q in range(args.rag_questions):
        # The first record uses the three passages above; further ones (local checks) all ten of a question.
        rag_passages = passages if q == 0 else [c["text"] for c in musique[q]["ctxs"]]
        rag_question = musique[q]["question"]
        rendered = template.render(messages=[{"role": "system", "content": RAG_SYSTEM},
                                             {"role": "user", "content": rag_user_message(rag_passages, rag_question)}],
                                   add_generation_prompt=True)
        ids = encode(refs["smollm"], rendered, 1)
        lines.append("\t".join(["rag", ids_field(ids), escape(RAG_SYSTEM), escape(rag_question)] +
                               [escape(p) for p in rag_passages]))

    # Informational: transformers' own GGUF tokenizer (plain ByteLevel, no digit split) against the smollm one.
    differ = [t for t in texts if encode(base, t, 1) != encode(refs["smollm"], t, 1)]
    print(f"{len(differ)} of {len(texts)} texts tokenize differently without the Digits split: {differ!r}",
          file=sys.stderr)

    with open(args.out, "w", encoding="ascii", newline="\n") as f:
        f.write("\n".join(lines) + "\n")
    print(f"wrote {len(lines)} lines to {args.out}", file=sys.stderr)


if __name__ == "__main__":
    main()
