#!/usr/bin/env python3
"""Static test: no include in kvfuse's public headers points up a layer, and the library never reaches the test
harness. The layers, lowest first (a header may include its own folder and any lower layer):

  0 core/                      vocabulary: types, errors, statuses, keys, hashing, RoPE frequencies
  1 detail/                    internals shared by what follows (math, top-k, attention, RoPE element math)
  2 backend/ (not cpu)         the backend concepts and the stores;  model/  GGUF, ggml formats, tokenizers;
    kernel_args/               the CUDA kernels' argument structs (three folders of one layer: none includes another)
  3 schedule/ select/ split/   the policies (Cake, CacheBlend's selector and loading controller, Epic, Cache-Craft)
  4 cache/                     the variant cache (Cache-Craft: built on the CCI scorer)
  5 fusion/                    the fusion loop: planner, connector, pipeline
  6 backend/cpu/, backend/cpu_llama.hpp   the reference CPU engine
  7 the umbrella headers (kvfuse.hpp, stores.hpp, runtime.hpp, cpu.hpp)

Usage: include_layers.py [repository root]. Prints every violation; exit 1 if there is one."""
import pathlib
import re
import sys

RANK = {"core": 0, "detail": 1, "backend": 2, "model": 2, "kernel_args": 2, "schedule": 3, "select": 3, "split": 3,
        "cache": 4, "fusion": 5, "backend/cpu": 6, "(umbrella)": 7}


def layer(path: str) -> str:
    """The layer of a header path relative to include/kvfuse."""
    if path.startswith("backend/cpu"):  # backend/cpu/*.hpp and backend/cpu_llama.hpp
        return "backend/cpu"
    return path.split("/")[0] if "/" in path else "(umbrella)"


def main() -> int:
    root = pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else pathlib.Path(__file__).resolve().parents[2])
    base = root / "include" / "kvfuse"
    headers = sorted(base.rglob("*.hpp"))
    if len(headers) < 50:
        print(f"include_layers: only {len(headers)} headers under {base}; wrong root?")
        return 1
    bad = []
    for h in headers:
        src = h.relative_to(base).as_posix()
        a = layer(src)
        if a not in RANK:
            bad.append(f"{src}: folder '{a}' has no layer (add it to {pathlib.Path(__file__).name})")
            continue
        for n, line in enumerate(h.read_text().splitlines(), 1):
            m = re.match(r'\s*#\s*include\s+"kvfuse/([^"]+)"', line)
            if not m:
                continue
            target = m.group(1)
            if target.startswith("harness/"):
                bad.append(f"{src}:{n}: includes {target}: the library never includes the test harness")
                continue
            if not (base / target).is_file():
                bad.append(f"{src}:{n}: includes {target}, which is not a header of include/kvfuse")
                continue
            b = layer(target)
            if a == b:
                continue
            if RANK[b] >= RANK[a]:
                bad.append(f"{src}:{n}: includes {target}: {b} (layer {RANK[b]}) is not below {a} (layer {RANK[a]})")
    for line in bad:
        print(line)
    print(f"include_layers: {len(headers)} headers, {len(bad)} include(s) pointing up or sideways")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
