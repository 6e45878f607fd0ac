#!/usr/bin/env python3
"""Checks that the measured figures in docs/ match their committed raw data and say where they come from.

1. Tables recomputed from raw data. For every table of docs/ whose raw output is committed under docs/results/,
   the figures are recomputed from the raw files with the rounding the page uses and compared cell by cell (and,
   for results.md, the summary line above each table). Each mismatch is printed as
       docs/PAGE.md:LINE: <what>: the page has '<cell>', the raw data gives '<cell>'
   The tables and their raw files: the check_* functions below; a table that cannot be found is an error too.

2. Provenance. A level-2 section (`## ...`; the part before the first one counts as one) "reports measured
   figures" when it holds a Markdown table whose header names a measured quantity (MEASURED_HEADER below: ms,
   MB/s, tok/s, TTFT, KL, RSS, median, ...) or links into results/; or when it has a line that starts with
   "Measured" or "Date" (MEASURED_LINE) and the next section has no such table (else it is checked with that one).
   Figures given only in prose, in a section with none of these, are not seen. Such a section, together with the
   sections right before it that have no measured table of their own (a "Setting" section before a "Results"
   one, the top of the page), must name
   - a date (YYYY-MM-DD),
   - a machine (a core count, "machine", "VM", a GPU model),
   - a commit (7-40 hex digits in backticks, or after the word "commit"),
   - a command (a fenced or indented code block, or a backticked command: bash, python3, build/..., kvfuse-...),
   - its raw output: a link into results/ or the words "raw output not kept".
   Every commit named in such a section must exist in the repository's history (skipped in a shallow clone or
   outside git), and every link into results/ must exist.

Standard library only. Exit status 0 when everything matches, 1 otherwise.
Usage: python3 scripts/check_docs.py [--root DIR] [--verbose] [--cake-grid GRID] [--cachecraft-llamacpp DIR]
                                     [--choose-alpha RESULTS [--budget 0.30]]
  DIR: the repository (default: this script's parent); --verbose lists the sections taken as measured;
  --cake-grid prints the table of a scripts/bench_cake_grid.sh output directory and checks nothing;
  --cachecraft-llamacpp prints the tables of a scripts/bench_llamacpp_cachecraft.sh output directory;
  --choose-alpha prints the Cache-Craft setting that script's rule takes from a calibration results.json.
"""

import argparse
import csv
import importlib.util
import json
import re
import statistics as st
import subprocess
import sys
from pathlib import Path

problems = []


def problem(path, line, message):
    problems.append(f"{path}:{line}: {message}")


# ---------------------------------------------------------------------------------------------------- Markdown


def cells(line):
    """The cells of one Markdown table row, stripped of bold markers."""
    return [c.strip().replace("**", "") for c in line.strip().strip("|").split("|")]


def find_line(lines, text, start=0):
    """Index of the first line at or after start that contains text, or None."""
    for i in range(start, len(lines)):
        if text in lines[i]:
            return i
    return None


def table_after(lines, i):
    """(index of the header line, rows as (index, cells)) of the first table at or after line i."""
    while i < len(lines) and not lines[i].startswith("|"):
        i += 1
    if i >= len(lines):
        return None, []
    header, rows = i, []
    i += 2  # header and |---| line
    while i < len(lines) and lines[i].startswith("|"):
        rows.append((i, cells(lines[i])))
        i += 1
    return header, rows


class Page:
    def __init__(self, root, name):
        self.name = name
        self.lines = (root / name).read_text(encoding="utf-8").splitlines()

    def table(self, anchor, what):
        """The rows of the first table after the line containing anchor, keyed by their first cell."""
        i = find_line(self.lines, anchor)
        if i is None:
            problem(self.name, 1, f"{what}: no line contains {anchor!r}")
            return None
        _, rows = table_after(self.lines, i)
        if not rows:
            problem(self.name, i + 1, f"{what}: no table after {anchor!r}")
            return None
        return {r[0]: (n, r) for n, r in rows}

    def compare(self, anchor, what, expected, key=lambda c: c, columns=None):
        """Compares the table after anchor with expected {row key: [cells after the first]}.

        key maps a row's first cell to the key of expected; columns picks which cells to compare (all by default)."""
        table = self.table(anchor, what)
        if table is None:
            return
        seen = set()
        for first, (n, row) in table.items():
            k = key(first)
            if k not in expected:
                problem(self.name, n + 1, f"{what}: row '{first}' has no raw data")
                continue
            seen.add(k)
            want = expected[k]
            for c in columns if columns is not None else range(1, len(row)):
                if c >= len(row) or row[c] != want[c - 1]:
                    have = row[c] if c < len(row) else "<missing>"
                    problem(self.name, n + 1, f"{what}, row '{first}', column {c + 1}: the page has '{have}', "
                                              f"the raw data gives '{want[c - 1]}'")
        for k in expected:
            if k not in seen:
                problem(self.name, 1, f"{what}: the raw data has row '{k}', the table does not")

    def compare_line(self, anchor, what, expected):
        """The line that starts with anchor must equal expected."""
        i = find_line(self.lines, anchor)
        if i is None or self.lines[i] != expected:
            problem(self.name, (i or 0) + 1, f"{what}: the page has '{self.lines[i] if i is not None else None}', "
                                             f"the raw data gives '{expected}'")


# ------------------------------------------------------------------------------------------ recomputed tables


def load_json(path):
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def questions_of(*paths):
    qs = []
    for p in paths:
        qs += load_json(p)["per_question"]
    return qs


def mean_of(questions, method, key):
    return st.mean(q["methods"][method][key] for q in questions if method in q["methods"])


def check_results_2026_11_24(root, merge):
    """docs/results.md, 2026-11-24: scripts/merge_results.py's tables over the per-process results.json files."""
    page = Page(root, "docs/results.md")
    d = root / "docs/results/2026-11-24"
    for files in (["smollm2-q0-9.json", "smollm2-q10-19.json"], ["smollm2-sweep-q20-24.json"], ["gemma3-q0-19.json"]):
        qs, model = merge.load([d / f for f in files])
        lines = merge.table_lines(qs, model)
        summary, table = lines[0], lines[4:]
        page.compare_line(summary, f"results.md, summary of {'+'.join(files)}", summary)
        expected = {cells(r)[0]: cells(r)[1:] for r in table}
        page.compare(summary, f"results.md, table of {'+'.join(files)}", expected)


MODEL_LABELS = {"SmolLM2-135M-Instruct.Q4_1.gguf": "SmolLM2", "gemma-3-270m-q4_k_m.gguf": "Gemma 3",
                "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf": "Qwen2"}
GATE_FAMILIES = ("cacheblend", "queryaware", "queryprobe", "attnlink", "cachecraft", "cachecraft-cover")


def gate_line(run, label):
    """The calibration gate's verdict of one kvfuse-rag-eval --calibrated run, as docs/results.md writes it."""
    c = run["calibration"]
    verdicts = [f"{f} → {c[f]['chosen']}" if c[f]["chosen"] else f"{f} refused" for f in GATE_FAMILIES if f in c]
    auto = c.get("auto") or "full prefill (every family refused)"
    return f"- {label}: {', '.join(verdicts)}; `auto` → {auto}."


def check_three_models(root, merge, dirname, goal_anchor, when=""):
    """docs/results.md, 2026-11-28 and 2026-12-02: per model and prompt shape, scripts/merge_results.py's table over
    the run's results.json and the gate's verdict on the calibration questions (results/<dirname>/, its gate lines
    labelled "<model>, <n> passages<when>:"), and the goal table after goal_anchor: auto's row of each run. A run
    split over processes keeps the later ones' results.json in subfolders of the first's, with the same gate."""
    page = Page(root, "docs/results.md")
    d = root / "docs/results" / dirname
    goal = {}
    for f in sorted(d.glob("*/results.json")):
        qs, model = merge.load([f] + sorted(f.parent.glob("*/results.json")))  # a run split over processes
        lines = merge.table_lines(qs, model)
        summary, table = lines[0], lines[4:]
        page.compare_line(summary, f"results.md, summary of {dirname}/{f.parent.name}", summary)
        page.compare(summary, f"results.md, table of {dirname}/{f.parent.name}",
                     {cells(r)[0]: cells(r)[1:] for r in table})
        run = load_json(f)
        label = f"{model}, {run['passages_per_question']} passages{when}"
        page.compare_line(f"- {label}:", f"results.md, gate of {dirname}/{f.parent.name}", gate_line(run, label))
        for sub in sorted(f.parent.glob("*/results.json")):
            if gate_line(load_json(sub), label) != gate_line(run, label):
                problem("docs/results.md", 1, f"{dirname}/{f.parent.name}: {sub.parent.name} ran another gate")
        # The goal table: auto's row (full prefill when the gate refused every family).
        _, rows = merge.summarize(qs)
        auto = run["calibration"].get("auto")
        r, full = rows[auto or "full"], rows["full"]
        goal[f"{MODEL_LABELS[model]}, {run['passages_per_question']}"] = [
            auto or "full prefill (every family refused)", f"{r['ttft_ratio_vs_full']:.3f}",
            f"{100 * r['gap_closed']:.0f} %", f"{r['top1_answer_agreement']:.3f}",
            f"{r['f1_vs_gold']:.3f} ({full['f1_vs_gold']:.3f})"]
    page.compare(goal_anchor, f"results.md, {dirname} goal table", goal, columns=range(1, 6))


def check_cover_judged(root, merge):
    """docs/results.md, 2026-12-02: Cache-Craft with prefix coverage on Gemma 3's ten-passage judged questions
    (results/cover-judged-2026-12-02/), scripts/merge_results.py's table."""
    page = Page(root, "docs/results.md")
    qs, model = merge.load([root / "docs/results/cover-judged-2026-12-02/gemma3-10x130/results.json"])
    lines = merge.table_lines(qs, model)
    page.compare_line(lines[0], "results.md, summary of cover-judged-2026-12-02", lines[0])
    page.compare(lines[0], "results.md, table of cover-judged-2026-12-02", {cells(r)[0]: cells(r)[1:] for r in lines[4:]})


