#!/usr/bin/env python3
"""peft adapters of the LoRA variants qtitan merges for inference (`generate --adapter`, `eval
--adapter`), and what HF peft computes with them, for tests/e2e_peft_variants.sh.

Writes tests/fixtures/peft_variants/:
  base_untied/      config.json, model.safetensors: a random two-layer Qwen3 over the vocabulary
                    of tests/fixtures/generate/cli_tiny (whose tokenizer.json the test copies
                    beside it), lm_head untied
  <case>/           adapter_config.json, adapter_model.safetensors (peft's save_pretrained),
                    every factor random so that each setting changes the output:
    dora            use_dora on all seven linears of base_untied (random magnitudes)
    patterns        base_untied: rank_pattern and alpha_pattern (a key naming one layer's
                    module, a key naming a module in every layer), modules_to_save ["lm_head",
                    "norm"] and trainable_token_indices {"embed_tokens": [...]}
    tied_tokens     cli_tiny (tied): DoRA with use_rslora on two linears and
                    trainable_token_indices as a list (the embedding's rows, which the tied
                    output shares)
  expected.json     for each case: the base ("base_untied" or "cli_tiny"), the prompt's ids,
                    the NEW greedy ids PeftModel.generate gives (unmerged adapters, fp32, eager
                    attention) with the log-probability of each (log_softmax of the raw logits),
                    and `loss`: the model's mean next-token cross-entropy over `tokens` (for
                    `qtitan eval --tokens`). A case is kept only where float64 gives the same
                    ids and the base alone others. The trainable token rows are ids of the
                    prompt (and, tied, of what the model answers), so that they count.

Run from the repo root: python3 tools/make_peft_variants_fixture.py [OUT_DIR]
"""
import json
import os
import shutil

import torch
from fixture_util import eager_model, out_root, save_model, scramble, seeded
from peft import LoraConfig, PeftModel, get_peft_model
from tokenizers import Tokenizer
from transformers import AutoModelForCausalLM, Qwen3Config, Qwen3ForCausalLM

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CLI_TINY = os.path.join(ROOT, "tests", "fixtures", "generate", "cli_tiny")
NEW = 12
PROMPT = "The quick brown fox jumps over the lazy dog"
ALL = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
CASES = [
    dict(name="dora", base="base_untied",
         lora=dict(r=4, lora_alpha=8, target_modules=ALL, use_dora=True)),
    dict(name="patterns", base="base_untied",
         lora=dict(r=4, lora_alpha=6, target_modules=ALL,
                   rank_pattern={"layers.1.self_attn.q_proj": 2, "v_proj": 3},
                   alpha_pattern={"down_proj": 3, r"layers\.0\.mlp\.up_proj": 10},
                   modules_to_save=["lm_head", "norm"],
                   trainable_token_indices={"embed_tokens": [311, 87, 78, 275]})),
    dict(name="tied_tokens", base="cli_tiny",
         lora=dict(r=2, lora_alpha=4, target_modules=["q_proj", "down_proj"], use_dora=True,
                   use_rslora=True, trainable_token_indices=[481, 547, 590, 71])),
]


def base_untied(d):
    gen = seeded(1201)
    vocab = json.load(open(os.path.join(CLI_TINY, "config.json")))["vocab_size"]
    _, model = eager_model(Qwen3Config, Qwen3ForCausalLM, vocab_size=vocab, hidden_size=16,
                           intermediate_size=24, num_hidden_layers=2, num_attention_heads=2,
                           num_key_value_heads=1, head_dim=8, max_position_embeddings=128,
                           tie_word_embeddings=False, rope_theta=10000.0, eos_token_id=None,
                           bos_token_id=None, pad_token_id=None)
    scramble(model, gen)
    save_model(model, d)


def randomize(pm, gen):
    """Every trainable tensor of the adapter random: LoRA factors, magnitudes (around their
    initial row norms), saved modules and token rows."""
    with torch.no_grad():
        for name, p in pm.named_parameters():
            if not p.requires_grad:
                continue
            noise = torch.randn(p.shape, generator=gen, dtype=torch.float64).to(p.dtype)
            if "lora_magnitude_vector" in name:
                p.mul_(1 + 0.3 * noise)
            elif "lora_" in name:
                p.copy_(0.3 * noise)
            else:
                p.copy_(0.4 * noise)


def run(model, ids):
    with torch.no_grad():
        out = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False,
                             max_new_tokens=NEW, output_logits=True,
                             return_dict_in_generate=True, eos_token_id=None, pad_token_id=0)
        new = out.sequences[0, ids.shape[1]:]
        lps = [float(torch.log_softmax(lg[0].double(), -1)[new[t]])
               for t, lg in enumerate(out.logits)]
        loss = float(model(ids, labels=ids).loss)
    return new.tolist(), lps, loss


def main():
    out = out_root("peft_variants")
    os.makedirs(out, exist_ok=True)
    base_untied(os.path.join(out, "base_untied"))
    tok = Tokenizer.from_file(os.path.join(CLI_TINY, "tokenizer.json"))
    ids = torch.tensor([tok.encode(PROMPT).ids])
    expected = {}
    for i, c in enumerate(CASES):
        base_dir = CLI_TINY if c["base"] == "cli_tiny" else os.path.join(out, c["base"])
        for attempt in range(20):
            gen = torch.Generator().manual_seed(1301 + 100 * i + attempt)
            base = AutoModelForCausalLM.from_pretrained(base_dir, attn_implementation="eager")
            pm = get_peft_model(base, LoraConfig(**c["lora"]))
            randomize(pm, gen)
            d = os.path.join(out, c["name"])
            if os.path.exists(d):
                shutil.rmtree(d)
            pm.save_pretrained(d)
            os.remove(os.path.join(d, "README.md"))
            # The same bytes on every run: the base named as the test names it, and
            # target_modules (a set in peft) in order.
            cfg_path = os.path.join(d, "adapter_config.json")
            with open(cfg_path) as f:
                cfg = json.load(f)
            cfg["base_model_name_or_path"] = c["base"]
            cfg["target_modules"] = sorted(cfg["target_modules"])
            with open(cfg_path, "w") as f:
                json.dump(cfg, f, indent=2, sort_keys=True)
                f.write("\n")
            got = {}
            for dt in (torch.float32, torch.float64):
                b = AutoModelForCausalLM.from_pretrained(base_dir, attn_implementation="eager",
                                                         dtype=dt)
                m = PeftModel.from_pretrained(b, d).eval()
                m.to(dt)
                got[dt] = run(m, ids)
            plain = run(AutoModelForCausalLM.from_pretrained(
                base_dir, attn_implementation="eager").eval(), ids)
            if got[torch.float32][0] == got[torch.float64][0] and plain[0] != got[torch.float32][0]:
                break
        else:
            raise SystemExit(f"{c['name']}: no adapter whose greedy ids float64 agrees with")
        new, lps, loss = got[torch.float32]
        expected[c["name"]] = dict(base=c["base"], prompt=PROMPT, prompt_ids=ids[0].tolist(),
                                   ids=new, logprobs=lps, tokens=ids[0].tolist(), loss=loss)
        print(f"{c['name']}: ids {new}, loss {loss:.6f} (base alone {plain[2]:.6f})")
    with open(os.path.join(out, "expected.json"), "w") as f:
        json.dump(expected, f, indent=1)
        f.write("\n")


if __name__ == "__main__":
    torch.set_num_threads(1)
    main()
