#!/usr/bin/env python3
"""A RAG load generator for OpenAI-compatible servers, written with the official `openai` client (asyncio).

Sends N chat requests, C at a time, to one server: request i asks MuSiQue question i mod Q with P passages drawn
(Zipf, s = 1, without replacement) from a pool of the first POOL passages of the dataset's questions from
--first-question on (each cut to its first W words with --passage-words W; another first question gives a disjoint
set of requests to choose a setting on), in a random order, so that passages recur in other orders and next to
other passages. Each passage is one text part of the
user message and the question the last part (kvfuse-server: each part a chunk cache); for llama-server the parts
get the newline kvfuse-server puts between parts (it concatenates parts as they are), so both see the same text.
Every request is streamed, greedy (temperature 0), max_tokens T; its TTFT is from sending it to its first content
delta. The same seed gives the same requests, so two runs (a reuse method and full prefill) answer the same
prompts. Prints one JSON object:

  {"label", "requests", "concurrency", "makespan_s", "output_tok_s", "ttft_ms": {"p50", "p99"},
   "answers": [..], "usage": [..]}        (usage: kvfuse-server's usage.kvfuse per request, else null)

--compare FILE adds the answers' agreement with FILE's answers (another run's output, e.g. full prefill):
"agreement": {"exact_match", "rouge_l"} (means over the requests; ROUGE-L F1 by the rouge-score package).
--show prints one line per request (what was loaded and recomputed), for a person watching.
Percentiles are nearest-rank.
"""
import argparse
import asyncio
import json
import math
import random
import sys
import time


def nearest_rank(values, p):
    s = sorted(values)
    return s[max(0, math.ceil(p / 100 * len(s)) - 1)]


def build_requests(data_path, n, passages, pool_size, seed, words=0, first_question=0):
    with open(data_path) as f:
        questions = json.load(f)
    if not 0 <= first_question < len(questions):
        raise SystemExit(f"server_loadgen.py: --first-question {first_question} is outside the dataset's "
                         f"{len(questions)} questions")
    questions = questions[first_question:]
    pool, asked = [], []  # asked: the questions whose passages make the pool (most requests see some of their own)
    for q in questions:
        if len(pool) >= pool_size:
            break
        asked.append(q)
        for c in q["ctxs"]:
            text = f"{c['title']}: {c['text']}" if c.get("title") else c["text"]
            if words:
                text = " ".join(text.split()[:words])
            if text not in pool:
                pool.append(text)
    pool = pool[:pool_size]
    if len(pool) < passages:
        raise SystemExit(f"server_loadgen.py: --pool {pool_size} gives {len(pool)} passages, fewer than --passages")
    rng = random.Random(seed)
    weights = [1.0 / (k + 1) for k in range(len(pool))]
    out = []
    for i in range(n):
        chosen = []
        while len(chosen) < passages:
            k = rng.choices(range(len(pool)), weights)[0]
            if k not in chosen:
                chosen.append(k)
        rng.shuffle(chosen)
        out.append({"passages": [pool[k] for k in chosen], "question": asked[i % len(asked)]["question"]})
    return out


def messages_for(request, newline_parts):
    sep = "\n" if newline_parts else ""
    parts = [{"type": "text", "text": p + sep} for p in request["passages"]]
    parts.append({"type": "text", "text": "Question: " + request["question"] + " Answer in a few words."})
    return [{"role": "system", "content": "Answer the question from the documents."},
            {"role": "user", "content": parts}]


async def one(client, args, i, request, sem, results):
    async with sem:
        extra = {}
        if args.method:
            extra["kvfuse"] = {"method": args.method}
        if args.no_cache_prompt:
            extra["cache_prompt"] = False  # llama-server: this request's prompt is computed whole
        t0 = time.perf_counter()
        first = None
        text, usage = "", None
        stream = await client.chat.completions.create(
            model=args.model, messages=messages_for(request, args.newline_parts), stream=True, temperature=0,
            max_tokens=args.max_tokens, stream_options={"include_usage": True}, extra_body=extra or None)
        async for chunk in stream:
            for choice in chunk.choices:
                if choice.delta.content:
                    if first is None:
                        first = time.perf_counter()
                    text += choice.delta.content
            if chunk.usage is not None:
                usage = chunk.model_dump()["usage"]
        done = time.perf_counter()
        results[i] = {"ttft_ms": 1000 * ((first or done) - t0), "text": text,
                      "completion_tokens": usage["completion_tokens"] if usage else 0,
                      "prompt_tokens": usage["prompt_tokens"] if usage else 0,
                      "kvfuse": usage.get("kvfuse") if usage else None}
        if args.show:
            k = results[i]["kvfuse"]
            reuse = (f"loaded {k['loaded_tokens']:4d} recomputed {k['recomputed_tokens']:7.1f}" if k else "")
            print(f"request {i:2d}: {results[i]['prompt_tokens']:4d} prompt tokens {reuse}  "
                  f"TTFT {results[i]['ttft_ms']:7.0f} ms  answer: {text.strip()[:60]!r}", file=sys.stderr)