def check_results_2026_11_21(root):
    """docs/results.md, 2026-11-21: 20 questions of SmolLM2 (results/results.json)."""
    page = Page(root, "docs/results.md")
    qs = questions_of(root / "docs/results/results.json")
    kl_naive = mean_of(qs, "naive", "kl_first_token")
    full_words = [q["methods"]["full"]["answer"].split()[:3] for q in qs]
    expected = {}
    for m in qs[0]["methods"]:
        ratios = [q["methods"][m]["ttft_ratio_vs_full"] for q in qs]
        kl = mean_of(qs, m, "kl_first_token")
        alike = sum(q["methods"][m]["answer"].split()[:3] == w for q, w in zip(qs, full_words))
        expected[m] = [f"{mean_of(qs, m, 'ttft_ms'):.0f}", f"{st.mean(ratios):.3f} ({st.median(ratios):.3f})",
                       f"{100 * mean_of(qs, m, 'recompute_fraction'):.1f} %", f"{kl:.4f}",
                       f"{100 * (1 - kl / kl_naive):.0f} %", f"{mean_of(qs, m, 'exact_match_vs_full'):.2f}",
                       f"{mean_of(qs, m, 'rouge_l_vs_full'):.3f}", f"{alike} / {len(qs)}",
                       f"{mean_of(qs, m, 'f1_vs_gold'):.3f}"]
    page.compare("| method | TTFT ms |", "results.md, 2026-11-21 table", expected, key=lambda c: c.split(" (")[0])


def check_results_alpha0(root):
    """docs/results.md, Cache-Craft at alpha = 0 (results/cachecraft-alpha0/results.json)."""
    page = Page(root, "docs/results.md")
    qs = questions_of(root / "docs/results/cachecraft-alpha0/results.json")
    expected = {m: [f"{mean_of(qs, m, 'ttft_ratio_vs_full'):.3f}", f"{100 * mean_of(qs, m, 'recompute_fraction'):.1f} %",
                    f"{mean_of(qs, m, 'kl_first_token'):.4f}", f"{mean_of(qs, m, 'rouge_l_vs_full'):.3f}"]
                for m in ("naive", "cachecraft@0", "cachecraft", "cachecraft-nofocus")}
    page.compare("#### Cache-Craft without recomputation", "results.md, alpha = 0 table", expected,
                 key=lambda c: c.split(" (")[0])


LLAMACPP_ROWS = {"llama.cpp full prefill": "full", "naive (llama.cpp's shift-only reuse)": "naive",
                 "kvfuse AttnLink-16": "attnlink@16", "kvfuse Cache-Craft (α = 1, no focus termination)": "cachecraft-nofocus"}


def llamacpp_rows(qs):
    """docs/llamacpp.md's MuSiQue table: per method over the questions that ran it, gap vs naive on those."""
    rows = {}
    for m in {m for q in qs for m in q["methods"]}:
        mq = [q for q in qs if m in q["methods"]]
        ratios = [q["methods"][m]["ttft_ratio_vs_full"] for q in mq]
        kl = mean_of(mq, m, "kl_answer_mean")
        rows[m] = [str(len(mq)), f"{st.mean(ratios):.3f} / {st.median(ratios):.3f}",
                   f"{100 * mean_of(mq, m, 'recompute_fraction'):.1f} %", f"{mean_of(mq, m, 'kl_first_token'):.4f}",
                   f"{kl:.4f}", f"{mean_of(mq, m, 'top1_answer_agreement'):.3f}",
                   f"{100 * (1 - kl / mean_of(mq, 'naive', 'kl_answer_mean')):.0f} %",
                   f"{mean_of(mq, m, 'rouge_l_vs_full'):.3f}", f"{mean_of(mq, m, 'f1_vs_gold'):.3f}"]
    return rows


def check_llamacpp(root):
    page = Page(root, "docs/llamacpp.md")
    d = root / "docs/results/llamacpp-2026-11-24"
    smol = questions_of(d / "smollm2-q0-12.json", d / "smollm2-q13-19.json")
    page.compare("**SmolLM2-135M-Instruct (Q4_1)**", "llamacpp.md, SmolLM2 table", llamacpp_rows(smol),
                 key=lambda c: LLAMACPP_ROWS.get(c, c))
    gemma = questions_of(d / "gemma3.json")
    page.compare("**Gemma 3 270M (base, Q4_K_M)**", "llamacpp.md, Gemma 3 table", llamacpp_rows(gemma),
                 key=lambda c: LLAMACPP_ROWS.get(c, c))
    # The prefill benchmark: one JSON line per engine and size.
    runs = {}
    for line in (d / "bench_prefill.jsonl").read_text().splitlines():
        r = json.loads(line)
        runs[(r["tokens"], r["engine"])] = r
    expected = {}
    for n in sorted({t for t, _ in runs}):
        k, l = runs[(n, "kvfuse")], runs[(n, "llamacpp")]
        expected[str(n)] = [f"{k['tokens_per_s']:.0f}", f"{l['tokens_per_s']:.0f}",
                            f"{k['tokens_per_s'] / l['tokens_per_s']:.2f}×", f"{k['peak_rss_mib']:.0f}",
                            f"{l['peak_rss_mib']:.0f}", f"{k['peak_rss_mib'] / l['peak_rss_mib']:.2f}"]
    page.compare("| tokens | kvfuse tok/s | llama.cpp", "llamacpp.md, prefill benchmark", expected)
    # 2026-11-29: kvfuse in one pass and in row blocks beside llama.cpp, as bench_llamacpp.sh prints it; llama.cpp
    # built -march=native, then built for AVX2 only (KVFUSE_BENCH_LLAMACPP_ISA=avx2).
    page.compare("| tokens | kvfuse tok/s | blocks tok/s |", "llamacpp.md, prefill in row blocks",
                 prefill_rows(root / "docs/results/llamacpp-prefill-2026-11-29/bench_prefill.jsonl"))
    page.compare("| tokens, llama.cpp for AVX2 | kvfuse tok/s | blocks tok/s |", "llamacpp.md, llama.cpp for AVX2",
                 prefill_rows(root / "docs/results/llamacpp-prefill-avx2-2026-11-29/bench_prefill.jsonl"))


def prefill_rows(jsonl):
    """bench_llamacpp.sh's table from its JSON lines: kvfuse in one pass, in row blocks, llama.cpp."""
    runs = {}
    for line in jsonl.read_text().splitlines():
        r = json.loads(line)
        runs[(r["tokens"], "llamacpp" if r["engine"] == "llamacpp" else r["block_rows"] > 0)] = r
    expected = {}
    for n in sorted({t for t, _ in runs}):
        k, b, l = runs[(n, False)], runs[(n, True)], runs[(n, "llamacpp")]
        t, m = (lambda x: x["tokens_per_s"]), (lambda x: x["peak_rss_mib"])
        expected[str(n)] = [f"{t(k):.0f}", f"{t(b):.0f}", f"{t(l):.0f}", f"{t(k) / t(l):.2f}×", f"{t(b) / t(l):.2f}×",
                            f"{m(k):.0f}", f"{m(b):.0f}", f"{m(l):.0f}", f"{m(k) / m(l):.2f}", f"{m(b) / m(l):.2f}"]
    return expected


def check_serving(root):
    """docs/serving.md: one row per run (results/serving/2026-11-25/line-N.json)."""
    page = Page(root, "docs/serving.md")
    d = root / "docs/results/serving/2026-11-25"
    runs = {f.stem.split("-")[1]: load_json(f) for f in sorted(d.glob("line-*.json"))}

    def figures(r):  # the numbers of one row, in column order
        t = r["throughput_tok_s"]
        return [t["batched"], t["one_at_a_time"], t["full"], t["batched"] / t["one_at_a_time"],
                r["ttft_ms"]["p50"] / 1000, r["ttft_ms"]["p99"] / 1000, r["ttft_ms_one_at_a_time"]["p50"] / 1000,
                r["ttft_ms_one_at_a_time"]["p99"] / 1000, r["ttft_ms_full"]["p99"] / 1000, 100 * r["hook_overhead"],
                100 * r["install_share"]]

    def row(v, equal):
        return [f"{v[0]:.2f}", f"{v[1]:.2f}", f"{v[2]:.2f}", f"{v[3]:.2f}", f"{v[4]:.1f} / {v[5]:.1f}",
                f"{v[6]:.1f} / {v[7]:.1f}", f"{v[8]:.1f}", f"{v[9]:.2f} %", f"{v[10]:.2f} %", equal]

    expected = {n: row(figures(r), "true" if r["equal_alone"] else "false") for n, r in runs.items()}
    # The median row: the median over the runs of each figure (each ratio is a median of ratios).
    columns = list(zip(*(figures(r) for r in runs.values())))
    expected["median"] = row([st.median(c) for c in columns],
                             "all true" if all(r["equal_alone"] for r in runs.values()) else "not all true")
    page.compare("| run | batched tok/s |", "serving.md, runs table", expected)


def check_cake_simulation(root):
    """docs/cake-simulation.md: scripts/cake_table3.py's output and the two examples' JSON, as committed."""
    page = Page(root, "docs/cake-simulation.md")
    d = root / "docs/results/cake-sim-2026-11-25"
    # Every line of the script's output (the table, the fits, the cells off by more than 10 %) appears on the page.
    for line in (d / "table3.md").read_text(encoding="utf-8").splitlines():
        if line.strip() and line not in page.lines:
            # Point at the page's row with the same first cells, if there is one.
            head = "|".join(line.split("|")[:3])
            n = find_line(page.lines, head + "|")
            have = f", the page has '{page.lines[n]}'" if n is not None else ""
            problem(page.name, (n or 0) + 1, f"Table 3: the raw data gives '{line}'{have}")
    # The examples: every "key": number the page shows equals the committed output's.
    for anchor, raw in (("$ kvfuse-cake-sim --compute-ms 50,2.5", "fallback.json"),
                        ("$ kvfuse-cake-sim --seq-len 16384", "trace.json")):
        i = find_line(page.lines, anchor)
        if i is None:
            problem(page.name, 1, f"no example starting {anchor!r}")
            continue
        want = dict(re.findall(r'"(\w+)": ([0-9.]+)', (d / raw).read_text()))
        j = i + 1
        while j < len(page.lines) and not page.lines[j].startswith("```"):
            for k, v in re.findall(r'"(\w+)": ([0-9.]+)', page.lines[j]):
                if want.get(k) != v:
                    problem(page.name, j + 1, f"example {raw}, '{k}': the page has '{v}', the raw data gives "
                                              f"'{want.get(k)}'")
            j += 1


