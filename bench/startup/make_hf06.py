"""A random Qwen3-0.6B-shaped HF directory (bf16 weights, N(0, 0.02)) for timing the start-up of
`qtitan eval` / `qtitan generate` (bench/README.md, Start-up):
  python3 bench/startup/make_hf06.py OUT_DIR [TOKENIZER_DIR]
TOKENIZER_DIR (default ../shared/tokenizers/qwen3) gives tokenizer.json, which generate and
eval --dataset need."""
import os
import shutil
import sys

import torch
from transformers import Qwen3Config, Qwen3ForCausalLM


def main():
    out = sys.argv[1]
    tok = sys.argv[2] if len(sys.argv) > 2 else os.path.join(
        os.path.dirname(__file__), "..", "..", "..", "shared", "tokenizers", "qwen3")
    cfg = Qwen3Config(vocab_size=151936, hidden_size=1024, intermediate_size=3072,
                      num_hidden_layers=28, num_attention_heads=16, num_key_value_heads=8,
                      head_dim=128, tie_word_embeddings=True, rms_norm_eps=1e-6,
                      max_position_embeddings=40960,
                      rope_parameters={"rope_type": "default", "rope_theta": 1e6})
    torch.manual_seed(0)
    torch.set_default_dtype(torch.bfloat16)
    # Built on the meta device and filled in place: no fp32 copy of 0.6 G parameters.
    with torch.device("meta"):
        model = Qwen3ForCausalLM(cfg)
    model = model.to_empty(device="cpu")
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0, 0.02)
    model.save_pretrained(out, safe_serialization=True)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        if os.path.exists(os.path.join(tok, name)):
            shutil.copy(os.path.join(tok, name), out)
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
