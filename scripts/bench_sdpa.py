#!/usr/bin/env python3
"""PyTorch SDPA flash causal attention: the baseline of the sparse-query attention kernel's benchmark
(bench/cuda/bench_sparse_attention.cu, goal >= 85 % of these TFLOP/s).

    python3 scripts/bench_sdpa.py

bf16, batch 1, Hq = 32 query heads and Hkv = 8 KV heads, N = 8K and 32K tokens, head_dim 64 and 128,
torch.nn.functional.scaled_dot_product_attention(..., is_causal=True) restricted to the FLASH_ATTENTION
backend. GQA through enable_gqa=True where this PyTorch supports it, else K/V repeated to 32 heads
(outside the timed region); the table says which. Median of CUDA-event timings after warm-up; useful
FLOPs of causal attention 4 * Hq * d * N(N+1)/2 (the sparse kernel's 4 * Hq * d * sum(pos_i + 1) with
every token selected). Prints a markdown table. Exits 0 with a message when torch or a GPU is missing.
"""

import statistics
import sys

HQ, HKV = 32, 8
SIZES = (8192, 32768)
HEAD_DIMS = (64, 128)


def supports_enable_gqa(torch, F) -> bool:
    """Whether this PyTorch's SDPA takes enable_gqa (2.5+). A builtin has no inspectable signature, so ask
    it: a tiny call with the keyword either runs or raises TypeError."""
    q = torch.zeros(1, 2, 1, 8, device="cuda")
    kv = torch.zeros(1, 1, 1, 8, device="cuda")
    try:
        F.scaled_dot_product_attention(q, kv, kv, enable_gqa=True)
    except TypeError:
        return False
    return True


def main() -> int:
    try:
        import torch
        import torch.nn.functional as F
    except ImportError:
        print("bench_sdpa.py: PyTorch is not installed; SDPA baseline skipped")
        return 0
    if not torch.cuda.is_available():
        print("bench_sdpa.py: no CUDA device; SDPA baseline skipped")
        return 0
    try:
        from torch.nn.attention import SDPBackend, sdpa_kernel

        def flash_only():
            return sdpa_kernel(SDPBackend.FLASH_ATTENTION)
    except ImportError:  # PyTorch < 2.3

        def flash_only():
            return torch.backends.cuda.sdp_kernel(enable_flash=True, enable_math=False, enable_mem_efficient=False)

    gqa_native = supports_enable_gqa(torch, F)
    gqa_mode = "enable_gqa=True" if gqa_native else "K/V repeated to Hq heads"
    props = torch.cuda.get_device_properties(0)
    print(f"# device: {props.name}, torch {torch.__version__}, CUDA {torch.version.cuda}")
    print(f"# SDPA flash causal, bf16, B=1, Hq={HQ}, Hkv={HKV}, GQA: {gqa_mode}")
    print("| N | head_dim | time (ms) | TFLOP/s |")
    print("|---|---|---|---|")
    for n in SIZES:
        for d in HEAD_DIMS:
            torch.manual_seed(0)
            q = torch.randn(1, HQ, n, d, device="cuda", dtype=torch.bfloat16)
            k = torch.randn(1, HKV, n, d, device="cuda", dtype=torch.bfloat16)
            v = torch.randn(1, HKV, n, d, device="cuda", dtype=torch.bfloat16)
            if gqa_native:
                def run():
                    return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
            else:
                k_rep = k.repeat_interleave(HQ // HKV, dim=1)
                v_rep = v.repeat_interleave(HQ // HKV, dim=1)

                def run():
                    return F.scaled_dot_product_attention(q, k_rep, v_rep, is_causal=True)

            try:
                with flash_only():
                    for _ in range(5):
                        run()
                    torch.cuda.synchronize()
                    reps = 10 if n > 8192 else 30
                    times = []
                    for _ in range(reps):
                        start = torch.cuda.Event(enable_timing=True)
                        stop = torch.cuda.Event(enable_timing=True)
                        start.record()
                        run()
                        stop.record()
                        stop.synchronize()
                        times.append(start.elapsed_time(stop))
            except RuntimeError as e:  # e.g. no flash kernel for this configuration
                print(f"| {n} | {d} | unavailable: {str(e).splitlines()[0]} | |")
                continue
            ms = statistics.median(times)
            flops = 4.0 * HQ * d * n * (n + 1) / 2
            print(f"| {n} | {d} | {ms:.3f} | {flops / (ms * 1e-3) / 1e12:.1f} |")
            sys.stdout.flush()
            del q, k, v
            torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    sys.exit(main())