def check_cake_defaults(root):
    """docs/cake-real.md, Cake at its defaults: one row per link speed (results/cake-defaults-DATE/link-N.jsonl,
    kvfuse-cake-run's output; its first line is the row), for each run's table."""
    for run, anchor in (("2026-11-27", "| link MB/s | chunks (compute / fetch) |"),
                        ("2026-11-29", "| link MB/s (idle) | chunks (compute / fetch) |")):
        cake_defaults_table(root, root / f"docs/results/cake-defaults-{run}", anchor, f"Cake at its defaults, {run}")


def check_cake_repeats(root):
    """docs/cake-real.md, Cake at its defaults with medians (kvfuse-cake-run --repeats 5, results/cake-repeats-
    2026-11-29/link-N.jsonl; the first line of each is the row): Cake, compute-only, load-only and the best split each
    a median of 5 reruns, the sweep's minimum beside them."""
    def row(r):
        t = r["ttft_ms"]
        return cake_row(r)[:5] + [f"{t['best_split_sweep_min']:.0f}", f"{r['cake_vs_best_split']:.3f}",
                                  f"{t['cake'] / t['best_split_sweep_min']:.3f}", f"{r['cake_vs_best_single']:.3f}",
                                  f"{r['meet_token']:.0f}"]
    cake_defaults_table(root, root / "docs/results/cake-repeats-2026-11-29", "| link MB/s (medians of 5) |",
                        "Cake at its defaults with medians", row)
    cake_defaults_table(root, root / "docs/results/cake-repeats-2026-11-29b",
                        "| link MB/s (medians of 5; compute-only in 512-token chunks) |",
                        "Cake on slow links against compute-only at its best", row)
    cake_defaults_table(root, root / "docs/results/cake-repeats-2026-11-29c",
                        "| link MB/s (medians of 5; the compute chunk's fixed cost at most half the link's share) |",
                        "Cake on slow links with the compute chunk's share rule", row)


def cake_row(r):
    """One row of cake-real.md's defaults tables from kvfuse-cake-run's first JSON line (cells after the link)."""
    t, c = r["ttft_ms"], r["chunks"][0]
    return [f"{c['compute_chunk']} / {c['fetch_chunk']}", f"{t['cake']:.0f}", f"{t['compute_only']:.0f}",
            f"{t['io_only']:.0f}", f"{t['best_split']:.0f} ({r['best_split_token']:.0f})",
            f"{r['cake_vs_best_split']:.3f}", f"{r['cake_vs_best_single']:.3f}", f"{r['meet_token']:.0f}",
            f"{r['predicted_cake_ms']:.0f}"]


CAKE_GRID_HEADER = ("| stored prefix / link MB/s | compute chunks | fetch chunks | Cake ms | compute-only ms | "
                    "load-only ms | best split ms | Cake / best split | Cake / better single | worst prompt: "
                    "/ best split, / better single | sweep runs (skipped) |")


def cake_grid_rows(d):
    """{'PREFIX / LINK': cells after the first} of the Cake grid (scripts/bench_cake_grid.sh: one kvfuse-cake-run
    JSON file per cell, prefix-P-link-L.json). TTFTs are means over the prompts of each prompt's medians; the ratios
    are those of the means (kvfuse-cake-run's own); load-only with '>=' where a run stood in by its nominal time."""
    rows = {}
    for f in d.glob("prefix-*-link-*.json"):
        prefix = f.name.split("-")[1]  # --prefix-tokens (each prompt's stored tokens: that, on its fetch grid)
        r = json.loads(f.read_text(encoding="utf-8").splitlines()[0])
        ps, t = r["prompts"], r["ttft_ms"]
        span = lambda k: (f"{min(p[k] for p in ps)}" if min(p[k] for p in ps) == max(p[k] for p in ps)
                          else f"{min(p[k] for p in ps)}-{max(p[k] for p in ps)}")
        worst_split = max(p["cake_ms"] / p["best_split_ms"] for p in ps)
        worst_single = max(p["cake_ms"] / min(p["compute_only_ms"], p["io_only_ms"]) for p in ps)
        rows[f"{prefix} / {r['link_mbps']:g}"] = [
            span("compute_chunk"), span("fetch_chunk"), f"{t['cake']:.0f}", f"{t['compute_only']:.0f}",
            ("≥ " if r["io_only_is_lower_bound"] else "") + f"{t['io_only']:.0f}", f"{t['best_split']:.0f}",
            f"{r['cake_vs_best_split']:.3f}", f"{r['cake_vs_best_single']:.3f}",
            f"{worst_split:.3f}, {worst_single:.3f}",
            f"{sum(p['sweep_runs'] for p in ps)} ({sum(p['sweep_skipped'] for p in ps)})"]
    return dict(sorted(rows.items(), key=lambda kv: tuple(float(x) for x in kv[0].split(" / "))))


def print_cake_grid(d):
    """The grid's table, for scripts/bench_cake_grid.sh (and a page to paste it into)."""
    print(CAKE_GRID_HEADER)
    print("|" + "---|" + "---:|" * (CAKE_GRID_HEADER.count("|") - 2))
    for k, cells_ in cake_grid_rows(d).items():
        print(f"| {k} | " + " | ".join(cells_) + " |")


def check_cake_grid(root):
    """docs/cake-real.md, the grid of link speeds and prefixes at Cake's defaults (results/cake-grid-2026-11-29/)."""
    Page(root, "docs/cake-real.md").compare(CAKE_GRID_HEADER, "cake-real.md, the grid at Cake's defaults",
                                            cake_grid_rows(root / "docs/results/cake-grid-2026-11-29"))


def cake_defaults_table(root, d, anchor, what, row=cake_row):
    page = Page(root, "docs/cake-real.md")
    expected = {}
    for f in sorted(d.glob("link-*.jsonl")):
        r = json.loads(f.read_text(encoding="utf-8").splitlines()[0])
        expected[f"{r['link_mbps']:g}"] = row(r)
    page.compare(anchor, f"cake-real.md, {what}", expected)


def markdown_tables(text):
    """Every Markdown table of text, as lists of rows of cells (header and |---| line left out)."""
    tables, rows = [], None
    for line in text.splitlines() + [""]:
        if line.startswith("|"):
            if rows is None:
                rows = []  # the header
            elif not set(line) <= set("|-: "):
                rows.append(cells(line))
        elif rows is not None:
            tables.append(rows)
            rows = None
    return tables


def kernel_goal_figures(d):
    """The figures of docs/kernels.md's goals table from one run of scripts/bench_kernels.sh (results/kernels-*/
    bench.md and sdpa.md), and the parsed tables they come from."""
    bench = {part.split("\n", 1)[0].strip(): markdown_tables(part)[0]
             for part in (d / "bench.md").read_text(encoding="utf-8").split("## bench-")[1:]}
    sdpa = {(r[0], r[1]): r for r in markdown_tables((d / "sdpa.md").read_text(encoding="utf-8"))[0]}
    dense = {(r[0], r[1]): r for r in bench["bench_sparse_attention"] if r[2] == "100 %"}
    pct = {k: 100 * float(r[5]) / float(sdpa[k][3]) for k, r in dense.items()}
    topk = {r[0]: [r[1], r[2], r[3], r[4], r[5], r[9]] for r in bench["bench_topk"]}
    rope = [(float(r[6]), float(r[10])) for r in bench["bench_rope"]]
    span = lambda xs: f"{min(xs):.1f}–{max(xs):.1f} %"
    goals = {"RoPE apply / inverse / shift, ≥ 16 MB": span([p for mb, p in rope if mb >= 16]),
             "RoPE apply / inverse / shift, < 16 MB": span([p for mb, p in rope if mb < 16]),
             "sparse-query attention, every query": span(pct.values()),
             "top-k, N = 128K": f"{topk['131072'][1]} µs ({topk['131072'][2]} µs in a CUDA graph)"}
    return goals, dense, sdpa, pct, topk


def check_kernels(root):
    """docs/kernels.md, Results: the GPU benchmarks of 2026-11-27 (results/kernels-2026-11-27/bench.md, scripts/
    bench_kernels.sh's tables, and sdpa.md, scripts/bench_sdpa.py's): sparse attention with every query against SDPA,
    top-k, and the figures of the goals table; and the goals' figures of the 2026-11-28 rerun beside them."""
    page = Page(root, "docs/kernels.md")
    first = root / "docs/results/kernels-2026-11-27"
    want, dense, sdpa, pct, topk = kernel_goal_figures(first)
    page.compare("| N, head_dim | kvfuse, every query (ms) |", "kernels.md, sparse attention vs SDPA",
                 {f"{k[0]}, {k[1]}": [r[4], r[5], sdpa[k][2], sdpa[k][3], f"{pct[k]:.1f} %"] for k, r in dense.items()})
    page.compare("| N | k | top-k radix (µs) | in a CUDA graph (µs) |", "kernels.md, top-k", topk)

    i = find_line(page.lines, "| kernel | measure | goal | measured | met |")
    _, rows = table_after(page.lines, i or 0)
    for what, value in want.items():
        kernel, measure = what.split(", ", 1)
        n, row = next(((n, r) for n, r in rows if r[0] == kernel and measure in r[1]), (i or 0, None))
        if row is None or row[3] != value:
            problem(page.name, n + 1, f"kernels.md, goals, {what}: the page has '{row[3] if row else None}', "
                                      f"the raw data gives '{value}'")
    again, *_ = kernel_goal_figures(root / "docs/results/kernels-2026-11-28")
    page.compare("| goal measure | 2026-11-27, `0fd1d2b` |", "kernels.md, the 2026-11-28 rerun",
                 {what: [want[what], again[what]] for what in want})


