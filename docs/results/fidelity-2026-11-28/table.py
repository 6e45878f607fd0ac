#!/usr/bin/env python3
# The tables of docs/fidelity.md (2026-11-28) from the probe outputs (scripts/check_docs.py recomputes them too):
#   python3 table.py LABEL NONE.json SYSTEM.json
# Teacher-forced KL per question and its mean, the first token's KL, for caches computed alone (--chunk-context
# none) and behind the system segment (--chunk-context system); then, per probe, on how many questions it is worse
# than naive reuse with the same caches.
import json
import sys

label, runs = sys.argv[1], (("alone", json.load(open(sys.argv[2]))), ("behind system", json.load(open(sys.argv[3]))))
n = len(runs[0][1]["per_question"])
print(f"| {label}: probe, chunk caches | " + " | ".join(f"q{i}" for i in range(n)) + " | mean KL | first-token KL |")
print("|---|" + "---:|" * (n + 2))
for m in runs[0][1]["means"]:
    for name, d in runs:
        per = [q["methods"][m]["kl_answer_mean"] for q in d["per_question"]]
        print(f"| {m}, {name} | " + " | ".join(f"{v:.4f}" for v in per) +
              f" | {d['means'][m]['kl_answer_mean']:.4f} | {d['means'][m]['kl_first_token']:.4f} |")
for name, d in runs:
    for m in d["means"]:
        if m != "naive":
            worse = sum(q["methods"][m]["kl_answer_mean"] > q["methods"]["naive"]["kl_answer_mean"]
                        for q in d["per_question"])
            print(f"{m}, {name}: worse than naive reuse with the same caches on {worse} of {n} questions")
