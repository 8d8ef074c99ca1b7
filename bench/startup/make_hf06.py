"""A random Qwen3-0.6B-shaped HF directory (bf16 weights, N(0, 0.02)) for timing the start-up of
`qtitan eval` / `qtitan generate` (bench/README.md, Start-up):
  python3 bench/startup/make_hf06.py OUT_DIR [TOKENIZER_DIR]
Needs numpy only: config.json has Qwen3-0.6B's keys, model.safetensors (1.19 GB) the tensors
transformers' save_pretrained writes for it (tied embeddings: no lm_head.weight), laid out as
the safetensors package lays them out (names sorted, `__metadata__` {"format": "pt"}, data at an
8-byte aligned offset). TOKENIZER_DIR (default ../shared/tokenizers/qwen3) gives
tokenizer.json, which generate and eval --dataset need."""
import json
import os
import shutil
import struct
import sys

import numpy as np

CONFIG = {
    "architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "attention_bias": False,
    "attention_dropout": 0.0, "bos_token_id": 151643, "eos_token_id": 151645, "head_dim": 128,
    "hidden_act": "silu", "hidden_size": 1024, "initializer_range": 0.02,
    "intermediate_size": 3072, "max_position_embeddings": 40960, "max_window_layers": 28,
    "num_attention_heads": 16, "num_hidden_layers": 28, "num_key_value_heads": 8,
    "rms_norm_eps": 1e-06, "rope_scaling": None, "rope_theta": 1000000, "sliding_window": None,
    "tie_word_embeddings": True, "torch_dtype": "bfloat16", "use_cache": True,
    "use_sliding_window": False, "vocab_size": 151936,
}


def shapes(c):
    d, f, v = c["hidden_size"], c["intermediate_size"], c["vocab_size"]
    q, kv = c["num_attention_heads"] * c["head_dim"], c["num_key_value_heads"] * c["head_dim"]
    out = {"model.embed_tokens.weight": (v, d), "model.norm.weight": (d,)}
    for i in range(c["num_hidden_layers"]):
        p = f"model.layers.{i}."
        out.update({
            p + "input_layernorm.weight": (d,), p + "post_attention_layernorm.weight": (d,),
            p + "self_attn.q_proj.weight": (q, d), p + "self_attn.k_proj.weight": (kv, d),
            p + "self_attn.v_proj.weight": (kv, d), p + "self_attn.o_proj.weight": (d, q),
            p + "self_attn.q_norm.weight": (c["head_dim"],),
            p + "self_attn.k_norm.weight": (c["head_dim"],),
            p + "mlp.gate_proj.weight": (f, d), p + "mlp.up_proj.weight": (f, d),
            p + "mlp.down_proj.weight": (d, f)})
    return out


def bf16_normal(rng, n, std):
    """n values of N(0, std) as bf16 bits, rounded to nearest even as torch rounds."""
    u = (rng.standard_normal(n, dtype=np.float32) * np.float32(std)).view(np.uint32)
    return ((u + (np.uint32(0x7FFF) + ((u >> 16) & 1))) >> 16).astype("<u2")


def main():
    out = sys.argv[1]
    tok = sys.argv[2] if len(sys.argv) > 2 else os.path.join(
        os.path.dirname(__file__), "..", "..", "..", "shared", "tokenizers", "qwen3")
    os.makedirs(out, exist_ok=True)
    tensors = sorted(shapes(CONFIG).items())
    header, off = {"__metadata__": {"format": "pt"}}, 0
    for name, shape in tensors:
        n = 2 * int(np.prod(shape))
        header[name] = {"dtype": "BF16", "shape": list(shape), "data_offsets": [off, off + n]}
        off += n
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-(8 + len(text)) % 8)
    rng = np.random.default_rng(0)
    path = os.path.join(out, "model.safetensors")
    with open(path + ".tmp", "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text)
        for name, shape in tensors:
            f.write(bf16_normal(rng, int(np.prod(shape)), 0.02).tobytes())
    os.replace(path + ".tmp", path)
    with open(os.path.join(out, "config.json"), "w") as f:
        json.dump(CONFIG, f, indent=2)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        if os.path.exists(os.path.join(tok, name)):
            shutil.copy(os.path.join(tok, name), out)
    print(f"wrote {out} ({off + 8 + len(text)} bytes of weights)")


if __name__ == "__main__":
    main()
