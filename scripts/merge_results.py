#!/usr/bin/env python3
"""Merges the per-question records of several kvfuse-rag-eval results.json files (runs over disjoint question
ranges of one model with the same methods) and prints the markdown table of docs/results.md: per method the
TTFT ratio to full prefill (mean and median over questions; each ratio is taken in its own run against that
question's full prefill), tokens recomputed, first-token KL, the teacher-forced figures (mean KL over full
prefill's answer, its top-1 agreement, and gap closed = 1 - KL / KL_naive from the means, with the median of
the per-question values), ROUGE-L and exact match against the full-prefill answer and F1 against the gold
answers. With --png, also the fidelity / TTFT plot (gnuplot), as kvfuse-rag-eval draws it.

Usage: python3 scripts/merge_results.py [--png OUT.png --title TEXT] results.json [results.json ...]
"""

import argparse
import json
import os
import statistics as st
import subprocess
import sys


def load(paths):
    """The per-question records and the model name of kvfuse-rag-eval results.json files of one model."""
    questions, models = [], set()
    for path in paths:
        with open(path) as f:
            r = json.load(f)
        models.add(r["model"])
        questions += r["per_question"]
    if len(models) != 1:
        sys.exit(f"merge_results.py: the files are of different models: {sorted(models)}")
    return questions, models.pop()


def summarize(questions):
    """Methods in table order and their row figures (means, medians, gap closed) over the questions."""
    methods = list(questions[0]["methods"])
    for q in questions:
        if list(q["methods"]) != methods:
            sys.exit(f"merge_results.py: question {q['index']} has methods {list(q['methods'])}, not {methods}")
    # results.json keeps methods by name; list them as docs/results.md does: full, prefix, naive, then each
    # family's settings by what they recompute.
    order = ["full", "prefix", "naive", "cacheblend", "queryaware", "queryprobe", "attnlink", "cachecraft"]
    recomputed = {m: st.mean(q["methods"][m]["recompute_fraction"] for q in questions) for m in methods}
    methods.sort(key=lambda m: (order.index(m.split("@")[0].split("-")[0]), recomputed[m]))
    if "naive" not in methods:
        sys.exit("merge_results.py: gap closed needs naive among the methods")

    def values(m, key):
        return [q["methods"][m][key] for q in questions]

    rows = {}
    for m in methods:
        rows[m] = {k: st.mean(values(m, k)) for k in ("ttft_ratio_vs_full", "recompute_fraction", "kl_first_token",
                                                      "kl_answer_mean", "top1_answer_agreement", "rouge_l_vs_full",
                                                      "exact_match_vs_full", "f1_vs_gold")}
        rows[m]["ttft_median"] = st.median(values(m, "ttft_ratio_vs_full"))
    naive = values("naive", "kl_answer_mean")
    for m in methods:
        rows[m]["gap_closed"] = 1 - rows[m]["kl_answer_mean"] / rows["naive"]["kl_answer_mean"]
        rows[m]["gap_closed_median"] = st.median(
            [1 - a / b for a, b in zip(values(m, "kl_answer_mean"), naive) if b > 0])
    return methods, rows


def table_lines(questions, model):
    """The summary line, a blank line and the markdown table, as docs/results.md shows them."""
    methods, rows = summarize(questions)
    full_ms = st.mean(q["methods"]["full"]["ttft_ms"] for q in questions)
    lines = [f"{model}: {len(questions)} questions ({', '.join(str(q['index']) for q in questions)}), "
             f"{st.mean(q['tokens'] for q in questions):.0f} prompt tokens on average; full prefill "
             f"{full_ms / 1000:.1f} s, offline work {st.mean(q['offline_ms'] for q in questions) / 1000:.1f} s "
             "per question (means)", "",
             "| method | TTFT / full, mean (median) | recomputed | KL first token | teacher-forced KL | top-1 over the answer "
             "| gap closed, means (median per question) | ROUGE-L vs full | EM vs full | F1 vs gold |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for m in methods:
        r = rows[m]
        lines.append(f"| {m} | {r['ttft_ratio_vs_full']:.3f} ({r['ttft_median']:.3f}) | {100 * r['recompute_fraction']:.1f} % "
                     f"| {r['kl_first_token']:.4f} | {r['kl_answer_mean']:.4f} | {r['top1_answer_agreement']:.3f} "
                     f"| {100 * r['gap_closed']:.0f} % ({100 * r['gap_closed_median']:.0f} %) | {r['rouge_l_vs_full']:.3f} "
                     f"| {r['exact_match_vs_full']:.2f} | {r['f1_vs_gold']:.3f} |")
    return lines


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("results", nargs="+")
    ap.add_argument("--png")
    ap.add_argument("--title", default="")
    args = ap.parse_args()

    questions, model = load(args.results)
    print("\n".join(table_lines(questions, model)))
    methods, rows = summarize(questions)

    if args.png:
        families = ["full", "prefix", "naive", "cacheblend", "attnlink", "cachecraft", "queryaware", "queryprobe"]
        dat = args.png + ".dat"
        with open(dat, "w") as d:
            for m in methods:
                r = rows[m]
                colour = families.index(m.split("@")[0].split("-")[0]) + 1
                d.write(f'"{m}" {r["ttft_median"]} {r["gap_closed"]} {max(1e-4, r["kl_answer_mean"])} {colour}\n')
        script = f"""set terminal pngcairo size 1400,560 font 'sans,10' noenhanced
set output '{args.png}'
set multiplot layout 1,2 title '{args.title}'
set logscale x
set xlabel 'TTFT / full prefill TTFT (median over questions, log)'
set grid
unset key
set ylabel 'share of naive reuse''s teacher-forced KL gap closed (means)'
set yrange [-0.1:1.05]
plot '{dat}' using 2:3:5 with points pt 7 ps 1.4 lc variable, '' using 2:3:1 with labels offset 0,1 font ',8'
set logscale y
set ylabel 'KL(full || method), mean over the teacher-forced answer (log; < 1e-4 drawn at 1e-4)'
set yrange [5e-5:2]
plot '{dat}' using 2:4:5 with points pt 7 ps 1.4 lc variable, '' using 2:4:1 with labels offset 0,1 font ',8'
unset multiplot
"""
        subprocess.run(["gnuplot"], input=script.encode(), check=True)
        os.remove(dat)


if __name__ == "__main__":
    main()
