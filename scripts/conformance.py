#!/usr/bin/env python3
"""Conformance of kvfuse's reference CPU backend against llama.cpp on the same token ids.

Usage:
  python3 scripts/conformance.py --kvfuse-logits PATH --model GGUF [--data musique_dev.json]
                                 [--prompts chat,rag2,rag3,rag10,text] [--long N] [--stride-long K]
                                 [--no-f32] [--f32-path GGUF] [--threads T] [--generate N]
(--data defaults to ../shared/data/musique_dev.json from the repository root.)

For each prompt (a ChatML question, MuSiQue RAG prompts with 2, 3 and 10 passages in build_rag_prompt's
layout, a plain-text paragraph):
  - tokenization: kvfuse's Tokenizer (kvfuse-logits --text ... --tokenize) against llama.cpp's
    (Llama.tokenize(text, add_bos=True, special=True): BOS where the vocabulary adds one, as kvfuse-logits
    does); the ChatML question goes through kvfuse's chat template (--chat) on one side and the GGUF's Jinja
    template rendered by jinja2 on the other (a base model without a template, Gemma 3 270M, skips it and
    gets the RAG prompts in build_rag_prompt's plain-text layout);
  - logits on llama.cpp's token ids: kvfuse-logits --ids ... --out (full prefill, logits of every position,
    or every K-th back from the last for prompts longer than --long tokens) against llama.cpp's
    (llama-cpp-python, logits_all=True, Llama.eval), per position:
      top-1 agreement      argmax equal
      max relative error   max_v |a_v - b_v| / max_v |b_v|, the maximum over positions
      mean KL              KL(softmax(b) || softmax(a)) in nats, the mean over positions (b = llama.cpp)
    and the max relative error per position band (0-255, 256-1023, 1024-4095, 4096-);
  - the greedy continuation (--generate tokens, stopping at EOS) of both.
Three llama.cpp references:
  quantized          the GGUF as given (SmolLM2: Q4_1; Gemma 3: Q4_K / Q5_0 / Q6_K / Q8_0), llama.cpp defaults:
                     its CPU matmuls quantize the activations to Q8_0 / Q8_1 / Q8_K blocks before the
                     quantized dot products, and K / V are cached as F16.
  quantized, F32 KV  the same with an F32 KV cache: what is left is the activation quantization.
  F32      the same weights dequantized to F32 (gguf.quants.dequantize, written once to
           <model>.dequantized-f32.gguf next to --model, or --f32-path; ~540 MB) with an F32 KV cache: llama.cpp then computes in fp32 throughout, so what is left is the
           difference between two fp32 implementations of the same model (--no-f32 skips it).
kvfuse always runs the given GGUF (it dequantizes to fp32 on load).

Needs: pip install llama-cpp-python numpy gguf jinja2. Prints markdown tables to stdout.
"""

import argparse
import datetime
import json
import os
import platform
import subprocess
import sys
import tempfile
import time

import numpy as np

RAG_SYSTEM = "You answer questions using only the documents the user gives. Answer in a few words."
CHAT_QUESTION = "What is the capital of France, and what river runs through it?"
PLAIN_TEXT = (
    "The history of the printing press begins in the fifteenth century, when Johannes Gutenberg, a goldsmith "
    "from Mainz, combined a screw press with movable metal type, oil-based ink and a hand mould for casting "
    "letters. Within fifty years presses were running in more than 250 European cities, and by 1500 they had "
    "produced some 20 million volumes. Cheap books spread literacy, standardised languages and helped the "
    "ideas of the Renaissance, the Reformation and the Scientific Revolution travel faster than ever before. "
    "Historians still debate how much of this change the press caused and how much it merely accelerated."
)


def rag_text(passages, question, chat):
    """build_rag_prompt's layout as one string (kvfuse's tokenizer docs: equal to tokenizing the segments):
    ChatML for a model with a chat template, plain text for a base model (the BOS comes from tokenizing)."""
    docs = "".join(f"Document: {p.strip()}\n" for p in passages)
    if not chat:
        return f"{RAG_SYSTEM}\n{docs}Question: {question}\nAnswer:"
    user = docs + f"Question: {question}"
    return (f"<|im_start|>system\n{RAG_SYSTEM}<|im_end|>\n<|im_start|>user\n{user}<|im_end|>\n"
            "<|im_start|>assistant\n")


