#!/usr/bin/env python3
"""Turns a kernel header of kernels/include/kvfuse/cuda/ into host C++ for the CPU emulation (README.md).

  transform_kernel.py --mode rope|sparse_attention|kv_scatter|kv_topk --input KERNEL.cuh --output OUT.cuh
                      [--ptx-emulation INC]

Every kernel<<<grid, threads[, smem[, stream]]>>>(args); becomes emu::launch_serial("kernel", ...) (kernels
without barriers or warp operations: each thread runs to completion in turn) or emu::launch("kernel", ...)
(fibers), as LAUNCHES below says for each kernel of each mode; the kernel is called through a generic lambda,
so a kernel template whose arguments are deduced from the call works. `extern __shared__ ... name[];` becomes
a pointer to the emulated dynamic shared memory; in kv_topk, each static `__shared__ T name;` becomes a
reference to emulated block-shared memory (emu::block_shared: per block, poisoned with 0xFF bytes), and for
sparse_attention the region of inline-PTX wrappers is replaced by the emulations in INC. Exits non-zero,
naming what is missing, when a pattern it relies on is not found or inline assembly is left over, so a
refactor of the kernel cannot silently make the test vacuous.
"""
import argparse
import re
import sys

# sparse_attention: the PTX wrappers lie between these two comments; each name must be defined there.
PTX_REGION_BEGIN = "// The CUDA 16-bit type of a kvfuse storage type"
PTX_REGION_END = "// Shared-memory row pitch in elements"
PTX_WRAPPERS = ["AttnType", "cp_async_16", "cp_async_4", "cp_async_commit", "cp_async_wait", "ldmatrix_x4",
                "ldmatrix_x4_trans"]
PTX_INSTRUCTIONS = ["mma.sync.aligned.m16n8k16", "cp.async.cg.shared.global", "cp.async.ca.shared.global",
                    "cp.async.commit_group", "cp.async.wait_group", "ldmatrix.sync.aligned.m8n8.x4.shared.b16",
                    "ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16"]
# Per mode: kernel name -> (launches expected in the source, "serial" or "fibers").
LAUNCHES = {
    "rope": {"rope_kernel": (1, "serial")},
    "sparse_attention": {"sparse_attention_kernel": (1, "fibers"), "sparse_attention_combine_kernel": (1, "fibers"),
                         "sparse_attention_mass_kernel": (1, "fibers"), "sparse_attention_self_mass_kernel": (1, "fibers")},
    "kv_scatter": {"kv_row_copy_kernel": (3, "serial")},
    "kv_topk": {"kv_deviation_kernel": (2, "fibers"), "radix_pass_kernel": (1, "fibers"), "iota_kernel": (1, "serial"),
                "hkvd_rank_kernel": (1, "serial"), "hkvd_flag_kernel": (1, "serial")},
}
# kv_topk: static shared-memory declarations `__shared__ TYPE name[N];` / `__shared__ TYPE name;`.
STATIC_SHARED = re.compile(r"__shared__\s+((?:typename\s+)?[\w:]+(?:<[^<>;]*>)?(?:::\w+)*)\s+(\w+)\s*(\[[^\]]+\])?\s*;")
EXPECTED_STATIC_SHARED = {"kv_topk": 3}

LAUNCH = re.compile(r"([A-Za-z_][\w:]*(?:<[^<>;]*>)?)\s*<<<(.*?)>>>\s*\(([^;]*)\)\s*;", re.S)
EXTERN_SHARED = re.compile(r"extern\s+__shared__\s+(?:__align__\(\d+\)\s+)?unsigned\s+char\s+(\w+)\[\]\s*;")


def fail(message):
    sys.exit(f"transform_kernel.py: {message}; the emulation test must be updated to the kernel source")


def split_top_level(text):
    """Splits at the commas outside brackets (angle brackets are not counted: `a < b` is no bracket)."""
    parts, depth, current = [], 0, ""
    for ch in text:
        if ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth -= 1
        if ch == "," and depth == 0:
            parts.append(current.strip())
            current = ""
        else:
            current += ch
    parts.append(current.strip())
    return parts


