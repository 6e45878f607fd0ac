#!/usr/bin/env python3
"""A conversation of plain-string messages with kvfuse-server, written with the official `openai` client.

Turn 1 puts the first P passages of MuSiQue question Q (each cut to its first W words) in the system prompt and asks
the question; each later turn sends the whole conversation so far (the answers as assistant messages) and asks
another question. Every turn's prompt starts with the previous turn's, so kvfuse-server (--prefix-cache on, the cpu
engine's default) finds that prefix stored as Cake's prefix entries and loads it from the back while computing from
the front. Prints one line per turn: prompt tokens, the stored prefix found, the tokens loaded rather than computed,
and the engine's TTFT (usage.kvfuse). Greedy, non-streamed.

Usage: server_conversation.py --url http://127.0.0.1:8000/v1 --data musique_dev.json [--question 0]
                              [--passages 3] [--passage-words 100] [--max-tokens 16]
"""
import argparse
import json
import sys

FOLLOW_UPS = ["Which of the notes says so?", "Answer again in one word."]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--url", required=True)
    ap.add_argument("--data", required=True)
    ap.add_argument("--question", type=int, default=0)
    ap.add_argument("--passages", type=int, default=3)
    ap.add_argument("--passage-words", type=int, default=100)
    ap.add_argument("--max-tokens", type=int, default=16)
    args = ap.parse_args()

    import openai

    with open(args.data) as f:
        questions = json.load(f)
    if not 0 <= args.question < len(questions):
        sys.exit(f"server_conversation.py: --question {args.question} is not in [0, {len(questions)})")
    q = questions[args.question]
    notes = [f"{c['title']}: " + " ".join(c["text"].split()[:args.passage_words]) for c in q["ctxs"][:args.passages]]
    messages = [{"role": "system", "content": "Answer from these notes.\n" + "\n".join(notes)}]
    client = openai.OpenAI(base_url=args.url, api_key="unused", max_retries=0, timeout=600)
    for turn, ask in enumerate([q["question"]] + FOLLOW_UPS, 1):
        messages.append({"role": "user", "content": ask})
        done = client.chat.completions.create(model="kvfuse", messages=messages, temperature=0,
                                              max_tokens=args.max_tokens)
        answer = done.choices[0].message.content
        k = done.model_dump()["usage"]["kvfuse"]
        print(f"  turn {turn}: {done.usage.prompt_tokens} prompt tokens, stored prefix found {k['prefix_tokens']}, "
              f"loaded {k['loaded_tokens']}, computed {k['recomputed_tokens']:.0f}, TTFT {k['ttft_ms']:.0f} ms: "
              f"{ask!r} -> {answer!r}")
        messages.append({"role": "assistant", "content": answer})


if __name__ == "__main__":
    main()