def run_tool(tool, args):
    p = subprocess.run([tool] + args, capture_output=True, text=True)
    if p.returncode != 0:
        sys.exit(f"conformance.py: {tool} {' '.join(a if len(a) < 80 else a[:80] + '...' for a in args)} "
                 f"failed ({p.returncode}):\n{p.stderr}")
    out = {}
    for line in p.stdout.splitlines():
        key, _, value = line.partition(": ")
        out[key] = value
    return out


def ids_of(field):
    return [int(x) for x in field.split(",")] if field else []


def softmax64(x):
    x = x.astype(np.float64)
    x = x - x.max(axis=-1, keepdims=True)
    e = np.exp(x)
    return e / e.sum(axis=-1, keepdims=True)


BANDS = [(0, 256), (256, 1024), (1024, 4096), (4096, 1 << 30)]


def compare(a, b, rows):
    """a: kvfuse logits, b: reference logits, both [rows][vocab]; rows: their positions."""
    top1 = float((a.argmax(1) == b.argmax(1)).mean())
    per_row = np.abs(a - b).max(1) / np.abs(b).max(1)
    rel = float(per_row.max())
    rows = np.asarray(rows)
    bands = [float(per_row[(rows >= lo) & (rows < hi)].max()) if ((rows >= lo) & (rows < hi)).any() else None
             for lo, hi in BANDS]
    kl = []
    for i in range(0, a.shape[0], 256):
        p = softmax64(b[i:i + 256])
        q = softmax64(a[i:i + 256])
        kl.append((p * (np.log(np.maximum(p, 1e-300)) - np.log(np.maximum(q, 1e-300)))).sum(1))
    return top1, rel, float(np.concatenate(kl).mean()), bands


def llama_greedy(m, ids, n, eos):
    m.reset()
    m.eval(ids)
    out = []
    logits = np.array(m.scores[len(ids) - 1])
    while len(out) < n:
        nxt = int(logits.argmax())
        if nxt == eos:
            break
        out.append(nxt)
        if len(out) == n:
            break
        m.eval([nxt])
        logits = np.array(m.scores[m.n_tokens - 1])
    return out


def llama_logits(m, ids, rows):
    m.reset()
    t0 = time.perf_counter()
    m.eval(ids)
    dt = time.perf_counter() - t0
    return np.array(m.scores[:len(ids)][rows], dtype=np.float32), dt


