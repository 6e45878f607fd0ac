#!/usr/bin/env python3
"""Static test: scripts/bench_kernels.sh, which builds the GPU tests and kernel benchmarks with nvcc alone on a lent
GPU machine (no CMake there), can find every quoted include of those sources: each `#include "..."` of
tests/gpu/*.cu, bench/cuda/*.cu and of the project headers they reach resolves in the source's own folder or in one
of the script's -I folders. (Once, the harness moved and the script could not build six of its ten sources; CI
builds them through CMake, which has its own include paths, so only a GPU session found out.)

Usage: bench_kernels_includes.py [repository root]. Prints each include that does not resolve; exit 1 if one."""
import os
import pathlib
import re
import sys

root = pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else pathlib.Path(__file__).resolve().parents[2])
script = (root / "scripts/bench_kernels.sh").read_text(encoding="utf-8")
dirs = [root / d for d in re.findall(r"-I(\S+?)(?=[\s)])", script)]
if not dirs:
    sys.exit("bench_kernels_includes.py: no -I folder found in scripts/bench_kernels.sh")
INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)

missing, seen = [], set()
todo = sorted((root / "tests/gpu").glob("*.cu")) + sorted((root / "bench/cuda").glob("*.cu"))
while todo:
    src = todo.pop()
    if src in seen:
        continue
    seen.add(src)
    for name in INCLUDE.findall(src.read_text(encoding="utf-8")):
        found = next((d / name for d in [src.parent] + dirs if (d / name).is_file()), None)
        if found is None:
            missing.append(f"{src.relative_to(root)}: #include \"{name}\" is in none of {src.parent.relative_to(root)}, "
                           + ", ".join(str(d.relative_to(root)) for d in dirs))
        else:
            todo.append(pathlib.Path(os.path.normpath(found)))
for m in missing:
    print(m)
print(f"bench_kernels_includes: {len(seen)} files read, {len(missing)} include(s) not found")
sys.exit(1 if missing else 0)