def check_llamacpp_run_cost(root):
    """docs/llamacpp.md §5: the decode-cost table (results/llamacpp-runcost-2026-11-27/decode_cost.jsonl,
    kvfuse-bench-prefill --decode-cost) and Cache-Craft at run_cost_rows 0, 2, 4 (kvfuse-rag-eval's results.json)."""
    page = Page(root, "docs/llamacpp.md")
    d = root / "docs/results/llamacpp-runcost-2026-11-27"
    rows = [json.loads(line) for line in (d / "decode_cost.jsonl").read_text(encoding="utf-8").splitlines()]
    t = {(r["model"], r["context"], r["rows"]): r["median_ms"] for r in rows if "rows" in r}
    page.compare("| model, N | t(1) ms | t(16) ms |", "llamacpp.md, decode cost",
                 {f"{r['model']}, {r['context']}": [f"{t[r['model'], r['context'], 1]:.1f}",
                                                    f"{t[r['model'], r['context'], 16]:.1f}",
                                                    f"{t[r['model'], r['context'], 512]:.1f}", f"{r['row_ms']:.2f}",
                                                    f"{r['fixed_ms']:.1f}", f"{r['run_cost_rows']:.2f}"]
                  for r in rows if "run_cost_rows" in r})
    expected = {}
    for f in sorted(d.glob("smollm2-cachecraft-run-cost-*.json")):
        r = load_json(f)
        m = r["methods"]["cachecraft-nofocus"]
        per = " / ".join(f"{q['methods']['cachecraft-nofocus']['ttft_ratio_vs_full']:.2f}" for q in r["per_question"])
        expected[str(r["run_cost_rows"])] = [
            f"{m['ttft_ratio_vs_full']:.3f} ({per})", f"{100 * m['recompute_fraction']:.1f} %",
            f"{m['kl_first_token']:.4f}", f"{m['kl_answer_mean']:.4f}", f"{m['top1_answer_agreement']:.3f}",
            f"{100 * m['gap_closed']:.0f} %", f"{m['rouge_l_vs_full']:.3f}"]
    page.compare("| run_cost_rows | TTFT × full prefill", "llamacpp.md, merged runs", expected)


CACHECRAFT_ALPHA = re.compile(r"^cachecraft@([0-9.]+)-nofocus(-cover)?$")


def choose_alpha(results, budget):
    """scripts/bench_llamacpp_cachecraft.sh's rule: of the Cache-Craft settings measured on the calibration questions,
    the largest α whose mean TTFT is at most budget × full prefill (None when none is)."""
    fits = [(float(CACHECRAFT_ALPHA.match(m).group(1)), m) for m, r in results["methods"].items()
            if CACHECRAFT_ALPHA.match(m) and r["ttft_ratio_vs_full"] <= budget]
    return max(fits)[1] if fits else None


def cachecraft_calibration_rows(results, model, budget):
    """The calibration table of docs/llamacpp.md §7: per α, TTFT ratio (mean; per question), rows recomputed, the
    share of naive reuse's gap closed, top-1 agreement, and whether the rule chose it."""
    chosen = choose_alpha(results, budget)
    rows = {}
    for m, r in results["methods"].items():
        if not CACHECRAFT_ALPHA.match(m):
            continue
        per = " / ".join(f"{q['methods'][m]['ttft_ratio_vs_full']:.2f}" for q in results["per_question"])
        rows[f"{model}, {m}"] = [f"{r['ttft_ratio_vs_full']:.3f} ({per})", f"{100 * r['recompute_fraction']:.1f} %",
                                 f"{100 * r['gap_closed']:.0f} %", f"{r['top1_answer_agreement']:.3f}",
                                 "chosen" if m == chosen else ""]
    return rows


CACHECRAFT_LLAMACPP_MODELS = {"smollm2": "SmolLM2", "gemma3": "Gemma 3"}


def print_cachecraft_llamacpp(d, budget=0.30):
    """Prints the tables of a scripts/bench_llamacpp_cachecraft.sh output directory."""
    print("| model, setting | TTFT × full prefill (mean; per question) | rows recomputed | gap closed | top-1 | rule |")
    print("|---|---|---|---|---|---|")
    for model, name in CACHECRAFT_LLAMACPP_MODELS.items():
        f = d / f"{model}-calibration/results.json"
        if f.exists():
            for k, row in cachecraft_calibration_rows(load_json(f), name, budget).items():
                print(f"| {k} | " + " | ".join(row) + " |")
    for model, name in CACHECRAFT_LLAMACPP_MODELS.items():
        f = d / f"{model}-judged/results.json"
        if not f.exists():
            continue
        print(f"\n{name}, judged:\n")
        print("| method | questions | TTFT × full prefill (mean / median) | rows recomputed | KL first token | "
              "KL answer (teacher-forced) | top-1 agreement | gap closed | ROUGE-L vs full | F1 vs gold |")
        print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
        rows = llamacpp_rows(load_json(f)["per_question"])
        for m in sorted(rows, key=lambda m: (m != "full", m != "naive", m)):
            print(f"| {m} | " + " | ".join(rows[m]) + " |")


def check_llamacpp_cachecraft(root):
    """docs/llamacpp.md §7: Cache-Craft's α chosen on calibration questions, judged on others
    (results/llamacpp-cachecraft-2026-11-29/, scripts/bench_llamacpp_cachecraft.sh)."""
    page = Page(root, "docs/llamacpp.md")
    d = root / "docs/results/llamacpp-cachecraft-2026-11-29"
    expected = {}
    for model, name in CACHECRAFT_LLAMACPP_MODELS.items():
        expected.update(cachecraft_calibration_rows(load_json(d / f"{model}-calibration/results.json"), name, 0.30))
    page.compare("| model, setting | TTFT × full prefill (mean; per question) |", "llamacpp.md §7, calibration",
                 expected)
    for model, name in CACHECRAFT_LLAMACPP_MODELS.items():
        page.compare(f"**{name}, judged**", f"llamacpp.md §7, {name} judged",
                     llamacpp_rows(load_json(d / f"{model}-judged/results.json")["per_question"]))


def check_llamacpp_lazy_restore(root):
    """docs/llamacpp.md §8: LlamaCppFusion restoring each block eagerly (before) and lazily (after), same questions
    (results/llamacpp-lazy-restore-2026-11-29/, one kvfuse-rag-eval run per directory)."""
    page = Page(root, "docs/llamacpp.md")
    d = root / "docs/results/llamacpp-lazy-restore-2026-11-29"
    expected = {}
    for run in sorted(p for p in d.iterdir() if p.is_dir()):
        qs = load_json(run / "results.json")["per_question"]
        cells = [f"{mean_of(qs, 'full', 'ttft_ms') / 1000:.1f}"]
        for m in ("cachecraft@0.5-nofocus", "cachecraft@0.25-nofocus"):
            cells += [f"{mean_of(qs, m, 'ttft_ms') / 1000:.1f}", f"{mean_of(qs, m, 'ttft_ratio_vs_full'):.3f}",
                      f"{mean_of(qs, m, 'kl_answer_mean'):.4f}"]
        expected[run.name] = cells
    page.compare("| run | full prefill s |", "llamacpp.md §8, eager and lazy restore", expected)
    # §7's script again with lazy restore (results/llamacpp-cachecraft-lazy-2026-11-29/).
    d = root / "docs/results/llamacpp-cachecraft-lazy-2026-11-29"
    for model, name in CACHECRAFT_LLAMACPP_MODELS.items():
        page.compare(f"**{name} with lazy restore, calibration**", f"llamacpp.md §8, {name} calibration",
                     cachecraft_calibration_rows(load_json(d / f"{model}-calibration/results.json"), name, 0.30))
        page.compare(f"**{name} with lazy restore, judged**", f"llamacpp.md §8, {name} judged",
                     llamacpp_rows(load_json(d / f"{model}-judged/results.json")["per_question"]))


def check_llamacpp_block_shift(root):
    """docs/llamacpp.md §9: LlamaCppFusion builds on the same questions, in rotation (check-only/: a block checked by a
    restore or read without llama.cpp; ab/: eager restore, lazy restore with llama.cpp's shift, blocks moved in their
    bytes), one kvfuse-rag-eval run per directory, named <model>-<n>-<build>
    (results/llamacpp-block-shift-2026-11-29/)."""
    page = Page(root, "docs/llamacpp.md")
    d = root / "docs/results/llamacpp-block-shift-2026-11-29"
    for sub, anchor in (("check-only", "| run, block checked | full prefill s |"),
                        ("ab", "| run, three builds | full prefill s |")):
        expected = {}
        for run in sorted((p for p in (d / sub).iterdir() if p.is_dir()), key=lambda p: int(p.name.split("-")[1])):
            qs = load_json(run / "results.json")["per_question"]
            cells = [f"{mean_of(qs, 'full', 'ttft_ms') / 1000:.1f}"]
            for m in ("naive", "attnlink@16", "cachecraft@0.125-nofocus"):
                cells.append(f"{mean_of(qs, m, 'ttft_ratio_vs_full'):.3f}")
            cells += [f"{mean_of(qs, 'attnlink@16', 'load_ms'):.0f}",
                      f"{mean_of(qs, 'attnlink@16', 'kl_answer_mean'):.4f}",
                      f"{mean_of(qs, 'cachecraft@0.125-nofocus', 'kl_answer_mean'):.4f}"]
            expected[run.name] = cells
        page.compare(anchor, f"llamacpp.md §9, {sub}", expected)
    # §7's script again on SmolLM2 with blocks moved in their bytes (results/llamacpp-cachecraft-bytes-2026-11-29/).
    d = root / "docs/results/llamacpp-cachecraft-bytes-2026-11-29"
    name = CACHECRAFT_LLAMACPP_MODELS["smollm2"]
    page.compare(f"**{name} with blocks moved in their bytes, calibration**", f"llamacpp.md §9, {name} calibration",
                 cachecraft_calibration_rows(load_json(d / "smollm2-calibration/results.json"), name, 0.30))
    page.compare(f"**{name} with blocks moved in their bytes, judged**", f"llamacpp.md §9, {name} judged",
                 llamacpp_rows(load_json(d / "smollm2-judged/results.json")["per_question"]))
    name = CACHECRAFT_LLAMACPP_MODELS["gemma3"]
    page.compare(f"**{name} with blocks moved in their bytes, calibration**", f"llamacpp.md §9, {name} calibration",
                 cachecraft_calibration_rows(load_json(d / "gemma3-calibration/results.json"), name, 0.30))