def dequantized_copy(src, dst):
    """Writes a GGUF with every tensor of src dequantized to F32 and the same metadata."""
    import gguf
    from gguf import quants
    reader = gguf.GGUFReader(src)
    arch = reader.fields[gguf.Keys.General.ARCHITECTURE].contents()
    tmp = dst + ".part"
    writer = gguf.GGUFWriter(tmp, arch)
    for field in reader.fields.values():
        if field.name == gguf.Keys.General.ARCHITECTURE or field.name.startswith("GGUF."):
            continue
        vtype = field.types[0]
        sub = field.types[-1] if vtype == gguf.GGUFValueType.ARRAY else None
        writer.add_key_value(field.name, field.contents(), vtype, sub_type=sub)
    for t in reader.tensors:
        writer.add_tensor(t.name, np.ascontiguousarray(quants.dequantize(t.data, t.tensor_type), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    os.replace(tmp, dst)


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--kvfuse-logits", required=True, help="path of the kvfuse-logits tool")
    ap.add_argument("--model", required=True, help="GGUF model file")
    ap.add_argument("--data", default=os.path.join(here, "..", "..", "shared", "data", "musique_dev.json"))
    ap.add_argument("--long", type=int, default=2048, help="prompts longer than this compare every K-th position")
    ap.add_argument("--stride-long", type=int, default=8, help="K for long prompts")
    ap.add_argument("--generate", type=int, default=20)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--no-f32", action="store_true", help="skip the F32 (dequantized) llama.cpp reference")
    ap.add_argument("--f32-path", default=None, help="where the dequantized GGUF goes (default: next to --model)")
    ap.add_argument("--prompts", default="chat,rag2,rag3,rag10,text", help="comma-separated subset")
    args = ap.parse_args()

    import jinja2.sandbox
    import llama_cpp

    for path, what in ((args.kvfuse_logits, "--kvfuse-logits"), (args.model, "--model"), (args.data, "--data")):
        if not os.path.isfile(path):
            sys.exit(f"conformance.py: {what} {path} is not a file")
    with open(args.data) as f:
        musique = json.load(f)

    tool = os.path.abspath(args.kvfuse_logits)
    q4 = llama_cpp.Llama(model_path=args.model, logits_all=True, n_ctx=64, verbose=False, vocab_only=True)
    template = q4.metadata.get("tokenizer.chat_template")  # absent for a base model (Gemma 3 270M)
    eos = int(q4.metadata["tokenizer.ggml.eos_token_id"])
    chat = template is not None
    prompts = {
        "rag2": ("MuSiQue q0, 2 passages", rag_text([c["text"] for c in musique[0]["ctxs"][:2]], musique[0]["question"], chat), None),
        "rag3": ("MuSiQue q1, 3 passages", rag_text([c["text"] for c in musique[1]["ctxs"][:3]], musique[1]["question"], chat), None),
        "rag10": ("MuSiQue q2, 10 passages", rag_text([c["text"] for c in musique[2]["ctxs"]], musique[2]["question"], chat), None),
        "text": ("plain paragraph", PLAIN_TEXT, None),
    }
    if chat:
        env = jinja2.sandbox.ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
        chat_text = env.from_string(template).render(messages=[{"role": "user", "content": CHAT_QUESTION}],
                                                     add_generation_prompt=True)
        prompts = {"chat": ("ChatML question", chat_text, ["--chat", "--text", CHAT_QUESTION]), **prompts}
    chosen = [p for p in args.prompts.split(",") if p and (chat or p != "chat")]  # no chat prompt without a template
    for p in chosen:
        if p not in prompts:
            sys.exit(f"conformance.py: unknown prompt '{p}' (known: {', '.join(prompts)})")

    # Tokenization.
    cases = []
    for key in chosen:
        name, text, tool_args = prompts[key]
        k = ids_of(run_tool(tool, ["--model", args.model, "--tokenize"] + (tool_args or ["--text", text]))["ids"])
        # add_bos: llama_tokenize's add_special, which adds BOS only where the vocabulary says so, as
        # kvfuse-logits does.
        ref = q4.tokenize(text.encode(), add_bos=True, special=True)
        first_diff = next((i for i, (x, y) in enumerate(zip(k, ref)) if x != y), min(len(k), len(ref)))
        cases.append({"key": key, "name": name, "ids": ref, "kvfuse_ids": k, "same_tokens": k == ref,
                      "first_diff": None if k == ref else first_diff})
    del q4

    work = tempfile.mkdtemp(prefix="kvfuse-conformance-")
    max_n = max(len(c["ids"]) for c in cases) + args.generate + 8

    # kvfuse.
    for c in cases:
        n = len(c["ids"])
        stride = args.stride_long if n > args.long else 1
        out = os.path.join(work, c["key"] + ".f32")
        t0 = time.perf_counter()
        r = run_tool(tool, ["--model", args.model, "--ids", ",".join(map(str, c["ids"])), "--out", out,
                            "--stride", str(stride), "--generate", str(args.generate), "--threads", str(args.threads)])
        c["kvfuse_s"] = time.perf_counter() - t0
        c["rows"] = ids_of(r["positions"])
        c["kvfuse_prefill_s"] = float(r["prefill_s"])
        c["kvfuse_logits"] = np.fromfile(out, dtype=np.float32).reshape(len(c["rows"]), -1)
        os.remove(out)
        c["kvfuse_gen"] = ids_of(r["generated_ids"])
        c["kvfuse_text"] = json.loads(r["generated_text"])
        print(f"[kvfuse] {c['key']}: {n} tokens, {len(c['rows'])} rows, {c['kvfuse_s']:.1f} s", file=sys.stderr)

    f32_kv = {"type_k": llama_cpp.GGML_TYPE_F32, "type_v": llama_cpp.GGML_TYPE_F32}
    refs = [("quantized", args.model, {}), ("quantized, F32 KV", args.model, f32_kv)]
    if not args.no_f32:
        f32 = args.f32_path or os.path.splitext(args.model)[0] + ".dequantized-f32.gguf"
        if not os.path.isfile(f32):
            print(f"[f32] writing {f32}", file=sys.stderr)
            dequantized_copy(args.model, f32)
        refs.append(("F32", f32, f32_kv))

    results = []
    for ref_name, path, extra in refs:
        m = llama_cpp.Llama(model_path=path, logits_all=True, n_ctx=max_n, n_batch=512, verbose=False,
                            n_threads=args.threads, n_threads_batch=args.threads, **extra)
        for c in cases:
            b, dt = llama_logits(m, c["ids"], c["rows"])
            top1, rel, kl, bands = compare(c["kvfuse_logits"], b, c["rows"])
            gen = llama_greedy(m, c["ids"], args.generate, eos)
            text = m.detokenize(gen).decode("utf-8", errors="replace")
            results.append({"key": c["key"], "ref": ref_name, "top1": top1, "rel": rel, "kl": kl, "bands": bands, "gen": gen,
                            "text": text, "eval_s": dt})
            print(f"[llama.cpp {ref_name}] {c['key']}: top1 {top1:.4f} rel {rel:.2e} kl {kl:.2e} ({dt:.1f} s)",
                  file=sys.stderr)
        del m

    def cell(s):
        return s.replace("|", "\\|").replace("\n", "⏎")

    print(f"Conformance of kvfuse's CPU backend against llama.cpp (llama-cpp-python {llama_cpp.__version__}), "
          f"{datetime.date.today()}, {platform.machine()} {os.cpu_count()} cores, threads {args.threads}")
    print(f"model: {os.path.basename(args.model)}\n")
    print("| prompt | tokens | tokenization (kvfuse vs llama.cpp) | llama.cpp | positions | top-1 agreement "
          "| max rel. error | mean KL (nats) | greedy 20 equal |")
    print("|---|---:|---|---|---:|---:|---:|---:|---|")
    for c in cases:
        tok = "identical" if c["same_tokens"] else (f"differ at {c['first_diff']} "
                                                    f"({len(c['kvfuse_ids'])} vs {len(c['ids'])} tokens)")
        for r in (r for r in results if r["key"] == c["key"]):
            pos = "all" if len(c["rows"]) == len(c["ids"]) else f"{len(c['rows'])} (every {c['rows'][1] - c['rows'][0]})"
            same = "yes" if r["gen"] == c["kvfuse_gen"] else next(
                (f"first {i}" for i, (x, y) in enumerate(zip(r["gen"], c["kvfuse_gen"])) if x != y),
                f"lengths {len(c['kvfuse_gen'])} / {len(r['gen'])}")
            print(f"| {c['name']} | {len(c['ids'])} | {tok} | {r['ref']} | {pos} | {r['top1']:.4f} | "
                  f"{r['rel']:.2e} | {r['kl']:.2e} | {same} |")
    print("\nMax relative error by position band:\n")
    print("| prompt | llama.cpp | " + " | ".join(f"{lo}-{hi - 1}" if hi < 1 << 30 else f"{lo}-" for lo, hi in BANDS)
          + " |")
    print("|---|---|" + "---:|" * len(BANDS))
    for c in cases:
        for r in (r for r in results if r["key"] == c["key"]):
            print(f"| {c['name']} | {r['ref']} | "
                  + " | ".join("" if v is None else f"{v:.2e}" for v in r["bands"]) + " |")
    names = [name for name, _, _ in refs]
    print("\nGreedy continuations (kvfuse; llama.cpp where different):\n")
    print("| prompt | kvfuse | " + " | ".join(f"llama.cpp {n}" for n in names) + " |")
    print("|---|---|" + "---|" * len(names))
    for c in cases:
        cols = []
        for ref_name in names:
            r = next((r for r in results if r["key"] == c["key"] and r["ref"] == ref_name), None)
            cols.append("—" if r is None else ("same" if r["gen"] == c["kvfuse_gen"] else cell(r["text"])))
        print(f"| {c['name']} | {cell(c['kvfuse_text'])} | " + " | ".join(cols) + " |")


if __name__ == "__main__":
    main()