def replace_launches(src, mode):
    expected = LAUNCHES[mode]
    found = {name: 0 for name in expected}

    def launch(m):
        kernel = m.group(1)
        name = re.sub(r"<.*", "", kernel).split("::")[-1]
        if name not in expected:
            fail(f"launch of an unexpected kernel {kernel}")
        found[name] += 1
        launcher = "emu::launch_serial" if expected[name][1] == "serial" else "emu::launch"
        config = split_top_level(m.group(2))
        if not 2 <= len(config) <= 4:
            fail(f"launch configuration <<<{m.group(2)}>>> has {len(config)} parts")
        config += ["0", "nullptr"][len(config) - 2:]
        label = " ".join(kernel.split())
        return (f"{launcher}(\"{label}\", [&](const auto&... emu_args) {{ {kernel}(emu_args...); }}, "
                f"{', '.join(config)}, {m.group(3)});")

    src = LAUNCH.sub(launch, src)
    for name, (count, _) in expected.items():
        if found[name] != count:
            fail(f"found {found[name]} launches of {name} (<<<...>>>), expected {count}")
    if "<<<" in src:
        fail("a kernel launch (<<<) that the pattern does not match is left over")
    return src


def replace_ptx_region(src, emulation):
    begin, end = src.find(PTX_REGION_BEGIN), src.find(PTX_REGION_END)
    if begin < 0 or end < 0 or end < begin:
        fail(f"the PTX wrapper region ('{PTX_REGION_BEGIN}' ... '{PTX_REGION_END}') is not found")
    region = src[begin:end]
    for instruction in PTX_INSTRUCTIONS:
        if instruction not in region:
            fail(f"PTX instruction {instruction} is not in the wrapper region")
    for name in PTX_WRAPPERS:
        pattern = re.compile(r"\b(?:struct|void)\s+" + name + r"\b")
        if not pattern.search(region):
            fail(f"wrapper {name} is not defined in the wrapper region")
        if not pattern.search(emulation):
            fail(f"wrapper {name} has no emulation")
    return src[:begin] + emulation + src[end:]


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--mode", choices=sorted(LAUNCHES), required=True)
    parser.add_argument("--input", required=True)
    parser.add_argument("--output", required=True)
    parser.add_argument("--ptx-emulation")
    args = parser.parse_args()
    with open(args.input, encoding="utf-8") as f:
        src = f.read()
    if not src.startswith("#pragma once\n"):
        fail("the kernel header does not start with #pragma once")

    src = replace_launches(src, args.mode)
    if args.mode == "sparse_attention":
        if not args.ptx_emulation:
            fail("--ptx-emulation is required for sparse_attention")
        with open(args.ptx_emulation, encoding="utf-8") as f:
            src = replace_ptx_region(src, f.read())
        src, count = EXTERN_SHARED.subn(r"unsigned char* \1 = emu::dynamic_smem();", src)
        if count != 2:
            fail(f"found {count} 'extern __shared__ unsigned char name[];' declarations, expected 2")
    if args.mode in EXPECTED_STATIC_SHARED:
        src, count = STATIC_SHARED.subn(
            lambda m: f"auto& {m.group(2)} = emu::block_shared<{m.group(1)}{m.group(3) or ''}, __LINE__>();", src)
        if count != EXPECTED_STATIC_SHARED[args.mode]:
            fail(f"found {count} static __shared__ declarations, expected {EXPECTED_STATIC_SHARED[args.mode]}")
        if "__shared__" in src:
            fail("a __shared__ declaration the pattern does not match is left over")
    if re.search(r"\basm\b", src):
        fail("inline assembly is left over after the transformation (a new PTX wrapper needs an emulation)")
    if "extern __shared__" in src:
        fail("an extern __shared__ declaration the pattern does not match is left over")

    header = (f"// Generated by tests/emu/transform_kernel.py --mode {args.mode} from {args.input}: do not edit.\n"
              "#include <cstring>\n#include <type_traits>\n")
    src = src.replace("#pragma once\n", "#pragma once\n" + header, 1)
    with open(args.output, "w", encoding="utf-8") as f:
        f.write(src)


if __name__ == "__main__":
    main()