def check_llamacpp_prefix_coverage(root):
    """docs/llamacpp.md §10: Cache-Craft with prefix coverage ("-cover"). The diagnosis (SmolLM2, questions 20-23,
    the same build without and with coverage, diagnosis/{base,cover}/), then §7's script with SUFFIX=-cover
    (results/llamacpp-cachecraft-cover-2026-11-30/)."""
    page = Page(root, "docs/llamacpp.md")
    d = root / "docs/results/llamacpp-cachecraft-cover-2026-11-30"
    expected = {}
    for run in ("base", "cover"):
        r = load_json(d / "diagnosis" / run / "results.json")
        for m, v in r["methods"].items():
            if not CACHECRAFT_ALPHA.match(m):
                continue
            kl = " / ".join(f"{q['methods'][m]['kl_answer_mean']:.4f}" for q in r["per_question"])
            expected[f"{run}, {m}"] = [f"{v['ttft_ratio_vs_full']:.3f}", f"{100 * v['recompute_fraction']:.1f} %",
                                       kl, f"{100 * v['gap_closed']:.1f} %", f"{v['top1_answer_agreement']:.3f}"]
    page.compare("| diagnosis run, setting | TTFT × full prefill (mean) |", "llamacpp.md §10, diagnosis", expected)
    for model in ("smollm2", "gemma3"):
        name = CACHECRAFT_LLAMACPP_MODELS[model]
        page.compare(f"**{name} with prefix coverage, calibration**", f"llamacpp.md §10, {name} calibration",
                     cachecraft_calibration_rows(load_json(d / f"{model}-calibration/results.json"), name, 0.30))
        page.compare(f"**{name} with prefix coverage, judged**", f"llamacpp.md §10, {name} judged",
                     llamacpp_rows(load_json(d / f"{model}-judged/results.json")["per_question"]))


def server_arm_rows(run_dir, names):
    """bench_server.sh's arms (the load generator's JSON in run_dir, by table row) as the server.md tables show them:
    TTFT p50, p99, output tok/s, and the reuse arms' exact match and ROUGE-L against their own server's full prefill."""
    expected = {}
    for row, name in names.items():
        r = load_json(run_dir / f"{name}.json")
        a = r.get("agreement")
        expected[row] = [f"{r['ttft_ms']['p50']:.0f}", f"{r['ttft_ms']['p99']:.0f}", f"{r['output_tok_s']:.2f}",
                         f"{a['exact_match']:.3f}" if a else "", f"{a['rouge_l']:.3f}" if a else ""]
    return expected


def server_summary_rows(path, names):
    """bench_server.sh's summary.json (each figure the median over its runs) as the server.md tables show them."""
    summary = load_json(path)
    expected = {}
    for row, name in names.items():
        a = summary[name]
        expected[row] = [f"{a['ttft_p50_ms']:.0f}", f"{a['ttft_p99_ms']:.0f}", f"{a['output_tok_s']:.2f}",
                         f"{a['exact_match']:.3f}" if "exact_match" in a else "",
                         f"{a['rouge_l']:.3f}" if "rouge_l" in a else ""]
    return expected


def server_run_ratios(run_dir):
    """One run of bench_server.sh: the reuse arm's TTFT p50 and throughput over llama-server --cache-reuse's, both
    arms' exact match, the requests after the first 8 answering as full prefill does, and the prompt tokens
    llama-server evaluated (its log's 'prompt eval time = ... / N tokens' lines) of all its prompt tokens."""
    arm = {n: load_json(run_dir / f"{n}.json") for n in ("kvfuse", "kvfuse-full", "llama-reuse")}
    warm = sum(a == b for a, b in zip(arm["kvfuse"]["answers"][8:], arm["kvfuse-full"]["answers"][8:]))
    evaluated = sum(int(n) for n in re.findall(r"prompt eval time =.*?/\s*(\d+) tokens",
                                               (run_dir / "llama-reuse.log").read_text()))
    k, l = arm["kvfuse"], arm["llama-reuse"]
    return [f"{k['ttft_ms']['p50'] / l['ttft_ms']['p50']:.3f}", f"{k['output_tok_s'] / l['output_tok_s']:.2f}",
            f"{k['agreement']['exact_match']:.3f}", f"{l['agreement']['exact_match']:.3f}",
            f"{warm} of {len(k['answers']) - 8}", f"{evaluated} of {sum(l['prompt_tokens'])}"]


def server_cold_rows(run_dir, method):
    """The first 8 requests of a bench_server.sh run (sent together to an empty server) and the 24 after them: TTFT
    median and max, and the sums of their chunk tokens, loaded and recomputed rows (each request's usage.kvfuse), for
    the arm of `method` (its table label) and full prefill."""
    expected = {}
    for arm, name in ((method, "kvfuse"), ("full prefill", "kvfuse-full")):
        usage = load_json(run_dir / f"{name}.json")["usage"]
        for part, group in (("first 8", usage[:8]), ("last 24", usage[8:])):
            ttft = [u["ttft_ms"] for u in group]
            expected[f"{arm}, {part}"] = [f"{st.median(ttft):.0f}", f"{max(ttft):.0f}",
                                          f"{sum(u['chunk_tokens'] for u in group)}",
                                          f"{sum(u['loaded_tokens'] for u in group)}",
                                          f"{sum(u['recomputed_tokens'] for u in group):.0f}"]
    return expected


def check_server(root):
    """docs/server.md: the arms of results/server-2026-11-27b/ (bench_server.sh's load generator output), and for both
    runs the TTFT and rows of the first 8 requests (an empty store) and the 24 after them, from each request's
    usage.kvfuse."""
    page = Page(root, "docs/server.md")
    names = {"kvfuse-server, full prefill": "kvfuse-full", "kvfuse-server, CacheBlend r = 15 %": "kvfuse",
             "llama-server, no prompt cache": "llama-full",
             "llama-server, prompt cache + `--cache-reuse 256`": "llama-reuse"}
    page.compare("| arm, 9a0aff1 | TTFT p50 ms", "server.md, arms after queuing",
                 server_arm_rows(root / "docs/results/server-2026-11-27b/run-1", names))
    for run, anchor in (("server-2026-11-27", "| arm, requests | TTFT median ms"),
                        ("server-2026-11-27b", "| arm, requests, 9a0aff1 | TTFT median ms")):
        page.compare(anchor, f"server.md, cold requests ({run})",
                     server_cold_rows(root / "docs/results" / run / "run-1", "CacheBlend"))


def check_server_cachecraft(root):
    """docs/server.md, "Cache-Craft in the server": the arms and the first 8 / last 24 requests of
    results/server-cachecraft-2026-11-29/, the ratios its summary.json gives, and the α cells beside it."""
    page = Page(root, "docs/server.md")
    d = root / "docs/results/server-cachecraft-2026-11-29"
    names = {"kvfuse-server, full prefill": "kvfuse-full", "kvfuse-server, Cache-Craft α = 1": "kvfuse",
             "llama-server, no prompt cache": "llama-full",
             "llama-server, prompt cache + `--cache-reuse 256`": "llama-reuse"}
    page.compare("| arm, d091b01 | TTFT p50 ms", "server.md, Cache-Craft arms", server_arm_rows(d / "run-1", names))
    page.compare("| arm, requests, d091b01 |", "server.md, Cache-Craft requests",
                 server_cold_rows(d / "run-1", "Cache-Craft"))
    page.compare("| arm, 64 requests, bc7b4d3 |", "server.md, Cache-Craft, 64 requests",
                 server_arm_rows(d / "requests-64/run-1", names))
    s64 = load_json(d / "requests-64/summary.json")
    said64 = (f"TTFT p50 {s64['ttft_p50_kvfuse_over_llama']:.3f} × llama-server with `--cache-reuse`",
              f"throughput {s64['throughput_kvfuse_over_llama']:.2f} ×")
    page.compare("| Cache-Craft, behind the system turn |", "server.md, Cache-Craft's alpha",
                 {"α = 1": server_cell_row(d), "α = 2": server_cell_row(d / "alpha-2"),
                  "α = 4": server_cell_row(d / "alpha-4")})
    page.compare("| arm, 3 × 64 requests, 9f35c8b, medians |", "server.md, Cache-Craft, 3 x 64 requests",
                 server_summary_rows(d / "requests-64x3/summary.json", names))
    page.compare("| run, 9f35c8b |", "server.md, Cache-Craft, 3 x 64 requests per run",
                 {str(n): server_run_ratios(d / f"requests-64x3/run-{n}") for n in (1, 2, 3)})
    s3 = load_json(d / "requests-64x3/summary.json")
    said64 += (f"TTFT p50 {s3['ttft_p50_kvfuse_over_llama']:.3f} × llama-server with",
               f"throughput {s3['throughput_kvfuse_over_llama']:.2f} ×",
               f"{s3['kvfuse']['exact_match']:.3f} exact match against llama-server's {s3['llama-reuse']['exact_match']:.3f}")
    s = load_json(d / "summary.json")
    said = (f"TTFT p50 {s['ttft_p50_kvfuse_over_llama']:.3f} × llama-server with `--cache-reuse`",
            f"throughput {s['throughput_kvfuse_over_llama']:.2f} ×")
    text = " ".join(" ".join(page.lines).split())
    for phrase in said + said64:
        if phrase not in text:
            problem("docs/server.md", 1, f"Cache-Craft in the server: the ratio '{phrase}' of summary.json is not said")


