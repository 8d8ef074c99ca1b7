#!/usr/bin/env python3
"""Masked SFT loss reference: transformers' loss of a batch whose labels are -100 outside
assistant spans, on the tiny Qwen3 of tests/fixtures/train_parity (vocab 64).

Writes tests/fixtures/chat/masked_loss.json:
  {"conversations": [{"ids": [...], "labels": [...]}, ...]   (HF convention: labels[i] is
                     the token the model should predict at i-1; -100 = not counted)
   "loss": transformers' loss of the conversations as one right-padded batch
           (attention_mask, pad labels -100): mean cross-entropy over the counted labels,
   "count": number of counted labels}
The script checks that the same number comes from each conversation run alone (summed
cross-entropy over all of them, divided by the count), which is what one packed row with a
document mask computes.
Run from the repo root: python3 tools/make_masked_loss_fixture.py
"""
import json
import os

import torch
import torch.nn.functional as F
from transformers import Qwen3ForCausalLM

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MODEL = os.path.join(ROOT, "tests", "fixtures", "train_parity")
OUT = os.path.join(ROOT, "tests", "fixtures", "chat", "masked_loss.json")


def main():
    torch.manual_seed(1)
    model = Qwen3ForCausalLM.from_pretrained(MODEL, torch_dtype=torch.float32,
                                             attn_implementation="eager").eval()
    lengths = [7, 5, 9]
    # Counted spans (inclusive start, exclusive end) per conversation: assistant turns.
    spans = [[(3, 7)], [(2, 3), (4, 5)], [(1, 4), (6, 9)]]
    convs = []
    for n, sp in zip(lengths, spans):
        ids = torch.randint(1, 64, (n,)).tolist()
        labels = [-100] * n
        for a, b in sp:
            for i in range(a, b):
                labels[i] = ids[i]
        convs.append({"ids": ids, "labels": labels})
    T = max(lengths)
    inp = torch.zeros(len(convs), T, dtype=torch.long)
    lab = torch.full((len(convs), T), -100, dtype=torch.long)
    att = torch.zeros(len(convs), T, dtype=torch.long)
    for r, c in enumerate(convs):
        n = len(c["ids"])
        inp[r, :n] = torch.tensor(c["ids"])
        lab[r, :n] = torch.tensor(c["labels"])
        att[r, :n] = 1
    with torch.no_grad():
        loss = model(input_ids=inp, attention_mask=att, labels=lab).loss.item()
        total, count = 0.0, 0
        for c in convs:
            logits = model(input_ids=torch.tensor([c["ids"]])).logits[0, :-1].double()
            tgt = torch.tensor(c["labels"][1:])
            total += F.cross_entropy(logits, tgt, ignore_index=-100, reduction="sum").item()
            count += int((tgt != -100).sum())
    assert abs(total / count - loss) <= 1e-6 * abs(loss), (total / count, loss)
    os.makedirs(os.path.dirname(OUT), exist_ok=True)
    with open(OUT, "w") as f:
        json.dump({"conversations": convs, "loss": loss, "count": count}, f)
        f.write("\n")
    print(f"loss {loss:.8f} over {count} labels -> {OUT}")


if __name__ == "__main__":
    main()
