#!/usr/bin/env python3
"""transformers' side of the generation benchmark: prompt processing (one forward over P
tokens with a fresh cache) and per-token greedy decode with the KV cache, as generate() runs
them, in the model's dtype (bf16) on CPU, and the process CPU seconds per decode token.
Usage: bench_transformers.py MODEL_DIR THREADS NEW P1 [P2 ...]; prints one line per P."""
import sys
import time

import torch
from transformers import AutoModelForCausalLM, DynamicCache

model_dir, threads, new = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
torch.set_num_threads(threads)
model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.bfloat16)
model.eval()
gen = torch.Generator().manual_seed(0)
with torch.inference_mode():
    for p in [int(x) for x in sys.argv[4:]]:
        ids = torch.randint(0, model.config.vocab_size, (1, p), generator=gen)
        best_pre, best_dec, dec_cpu = float("inf"), float("inf"), 0.0
        for _ in range(2):  # the first round warms up
            cache = DynamicCache(config=model.config)
            t0 = time.perf_counter()
            out = model(input_ids=ids, past_key_values=cache, use_cache=True, logits_to_keep=1)
            t1, c1 = time.perf_counter(), time.process_time()
            tok = out.logits[:, -1].argmax(-1, keepdim=True)
            for _ in range(new):
                out = model(input_ids=tok, past_key_values=cache, use_cache=True)
                tok = out.logits[:, -1].argmax(-1, keepdim=True)
            t2, c2 = time.perf_counter(), time.process_time()
            best_pre = min(best_pre, t1 - t0)
            if t2 - t1 < best_dec:
                best_dec, dec_cpu = t2 - t1, c2 - c1
        print(f"transformers {torch.__version__} P={p}: prefill {p / best_pre:.1f} tokens/s, "
              f"decode {new / best_dec:.2f} tokens/s ({threads} threads), "
              f"{dec_cpu / new:.3f} cpu-s/token", flush=True)