def check_server_coverage(root, results, alphas, llama_alpha, judged_alpha, commit, anchors, what):
    """docs/server.md, a section on Cache-Craft with prefix coverage in the server (docs/results/<results>/): the
    settings measured on the calibration requests (calibration/cachecraft@<α>-cover/) and llama-server on the
    requests of the α = llama_alpha run, then the issue's protocol for α = judged_alpha (requests-64x3/): the arms'
    medians (summary.json), each run's ratios, and the median ratios and exact matches the text says. anchors: the
    calibration table's and llama-server's calibration table's header starts."""
    page = Page(root, "docs/server.md")
    d = root / "docs/results" / results
    cal = d / "calibration"
    page.compare(anchors[0], f"server.md, {what}, calibration",
                 {f"α = {a} with prefix coverage": server_cell_row(cal / f"cachecraft@{a}-cover") for a in alphas})
    page.compare(anchors[1], f"server.md, {what}, calibration, llama-server",
                 server_arm_rows(cal / f"cachecraft@{llama_alpha}-cover/run-1",
                                 {"no prompt cache": "llama-full", "prompt cache + `--cache-reuse 256`": "llama-reuse"}))
    check_server_judged(page, d / "requests-64x3", judged_alpha, commit, what)


def check_server_judged(page, judged, alpha, commit, what, kvfuse="kvfuse-server"):
    """docs/server.md, the issue's protocol for Cache-Craft α = alpha with prefix coverage in bench_server.sh's
    directory `judged` (three runs): the arms' medians (summary.json), each run's ratios, and the median ratios and
    exact matches the text says. `kvfuse`: how the kvfuse arms' rows name the server."""
    names = {f"{kvfuse}, full prefill": "kvfuse-full",
             f"{kvfuse}, Cache-Craft α = {alpha} with prefix coverage": "kvfuse",
             "llama-server, no prompt cache": "llama-full",
             "llama-server, prompt cache + `--cache-reuse 256`": "llama-reuse"}
    page.compare(f"| arm, 3 × 64 requests, {commit}, medians |", f"server.md, {what}, 3 x 64 requests",
                 server_summary_rows(judged / "summary.json", names))
    page.compare(f"| run, {commit} |", f"server.md, {what}, 3 x 64 requests per run",
                 {str(n): server_run_ratios(judged / f"run-{n}") for n in (1, 2, 3)})
    s = load_json(judged / "summary.json")
    text = " ".join(" ".join(page.lines).split())
    for phrase in (f"TTFT p50 {s['ttft_p50_kvfuse_over_llama']:.3f} ×",
                   f"throughput {s['throughput_kvfuse_over_llama']:.2f} ×",
                   f"{s['kvfuse']['exact_match']:.3f} exact match against llama-server's "
                   f"{s['llama-reuse']['exact_match']:.3f}"):
        if phrase not in text:
            problem(page.name, 1, f"{what}: '{phrase}' of summary.json is not said")


def decode_csv_rows(path, before, after):
    """scripts/bench_decode.sh's decode.csv as cpu-backend.md's tables show it: per build, the median and the runs."""
    rows = list(csv.DictReader(open(path, encoding="utf-8")))
    expected = {}
    for build, commit in (("before", before), ("after", after)):
        runs = [float(r["seconds"]) for r in rows if r["build"] == build]
        expected[f"{build} (`{commit}`)"] = [f"{st.median(runs):.2f}", ", ".join(f"{x:.2f}" for x in runs)]
    return expected


def check_fusion_step(root):
    """The fusion step's statistics and row-wise steps (results/server-fast-2026-12-02/): cpu-backend.md's
    SHAPE=fusion table, speed-up and same figures (fusion/), and server.md's judged runs (requests-64x3/)."""
    page = Page(root, "docs/cpu-backend.md")
    d = root / "docs/results/server-fast-2026-12-02"
    page.compare("| build, `SHAPE=fusion` | wall s, median of 3 | runs (s) |", "cpu-backend.md, the fusion step",
                 decode_csv_rows(d / "fusion/decode.csv", "597257c", "8e46308"))
    s = load_json(d / "fusion/summary.json")
    text = " ".join(" ".join(page.lines).split())
    if not s["same_figures"] or f"{s['speedup']:.2f} × — no gain visible end to end" not in text:
        problem(page.name, 1, f"the fusion step: summary.json's speed-up {s['speedup']} (same figures: "
                              f"{s['same_figures']}) is not what the page says")
    check_server_judged(Page(root, "docs/server.md"), d / "requests-64x3", "1.5", "4dc9e5f", "a faster fusion step")


def check_server_amx(root):
    """docs/server.md, "bf16 products on AMX" (results/server-amx-2026-12-02/): the calibration run's table and the
    judged runs (requests-64x3/), kvfuse-server with --products bf16."""
    page = Page(root, "docs/server.md")
    d = root / "docs/results/server-amx-2026-12-02"
    label = "kvfuse-server --products bf16"
    page.compare("| bf16 products, calibration requests |", "server.md, bf16 products, calibration",
                 server_summary_rows(d / "calibration/summary.json",
                                     {f"{label}, full prefill": "kvfuse-full",
                                      f"{label}, Cache-Craft α = 1.5 with prefix coverage": "kvfuse",
                                      "llama-server, no prompt cache": "llama-full",
                                      "llama-server, prompt cache + `--cache-reuse 256`": "llama-reuse"}))
    check_server_judged(page, d / "requests-64x3", "1.5", "9ce65b4", "bf16 products on AMX", label)
    check_server_judged(page, d / "requests-64x3-aligned", "1.5", "0ecddd1", "bf16 products, chunk_end", label)
    alpha = [load_json(d / f"calibration-alpha/cachecraft@{a}-cover/summary.json") for a in (2, 3)]
    text = " ".join(" ".join(page.lines).split())
    for phrase in (" and ".join(f"{x['kvfuse']['exact_match']:.3f}" for x in alpha) + " of the 64 calibration",
                   "TTFT p50 of " + " and ".join(f"{x['kvfuse']['ttft_p50_ms']:.0f}" for x in alpha) + " ms"):
        if phrase not in text:
            problem(page.name, 1, f"bf16 products, α = 2 and 3 on the calibration requests: '{phrase}' is not said")


def check_cpu_amx(root):
    """docs/cpu-backend.md, "bf16 products on AMX" (results/amx-2026-12-02/): full prefill's TTFT per products
    (ttft.csv: medians of the runs, the speed-up), bench_decode.sh's two shapes (decode.csv, summary.json)."""
    page = Page(root, "docs/cpu-backend.md")
    d = root / "docs/results/amx-2026-12-02"
    rows = list(csv.DictReader(open(d / "ttft.csv", encoding="utf-8")))
    expected = {}
    for shape, name in (("5x130", "5 passages of 130 tokens"), ("10", "10 whole passages")):
        med = {p: st.median(float(r["full_prefill_ttft_ms"]) for r in rows
                            if r["shape"] == shape and r["products"] == p) for p in ("fp32", "bf16")}
        tokens = {r["mean_prompt_tokens"] for r in rows if r["shape"] == shape}
        expected[f"{name} ({float(tokens.pop()):.0f} tokens)"] = [f"{med['fp32']:.0f}", f"{med['bf16']:.0f}",
                                                                  f"{med['fp32'] / med['bf16']:.2f}"]
    page.compare("| prompt, full prefill |", "cpu-backend.md, bf16 products, full prefill", expected)
    text = " ".join(" ".join(page.lines).split())
    for shape in ("decode", "prefill"):
        page.compare(f"| products, `SHAPE={shape}` |", f"cpu-backend.md, bf16 products, SHAPE={shape}",
                     decode_csv_rows(d / shape / "decode.csv", "fp32", "bf16"))
        s = load_json(d / shape / "summary.json")
        said = f"{s['speedup']:.2f} × on the" in text
        if s["same_figures"] or s.get("after_flags") != "--products bf16" or not said:
            problem(page.name, 1, f"bf16 products, SHAPE={shape}: summary.json's speed-up {s['speedup']} is not said")


def check_cpu_prefill_avx512(root):
    """docs/cpu-backend.md, "Prefill with AVX-512": each build's median and runs (decode.csv of
    results/prefill-avx512-2026-12-02/), the speed-up and that the figures are the same (summary.json), and the
    product's GFLOP/s per version and shape (gemm.json, Google Benchmark's medians)."""
    page = Page(root, "docs/cpu-backend.md")
    d = root / "docs/results/prefill-avx512-2026-12-02"
    page.compare("| build | wall s, median of 3 | runs (s) |", "cpu-backend.md, prefill with AVX-512",
                 decode_csv_rows(d / "decode.csv", "a3d2e53", "fe48849"))
    med = {b["name"].removesuffix("_median"): b["GFLOP/s"] for b in load_json(d / "gemm.json")["benchmarks"]
           if b.get("aggregate_name") == "median"}
    gemm = {}
    for m, k, n in ((64, 576, 1536), (64, 1536, 576), (64, 576, 192), (64, 64, 700), (64, 700, 64)):
        g = {v: med[f"BM_GemmPacked/{v}/m:{m}/k:{k}/n:{n}"] for v in ("portable", "avx2", "avx512")}
        gemm[f"{m} × {k} × {n}"] = [f"{g['portable']:.1f}", f"{g['avx2']:.1f}", f"{g['avx512']:.1f}",
                                    f"{g['avx512'] / g['avx2']:.2f}"]
    page.compare("| shape m × k × n |", "cpu-backend.md, BM_GemmPacked", gemm)
    s = load_json(d / "summary.json")
    text = " ".join(" ".join(page.lines).split())
    if not s["same_figures"] or f"{s['speedup']:.2f} × faster end to end, the same figures" not in text:
        problem("docs/cpu-backend.md", 1, f"prefill with AVX-512: summary.json's speed-up {s['speedup']} "
                                          f"(same figures: {s['same_figures']}) is not what the page says")


