#!/usr/bin/env python3
"""Single-thread encode speed of HF tokenizers and tiktoken on a JSONL file (bench only).

HF: Tokenizer.from_file(...).encode(text, add_special_tokens=False) per document, with
RAYON_NUM_THREADS=1 and TOKENIZERS_PARALLELISM=false set by run.sh. tiktoken: an Encoding
built from the same tokenizer.json (ranks = ids of the byte-level tokens, the Qwen split
pattern, the added tokens as specials); it does no NFC, and the script reports whether its
ids equal HF's on this file.
Usage: bench_py.py TOKENIZER_JSON JSONL [REPEATS]
"""
import json
import sys
import time


def byte_decoder():
    bs = list(range(33, 127)) + list(range(161, 173)) + list(range(174, 256))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {chr(c): b for b, c in zip(bs, cs)}


def best_rate(fn, texts, nbytes, repeats):
    """Best MB/s over `repeats` passes, timed in CPU time of the process (fair on a busy
    machine, and it counts HF's Rayon pool thread for encode_batch)."""
    best = 0.0
    for _ in range(repeats):
        t0 = time.process_time()
        out = fn(texts)
        dt = time.process_time() - t0
        best = max(best, nbytes / dt / 1e6)
    return best, out


def main():
    tok_path, data_path = sys.argv[1], sys.argv[2]
    repeats = int(sys.argv[3]) if len(sys.argv) > 3 else 3
    texts = [json.loads(l)["text"] for l in open(data_path, encoding="utf-8") if l.strip()]
    nbytes = sum(len(t.encode("utf-8")) for t in texts)

    from tokenizers import Tokenizer
    import tokenizers
    hf = Tokenizer.from_file(tok_path)
    rate, hf_ids = best_rate(lambda ts: [hf.encode(t, add_special_tokens=False).ids for t in ts],
                             texts, nbytes, repeats)
    print(f"hf_tokenizers {tokenizers.__version__}: {rate:.2f} MB/s (encode per document)")
    rate, _ = best_rate(lambda ts: hf.encode_batch(ts, add_special_tokens=False), texts, nbytes,
                        repeats)
    print(f"hf_tokenizers {tokenizers.__version__}: {rate:.2f} MB/s (encode_batch, 1 thread)")

    try:
        import tiktoken
    except ImportError:
        print("tiktoken: not installed")
        return
    j = json.load(open(tok_path, encoding="utf-8"))
    dec = byte_decoder()
    ranks = {bytes(dec[c] for c in tokstr): i for tokstr, i in j["model"]["vocab"].items()}
    pattern = None
    pre = j["pre_tokenizer"]
    for p in pre.get("pretokenizers", [pre]):
        if p["type"] == "Split":
            pattern = p["pattern"]["Regex"]
    enc = tiktoken.Encoding("qwen3_bench", pat_str=pattern, mergeable_ranks=ranks,
                            special_tokens={a["content"]: a["id"] for a in j["added_tokens"]})
    rate, tk_ids = best_rate(lambda ts: [enc.encode(t, allowed_special="all") for t in ts], texts,
                             nbytes, repeats)
    same = sum(a == b for a, b in zip(tk_ids, hf_ids))
    print(f"tiktoken {tiktoken.__version__}: {rate:.2f} MB/s (encode per document); "
          f"ids equal to HF on {same}/{len(texts)} documents")


if __name__ == "__main__":
    main()
