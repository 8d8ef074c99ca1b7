"""PyTorch's fp32 GEMM (torch.mm, MKL in the CPU wheels) on the shapes of bench_gemm_packed.c,
at the same thread count, so the three GEMMs (dnnl_sgemm, our packed experiment, PyTorch's)
can be read side by side. Usage: python3 bench/gemm/torch_gemm.py [--threads N] [--rounds R]
(needs torch: pip install torch --index-url https://download.pytorch.org/whl/cpu)."""
import argparse
import time

import torch

# name, ta, tb, M, N, K: keep in step with bench_gemm_packed.c
SHAPES = [
    ("debug x*Wq^T", 0, 1, 512, 2048, 256), ("debug x*Wup^T", 0, 1, 512, 3072, 256),
    ("debug h*Wdown^T", 0, 1, 512, 256, 3072), ("debug o*Wo^T", 0, 1, 512, 256, 2048),
    ("debug dX=dY*Wup", 0, 0, 512, 256, 3072), ("debug dWup=dY^T*X", 1, 0, 3072, 256, 512),
    ("debug dH=dY*Wdown", 0, 0, 512, 3072, 256), ("debug dWdown=dY^T*H", 1, 0, 256, 3072, 512),
    ("0.6B x*Wup^T", 0, 1, 1024, 3072, 1024), ("0.6B o*Wo^T", 0, 1, 1024, 1024, 2048),
    ("0.6B dX=dY*Wup", 0, 0, 1024, 1024, 3072), ("0.6B dWup=dY^T*X", 1, 0, 3072, 1024, 1024),
    ("0.6B dWdown=dY^T*H", 1, 0, 1024, 3072, 1024), ("attn block S=Q*K^T", 0, 1, 64, 128, 128),
]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=4)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    print(f"threads {args.threads}, torch {torch.__version__}")
    print(f"{'shape':22s} {'M':>5s} {'N':>5s} {'K':>5s}  torch GF/s")
    for name, ta, tb, M, N, K in SHAPES:
        # stored as the C benchmark stores them: A (K, M) when ta, B (N, K) when tb
        a = torch.rand(K, M).t() if ta else torch.rand(M, K)
        b = torch.rand(N, K).t() if tb else torch.rand(K, N)
        c = torch.empty(M, N)
        flop = 2.0 * M * N * K
        reps = int(5e8 / flop) + 2
        torch.mm(a, b, out=c)
        best = float("inf")
        for _ in range(args.rounds):
            t0 = time.perf_counter()
            for _ in range(reps):
                torch.mm(a, b, out=c)
            best = min(best, time.perf_counter() - t0)
        print(f"{name:22s} {M:5d} {N:5d} {K:5d}  {flop * reps / best * 1e-9:10.1f}")


if __name__ == "__main__":
    main()