async def run(args, requests):
    import openai
    # A connection per request ("Connection: close"): llama-server closes idle keep-alive connections after 5 s, and
    # a request sent on one it already closed failed with "Server disconnected" (no retries: each request once).
    client = openai.AsyncOpenAI(base_url=args.url, api_key="unused", max_retries=0, timeout=args.timeout,
                                default_headers={"Connection": "close"})
    sem = asyncio.Semaphore(args.concurrency)
    results = [None] * len(requests)
    t0 = time.perf_counter()
    await asyncio.gather(*(one(client, args, i, r, sem, results) for i, r in enumerate(requests)))
    makespan = time.perf_counter() - t0
    await client.close()
    return results, makespan


def agreement(answers, reference):
    from rouge_score import rouge_scorer
    scorer = rouge_scorer.RougeScorer(["rougeL"])
    em = [a.strip() == b.strip() for a, b in zip(answers, reference)]
    rl = [scorer.score(b, a)["rougeL"].fmeasure for a, b in zip(answers, reference)]
    return {"exact_match": sum(em) / len(em), "rouge_l": sum(rl) / len(rl)}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--url", required=True, help="the server's OpenAI base URL, e.g. http://127.0.0.1:8000/v1")
    ap.add_argument("--data", required=True, help="MuSiQue JSON (questions with ctxs)")
    ap.add_argument("--requests", type=int, default=64)
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--passages", type=int, default=5)
    ap.add_argument("--pool", type=int, default=40)
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--passage-words", type=int, default=0, help="keep each passage's first N words (0: whole)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--first-question", type=int, default=0,
                    help="the pool's questions start here (0: the judged set; calibration elsewhere, e.g. 50)")
    ap.add_argument("--model", default="default")
    ap.add_argument("--method", default="", help="kvfuse-server: each request's kvfuse.method")
    ap.add_argument("--no-cache-prompt", action="store_true", help="llama-server: cache_prompt false per request")
    ap.add_argument("--newline-parts", action="store_true",
                    help="end every passage part with a newline (for servers that concatenate parts as they are)")
    ap.add_argument("--label", default="")
    ap.add_argument("--compare", help="a JSON output of this script whose answers are the reference")
    ap.add_argument("--show", action="store_true", help="one line per request on stderr")
    ap.add_argument("--timeout", type=float, default=600)
    args = ap.parse_args()
    for name in ("requests", "concurrency", "passages", "pool", "max_tokens"):
        if getattr(args, name) < 1:
            raise SystemExit(f"server_loadgen.py: --{name.replace('_', '-')} = {getattr(args, name)} must be >= 1")
    requests = build_requests(args.data, args.requests, args.passages, args.pool, args.seed, args.passage_words,
                              args.first_question)
    results, makespan = asyncio.run(run(args, requests))
    ttft = [r["ttft_ms"] for r in results]
    out = {"label": args.label, "requests": len(results), "concurrency": args.concurrency,
           "passages": args.passages, "pool": args.pool, "passage_words": args.passage_words,
           "first_question": args.first_question, "max_tokens": args.max_tokens,
           "makespan_s": makespan, "output_tok_s": sum(r["completion_tokens"] for r in results) / makespan,
           "ttft_ms": {"p50": nearest_rank(ttft, 50), "p99": nearest_rank(ttft, 99)},
           "prompt_tokens": [r["prompt_tokens"] for r in results],
           "answers": [r["text"] for r in results], "usage": [r["kvfuse"] for r in results]}
    if args.compare:
        with open(args.compare) as f:
            out["agreement"] = agreement(out["answers"], json.load(f)["answers"])
    print(json.dumps(out))


if __name__ == "__main__":
    main()
