#!/usr/bin/env python3
"""Checks `qtitan tokenizer-train` output against HF `tokenizers`: trains on a JSONL file,
loads the result with HF, and compares HF's ids with `qtitan tokenize` on every document
(plus a few strings with special tokens). Exit status 0 when all ids agree.
Usage: python3 tools/check_bpe_train.py [JSONL] [VOCAB]   (default ../shared C4 sample, 2048)
"""
import json
import os
import subprocess
import sys
import tempfile

from tokenizers import Tokenizer

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
data = sys.argv[1] if len(sys.argv) > 1 else os.path.join(ROOT, "..", "shared", "data",
                                                            "c4_sample", "c4_sample.jsonl")
vocab = sys.argv[2] if len(sys.argv) > 2 else "2048"
qt = os.path.join(ROOT, "build", "qtitan")
with tempfile.TemporaryDirectory() as d:
    subprocess.run([qt, "tokenizer-train", "--input", data, "--vocab-size", vocab, "--output", d],
                   check=True)
    hf = Tokenizer.from_file(os.path.join(d, "tokenizer.json"))
    assert hf.get_vocab_size() == int(vocab), hf.get_vocab_size()
    texts = [json.loads(l)["text"] for l in open(data, encoding="utf-8") if l.strip()]
    texts += ["<|im_start|>user\nhi there<|im_end|>\n<|endoftext|>", "  x\n\n\ty's 123 é"]
    src = os.path.join(d, "in.jsonl")
    with open(src, "w", encoding="utf-8") as f:
        for t in texts:
            f.write(json.dumps({"text": t}) + "\n")
    out = subprocess.run([qt, "tokenize", "--tokenizer", d, "--input", src], check=True,
                         capture_output=True, text=True).stdout.splitlines()
    bad = 0
    for t, line in zip(texts, out):
        want = hf.encode(t, add_special_tokens=False).ids
        got = [int(x) for x in line.split()]
        if got != want:
            bad += 1
        if hf.decode(want) != t and "<|" not in t:
            print("HF round trip differs")
            bad += 1
    print(f"{len(texts)} documents, {bad} mismatches between HF and qtitan")
    sys.exit(1 if bad or len(out) != len(texts) else 0)