def check_results_cover_gate(root):
    """docs/results.md, 2026-12-02: every point the gate measured for Cache-Craft with prefix coverage, per model,
    from the calibration in each run's results.json, and the gate's verdict lines."""
    page = Page(root, "docs/results.md")
    d = root / "docs/results/gate-cover-2026-12-02"
    expected = {}
    for label, run in (("SmolLM2", "smollm2-5x130"), ("Qwen2", "qwen2-5x130")):
        c = load_json(d / run / "results.json")["calibration"]["cachecraft-cover"]
        expected[f"{label}, naive"] = [f"{c['naive']['recompute_fraction']:.3f}", f"{c['naive']['kl_answer_mean']:.4f}",
                                       f"{c['naive']['top1_answer_agreement']:.3f}", ""]
        for pt in c["points"]:
            expected[f"{label}, {pt['method']}"] = [f"{pt['recompute_fraction']:.3f}", f"{pt['kl_answer_mean']:.4f}",
                                                    f"{pt['top1_answer_agreement']:.3f}",
                                                    "yes" if pt["admitted"] else "no"]
    page.compare("| model, setting (questions 97–99) |", "results.md, coverage gate", expected)
    label = "SmolLM2-135M-Instruct.Q4_1.gguf, 5 passages, with prefix coverage in the gate"
    page.compare_line(f"- {label}:", "results.md, coverage gate, SmolLM2's verdicts",
                      gate_line(load_json(d / "smollm2-5x130/results.json"), label))


def check_fidelity_chunk_context(root):
    """docs/fidelity.md, 2026-11-28: per probe and chunk caches, the teacher-forced KL per question, its mean and the
    first token's KL, from the probe outputs in results/fidelity-2026-11-28/ (as its table.py prints them)."""
    page = Page(root, "docs/fidelity.md")
    d = root / "docs/results/fidelity-2026-11-28"
    for label, stem in (("6 × 130", "six-130"), ("README", "readme-shape"), ("Gemma 3, 6 × 130", "gemma3-six-130"),
                        ("Qwen2, 6 × 130", "qwen2-six-130")):
        expected = {}
        for name, cc in (("alone", "none"), ("behind system", "system")):
            run = load_json(d / f"{stem}-{cc}.json")
            for m, mean in run["means"].items():
                expected[f"{m}, {name}"] = ([f"{q['methods'][m]['kl_answer_mean']:.4f}" for q in run["per_question"]] +
                                            [f"{mean['kl_answer_mean']:.4f}", f"{mean['kl_first_token']:.4f}"])
        page.compare(f"| {label}: probe, chunk caches |", f"fidelity.md, chunk context ({label})", expected)


NEAR_TIE = 0.1  # docs/fidelity.md, "Near-tie answer tokens": full prefill's top-1 minus top-2 probability below this


def near_tie_tables(d):
    """docs/fidelity.md, "Near-tie answer tokens": from the probe outputs in d (results/noise-floor-2026-12-02/), per
    model the answer tokens and the shares of them whose top-1 margin is below 0.05, 0.1 and 0.2; per model and probe
    the recomputed share, teacher-forced KL and top-1 (means over questions), and the top-1 kept on the answer tokens
    of margin below NEAR_TIE and at or above it (pooled over questions)."""
    shares, probes = {}, {}
    for stem, label in (("smollm2", "SmolLM2"), ("gemma3", "Gemma 3"), ("qwen2", "Qwen2")):
        path = d / f"{stem}-5x130.json"
        if not path.exists():
            continue
        run = load_json(path)
        qs = run["per_question"]
        margins = [m for q in qs for m in q["answer_top_margin"]]
        shares[label] = [str(len(qs)), str(len(margins))] + [f"{sum(m < t for m in margins) / len(margins):.3f}"
                                                            for t in (0.05, 0.1, 0.2)]
        for name, mean in run["means"].items():
            if name == "full":
                continue
            kept = [k for q in qs for k in q["methods"][name]["top1_per_answer_token"]]
            near = [k for m, k in zip(margins, kept) if m < NEAR_TIE]
            far = [k for m, k in zip(margins, kept) if m >= NEAR_TIE]
            probes[f"{label}, {name}"] = [f"{mean['compute_fraction']:.3f}", f"{mean['kl_answer_mean']:.4f}",
                                          f"{mean['top1']:.3f}", f"{sum(near) / len(near):.3f}",
                                          f"{sum(far) / len(far):.3f}"]
    return shares, probes


def check_fidelity_near_ties(root):
    """docs/fidelity.md, "Near-tie answer tokens": near_tie_tables over the committed probe outputs."""
    shares, probes = near_tie_tables(root / "docs/results/noise-floor-2026-12-02")
    page = Page(root, "docs/fidelity.md")
    page.compare("| model | questions | answer tokens |", "fidelity.md, near-tie shares", shares)
    page.compare("| model, probe | recomputed |", "fidelity.md, near-tie top-1", probes)


def check_fidelity_queryprobe(root):
    """docs/fidelity.md, "QueryProbe": per method and chunk-cache layout, results.json's means
    (results/queryprobe-2026-11-28/)."""
    d = root / "docs/results/queryprobe-2026-11-28"
    row = lambda v: [f"{v['recompute_fraction']:.3f}", f"{v['ttft_ratio_vs_full']:.3f}", f"{v['kl_answer_mean']:.4f}",
                     f"{v['top1_answer_agreement']:.3f}", f"{v['gap_closed']:.3f}"]
    expected = {}
    for cc, label in (("system", "behind system"), ("none", "alone")):
        r = load_json(d / cc / "results.json")
        if r["chunk_context"] != cc:
            problem("docs/fidelity.md", 1, f"queryprobe: {cc}/results.json says chunk_context {r['chunk_context']}")
        for m, v in r["methods"].items():
            if m == "full":
                continue
            expected[f"{m}, {label}"] = row(v)
    page = Page(root, "docs/fidelity.md")
    page.compare("| method, chunk caches | recomputed |", "fidelity.md, queryprobe", expected)
    gemma = load_json(d / "gemma3-system" / "results.json")
    page.compare("| Gemma 3 behind the system turn: method |", "fidelity.md, queryprobe, Gemma 3",
                 {m: row(v) for m, v in gemma["methods"].items() if m != "full"})


def server_cell_row(cell):
    """One bench_server.sh cell (summary.json, run-1/ answers) as the server.md tables show it: full prefill's and
    the method's TTFT p50, its p99, output tok/s, the p50 ratio, exact match, warm requests (after the first 8)
    answering as full prefill, ROUGE-L."""
    s, k = load_json(cell / "summary.json"), load_json(cell / "run-1/kvfuse.json")
    full = load_json(cell / "run-1/kvfuse-full.json")
    warm = sum(a == b for a, b in list(zip(k["answers"], full["answers"]))[8:])
    return [f"{s['kvfuse-full']['ttft_p50_ms']:.0f}", f"{s['kvfuse']['ttft_p50_ms']:.0f}",
            f"{s['kvfuse']['ttft_p99_ms']:.0f}", f"{s['kvfuse']['output_tok_s']:.2f}",
            f"{s['ttft_p50_kvfuse_over_kvfuse_full']:.3f}", f"{s['kvfuse']['exact_match']:.3f}",
            f"{warm} of {len(k['answers']) - 8}", f"{s['kvfuse']['rouge_l']:.3f}"]


def check_server_chunk_context(root):
    """docs/server.md, "Chunk caches behind the system turn": per cell of results/server-2026-11-28/, the arms'
    figures from summary.json and the warm requests' exact matches from the two arms' answers."""
    page = Page(root, "docs/server.md")
    d = root / "docs/results/server-2026-11-28"
    expected = {}
    for cc, label in (("none", "alone (`none`)"), ("system", "behind the system turn (`system`)")):
        for method, r in (("cacheblend", "15"), ("cacheblend@0.5", "50")):
            expected[f"{label}, r = {r} %"] = server_cell_row(d / f"{cc}-{method}")
    page.compare("| chunk caches, CacheBlend |", "server.md, chunk context", expected)


def check_server_auto_calibration(root):
    """docs/server.md, "`auto` behind the system turn": per setting, the calibration's KL / top-1 / recomputed in each
    chunk context (results.json's "calibration" of the two runs in results/calibration-2026-11-28/)."""
    d = root / "docs/results/calibration-2026-11-28"
    runs = {cc: load_json(d / cc / "results.json") for cc in ("system", "none")}
    for cc, r in runs.items():
        if r["chunk_context"] != cc:
            problem("docs/server.md", 1, f"auto calibration: {cc}/results.json says chunk_context {r['chunk_context']}")
    cell = lambda m: f"{m['kl_answer_mean']:.3f} / {m['top1_answer_agreement']:.3f} / {m['recompute_fraction']:.3f}"
    expected = {"naive": [cell(runs[cc]["calibration"]["cacheblend"]["naive"]) for cc in ("system", "none")]}
    for family in ("cacheblend", "attnlink", "queryaware"):
        points = {cc: {p["method"]: p for p in runs[cc]["calibration"][family]["points"]} for cc in runs}
        for method in points["system"]:
            expected[method] = [cell(points[cc][method]) for cc in ("system", "none")]
    Page(root, "docs/server.md").compare("| setting | behind the system turn", "server.md, auto calibration", expected)


def check_server_queryprobe(root):
    """docs/server.md, "QueryProbe in the server": per cell of results/server-queryprobe-2026-11-28/, the arms' figures
    from summary.json and the warm requests' exact matches from the two arms' answers."""
    d = root / "docs/results/server-queryprobe-2026-11-28"
    expected = {}
    for method in ("cacheblend", "queryprobe", "queryprobe@0.3"):
        expected[f"`{method}`"] = server_cell_row(d / method)
    Page(root, "docs/server.md").compare("| method, behind the system turn |", "server.md, queryprobe", expected)


def check_llamacpp_callback(root):
    """docs/llamacpp.md §6: full prefill and AttnLink-16 without and with llama.cpp's eval callback (prefill_ms per
    question in kvfuse-rag-eval's results.json, results/llamacpp-callback-2026-11-27/ for SmolLM2 and
    results/llamacpp-callback-2026-11-29/ for Gemma 3)."""
    runs = [("", root / "docs/results/llamacpp-callback-2026-11-27", "smollm2"),
            ("Gemma 3: ", root / "docs/results/llamacpp-callback-2026-11-29", "gemma3")]
    expected = {}
    for label, d, model in runs:
        off = load_json(d / f"{model}-q20-21-no-callback.json")["per_question"]
        on = load_json(d / f"{model}-q20-21-with-callback.json")["per_question"]
        for a, b in zip(off, on):
            ms = lambda q, m: f"{q['methods'][m]['prefill_ms']:.0f}"
            expected[f"{label}{a['index']} ({a['tokens']})"] = [ms(a, "full"), ms(b, "full"), ms(a, "attnlink@16"),
                                                                 ms(b, "attnlink@16")]
    Page(root, "docs/llamacpp.md").compare("| question (tokens) | full prefill, no callback", "llamacpp.md, callback",
                                           expected)


# ---------------------------------------------------------------------------------------------------- provenance

MEASURED_HEADER = re.compile(r"\b(ms|MB/s|GB/s|Gbps|tok/s|tokens/s|TTFT|KL|RSS|MiB|GFLOP/s|µs|median|throughput)\b")
MEASURED_LINE = re.compile(r"^(- )?(\*\*)?(Measured|Date)\b", re.M)
DATE = re.compile(r"\b20\d\d-\d\d-\d\d\b")
MACHINE = re.compile(r"\b(\d+[ -]cores?|\d+ vCPUs?|cores|machine|VM|H100|H200|A100)\b")
COMMIT = re.compile(r"`([0-9a-f]{7,40})`|\bcommits? ([0-9a-f]{7,40})\b")
COMMAND = re.compile(r"^\s*```|^ {4,}\S|`(bash |python3 |build/|scripts/|cmake |kvfuse-|\$ )", re.M)
RAW = re.compile(r"\]\((results/[^)]*)\)|raw output\W+not kept", re.I)


def sections(lines):
    """Level-2 sections as (first line index, lines); fenced code is not scanned for headings."""
    out, start, fenced = [], 0, False
    for i, line in enumerate(lines):
        if line.startswith("```"):
            fenced = not fenced
        if not fenced and line.startswith("## ") and i > 0:
            out.append((start, lines[start:i]))
            start = i
    out.append((start, lines[start:]))
    return out


def has_figures(lines):
    """Whether the lines hold a table with a measured quantity in its header or link into results/."""
    if re.search(r"\]\(results/", "\n".join(lines)):
        return True
    for i, line in enumerate(lines[:-1]):
        if line.startswith("|") and lines[i + 1].startswith("|--") and MEASURED_HEADER.search(line):
            return True
    return False


def git_commits_checkable(root):
    try:
        out = subprocess.run(["git", "-C", str(root), "rev-parse", "--is-shallow-repository"],
                             capture_output=True, text=True, check=True).stdout.strip()
        return out == "false"
    except (OSError, subprocess.CalledProcessError):
        return False


def check_provenance(root, verbose=False):
    check_commits = git_commits_checkable(root)
    for path in sorted((root / "docs").glob("*.md")):
        name = f"docs/{path.name}"
        lines = path.read_text(encoding="utf-8").splitlines()
        secs = sections(lines)
        for n, (start, sec) in enumerate(secs):
            # A section that only says it was measured ("Date:", "Measured:") and is followed by one with the
            # figures is checked with that one.
            claims = MEASURED_LINE.search("\n".join(sec)) is not None
            next_has = n + 1 < len(secs) and has_figures(secs[n + 1][1])
            if not (has_figures(sec) or (claims and not next_has)):
                continue
            # The scope: this section and the sections right before it that have no figures of their own.
            scope, k = list(sec), n - 1
            while k >= 0 and not has_figures(secs[k][1]):
                scope = secs[k][1] + scope
                k -= 1
            text = "\n".join(scope)
            title = sec[0] if sec[0].startswith("#") else "(top of the page)"
            if verbose:
                print(f"{name}:{start + 1}: measured figures in '{title}'")
            for what, pattern in (("a date (YYYY-MM-DD)", DATE), ("a machine", MACHINE), ("a commit", COMMIT),
                                  ("a command", COMMAND), ("its raw output (a link into results/ or "
                                                           "'raw output not kept')", RAW)):
                if not pattern.search(text):
                    problem(name, start + 1, f"section '{title}' reports measured figures but does not name {what}")
            for m in RAW.finditer("\n".join(sec)):
                if m.group(1) and not (path.parent / m.group(1).split("#")[0]).exists():
                    problem(name, start + 1, f"section '{title}' links to {m.group(1)}, which does not exist")
            if check_commits:
                for m in COMMIT.finditer("\n".join(sec)):
                    c = m.group(1) or m.group(2)
                    ok = subprocess.run(["git", "-C", str(root), "cat-file", "-e", f"{c}^{{commit}}"],
                                        capture_output=True).returncode == 0
                    if not ok:
                        problem(name, start + 1, f"section '{title}' names commit {c}, which is not in the history")


# ---------------------------------------------------------------------------------------------------- main


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--root", type=Path, default=Path(__file__).resolve().parent.parent)
    ap.add_argument("--verbose", action="store_true", help="list the sections found to report measured figures")
    ap.add_argument("--cake-grid", type=Path, help="print the Cake grid's table from this directory and stop")
    ap.add_argument("--cachecraft-llamacpp", type=Path,
                    help="print the tables of a scripts/bench_llamacpp_cachecraft.sh directory and stop")
    ap.add_argument("--choose-alpha", type=Path,
                    help="print the Cache-Craft setting the rule chooses from this calibration results.json and stop")
    ap.add_argument("--budget", type=float, default=0.30, help="--choose-alpha's TTFT budget (× full prefill)")
    args = ap.parse_args()
    root = args.root.resolve()
    if args.cake_grid:
        print_cake_grid(args.cake_grid)
        return 0
    if args.cachecraft_llamacpp:
        print_cachecraft_llamacpp(args.cachecraft_llamacpp, args.budget)
        return 0
    if args.choose_alpha:
        chosen = choose_alpha(load_json(args.choose_alpha), args.budget)
        if chosen is None:
            print(f"check_docs: no Cache-Craft setting in {args.choose_alpha} takes at most {args.budget} x full "
                  "prefill", file=sys.stderr)
            return 1
        print(chosen)
        return 0

    spec = importlib.util.spec_from_file_location("merge_results", root / "scripts/merge_results.py")
    merge = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(merge)

    checks = [lambda: check_results_2026_11_24(root, merge), lambda: check_three_models(root, merge, "three-models-2026-11-28", "| model, passages | `auto` |"),
              lambda: check_three_models(root, merge, "three-models-2026-12-02", "| model, passages (2026-12-02) | `auto` |",
                                         " (2026-12-02)"),
              lambda: check_cover_judged(root, merge),
              lambda: check_results_2026_11_21(root),
              lambda: check_results_alpha0(root), lambda: check_llamacpp(root), lambda: check_serving(root),
              lambda: check_cake_simulation(root), lambda: check_cake_defaults(root), lambda: check_cake_repeats(root),
              lambda: check_cake_grid(root),
              lambda: check_kernels(root), lambda: check_llamacpp_run_cost(root),
              lambda: check_llamacpp_callback(root), lambda: check_server(root),
              lambda: check_fidelity_chunk_context(root), lambda: check_server_chunk_context(root),
              lambda: check_server_auto_calibration(root), lambda: check_fidelity_queryprobe(root),
              lambda: check_server_queryprobe(root),
              lambda: check_server_cachecraft(root), lambda: check_llamacpp_cachecraft(root),
              lambda: check_llamacpp_lazy_restore(root),
              lambda: check_llamacpp_block_shift(root),
              lambda: check_llamacpp_prefix_coverage(root),
              lambda: check_server_coverage(  # "Cache-Craft with prefix coverage in the server"
                  root, "server-cover-2026-12-02", ("1", "2"), "1", "2", "e8632a8",
                  ("| Cache-Craft with prefix coverage, calibration requests |", "| llama-server, calibration requests |"),
                  "prefix coverage in the server"),
              lambda: check_server_coverage(  # "After the AVX-512 product"
                  root, "server-avx512-2026-12-02", ("1.5",), "1.5", "1.5", "fe48849",
                  ("| Cache-Craft with prefix coverage after the AVX-512 product, calibration requests |",
                   "| llama-server, calibration requests, 36c2ff3's run |"), "after the AVX-512 product"),
              lambda: check_results_cover_gate(root), lambda: check_cpu_prefill_avx512(root), lambda: check_fusion_step(root),
              lambda: check_server_amx(root), lambda: check_cpu_amx(root), lambda: check_fidelity_near_ties(root),
              lambda: check_provenance(root, args.verbose)]
    for check in checks:
        try:
            check()
        except (OSError, KeyError, ValueError, ZeroDivisionError, st.StatisticsError) as e:
            problem("scripts/check_docs.py", 0, f"{type(e).__name__}: {e}")
    for p in problems:
        print(p)
    print(f"check_docs: {len(problems)} problem(s)" if problems else
          "check_docs: every recomputed table matches its raw data; every measured section names its provenance")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
