#!/usr/bin/env python3
"""Reference fixtures for the tokenizer tests, made with Hugging Face `tokenizers`.

Writes into tests/fixtures/tokenizer/:
  qwen3_edge.jsonl   edge cases and random strings with the ids and decoded text HF gives for
                     the Qwen3 tokenizer (../shared/tokenizers/qwen3/tokenizer.json)
  c4_qwen3.jsonl     per C4 sample document: id count and FNV-1a 64 of the ids (the C4 text is
                     not copied); the first line names the source file's sha256 and FNV-1a 64
  tiny_gpt2/tokenizer.json   a small ByteLevel(use_regex=true) BPE trained here, merges written
                     as "a b" strings, with added tokens using lstrip / rstrip / single_word /
                     normalized, and a Sequence[NFC] normalizer
  tiny_edge.jsonl    the edge cases encoded with the tiny tokenizer
  tiny_variants.json the tiny tokenizer with other pre_tokenizer / normalizer settings
                     (ByteLevel add_prefix_space, Split with a String or a custom Regex, no
                     normalizer, NFKC) and HF's ids for a few texts under each
  qwen3_classes.json the class HF's Qwen3 pre-tokenizer gives every code point (letter, number,
                     whitespace; others omitted), probed through how it splits short strings
and src/text/unicode_classes.c, the same classes for non-ASCII code points as a C table, so
the scanner follows the Unicode version of HF's regex engine rather than utf8proc's.

Each case line holds one of "text" (a string), "hex" (raw bytes, possibly invalid UTF-8; HF
sees them decoded with errors="replace") or "repeat" ([[piece, count], ...] concatenated), and
"ids" plus "decoded" (HF's decode of those ids).
Usage: python3 tools/tokenizer_fixtures.py [SHARED_DIR]   (default ../shared)
"""
import hashlib
import json
import os
import random
import sys

from tokenizers import AddedToken, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SHARED = sys.argv[1] if len(sys.argv) > 1 else os.path.join(ROOT, "..", "shared")
OUT = os.path.join(ROOT, "tests", "fixtures", "tokenizer")

FIXED = [
    "", " ", "hello world", "Hello  world", "   leading", "trailing   ", "a\n\nb", "\r\n\r\n",
    "tab\there", "\t\t x", "NBSP\u00a0here", "\u00a0\u00a0x", "x \u00a0 y",
    "it's I'M we'LL they'Re you'VE he'd she'S", "'ſ 'ſt 'S's", "don't", "'''s", "x's'",
    "123456789", "3.14159 and 2,000,000", "٣٤٥ ۱۲۳", "Ⅻ ½ ² ③", "中文字符测试，标点。",
    "日本語のテキスト", "한국어 텍스트", "Ελληνικά κείμενα", "Русский текст", "עברית",
    "العربية", "हिन्दी", "ไทย", "emoji 👨‍👩‍👧‍👦 👍🏽 🏳️‍🌈 ❤️", "e\u0301 combining",
    "cafe\u0301", "\u212b and \u00c5 and A\u030a", "\u1100\u1161\u11a8", "ﬁ ligature",
    "<|endoftext|>", "a<|endoftext|>b", "<|im_start|>user\nhi<|im_end|>\n",
    "<think>\nreasoning\n</think>\n\nanswer", "<|endoftext", "<<|endoftext|>>",
    "<|endoftext|><|endoftext|>", " <|im_end|> ", "<tool_call>{}</tool_call>",
    "x\u2028y\u2029z", "\u3000全角\u3000", "a\u180eb", "\u200b zero\u200dwidth", "$$$ !!! ???",
    "  !!", " !!\n\n", "\n\n\nabc", "abc\n\n\n", "   \n   ", "a \r\n b", "\x00 nul \x00",
    "\x7f del", "→←↑ ∑∫", "ǅ titlecase Ǆ", "𝔘𝔫𝔦𝔠𝔬𝔡𝔢 𝟙𝟚𝟛", "10,000.50$", "file_name.py:42",
    "def f(x):\n    return x**2\n\n\tpass\n", "https://example.com/a?b=c&d=e#f",
    "ALL CAPS SHOUTING", "MiXeD cAsE", "snake_case camelCase", "   ", "\n", "\t",
    "\u0870\u0871 (Unicode 14 letters)", "\U0001FAE0 melting face", "\U00011F00\U00011F04 Kawi",
    "\u1c89\u1c8a \ua7cb Unicode 16", "\U00011935\U00011930 \U00011938 Dives Akuru",
    "a" * 100, " " * 100, "\n" * 100, "x\n \n \n y",
    # Added tokens of the tiny tokenizer: lstrip, rstrip, single_word, normalized, longest match.
    " <mask> x", "a  <mask>b", "\t\n<mask>", "<mask><mask>", "[SEP]  x", "[SEP]\n\ny",
    "word", "a word b", "sword", "words", "_word", "word_", "éword", "word1", "(word)",
    "Abc Ab Abcd", "AbAbc", "<|sep|>", "x  <|sep|>  y", "cafe\u0301 café CAFÉ", "\u00a0<mask>\u00a0",
    " [SEP] <mask> word <|sep|> ",
]

# Long runs (the 100k-character linearity checks live in the C tests, which need no HF ids).
REPEATS = [
    [["a", 3000]], [[" ", 3000]], [["\n", 3000]], [["!", 2000]], [["1", 500]],
    [["\n \n", 500]], [[" a", 500]], [["é", 1000]], [["👍", 500]], [["'s", 500]],
    [["\r\n", 1000]], [[" ", 3000], ["x", 1]], [["\u00a0", 1000], ["x", 1]], [["ab", 1000]],
]

HEXES = [b"\xff", b"abc\xffdef", b"\xc3", b"\xe2\x82", b"\xe2\x82x", b"\xf0\x9f\x98",
         b"\xed\xa0\x80", b"\xc0\xaf", b"\xf5\x80\x80\x80", b"ok \x80\x80 ok", b"\xf4\x90\x80\x80",
         b"\xe0\x80\x80", b"<|endoftext|\xff>"]

PIECES = ["a", "B", "z", "é", "E\u0301", "ß", "ſ", "İ", "ı", "中", "日", "한", "ж", "λ", "ה", "ع",
          "1", "9", "٣", "½", "Ⅻ", " ", "  ", "\t", "\n", "\r", "\r\n", "\u00a0", "\u2003",
          "\u3000", "\u2028", "\u0085", "'", "'s", "'S", "'ll", "'LL", "'Re", "'ve", "'m", "'D",
          "'t", "!", "?", ".", ",", "-", "_", "$", "%", "(", ")", "\"", "👍", "👨\u200d👩",
          "🏽", "\u200d", "\u0301", "\u0308", "\ufe0f", "<|endoftext|>", "<|im_start|>",
          "<think>", "x", "y", "hello", " world", "The", "ing", "\x00", "\x7f", "€", "£",
          "<mask>", "[SEP]", "word", "Ab", "Abc", "café", "cafe\u0301", "<|sep|>"]


def random_cases(rng, n):
    out = []
    for _ in range(n):
        k = rng.randint(1, 40)
        out.append("".join(rng.choice(PIECES) for _ in range(k)))
    return out


def random_codepoints(rng, n):
    """Strings of random code points from every plane (no surrogates)."""
    out = []
    for _ in range(n):
        cps = []
        for _ in range(rng.randint(1, 12)):
            r = rng.random()
            cp = (rng.randrange(0x80) if r < 0.3 else rng.randrange(0x10000) if r < 0.8
                  else rng.randrange(0x10000, 0x110000) if r < 0.9 else rng.randrange(0x300, 0x370))
            if 0xD800 <= cp <= 0xDFFF:
                cp = 0x20
            cps.append(chr(cp))
        out.append("".join(cps))
    return out


def fnv64(data):
    h = 0xCBF29CE484222325
    for b in data:
        h = ((h ^ b) * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return h


def ids_fnv(ids):
    return fnv64(b"".join(i.to_bytes(4, "little") for i in ids))


def case_text(case):
    if "text" in case:
        return case["text"]
    if "hex" in case:
        return bytes.fromhex(case["hex"]).decode("utf-8", errors="replace")
    return "".join(p * n for p, n in case["repeat"])


def all_cases():
    cases = [{"text": t} for t in FIXED]
    cases += [{"text": t} for t in random_cases(random.Random(1234), 400)]
    cases += [{"text": t} for t in random_codepoints(random.Random(99), 300)]
    cases += [{"repeat": r} for r in REPEATS]
    cases += [{"hex": h.hex()} for h in HEXES]
    return cases


def write_cases(tok, path):
    with open(path, "w", encoding="utf-8") as f:
        for case in all_cases():
            ids = tok.encode(case_text(case), add_special_tokens=False).ids
            row = dict(case, ids=ids)
            if "repeat" not in case:
                row["decoded"] = tok.decode(ids, skip_special_tokens=False)
            f.write(json.dumps(row, ensure_ascii=True) + "\n")


def c4_fixture(tok, src, path):
    data = open(src, "rb").read()
    with open(path, "w") as f:
        f.write(json.dumps({"source": "c4_sample/c4_sample.jsonl",
                            "sha256": hashlib.sha256(data).hexdigest(),
                            "fnv64": "%016x" % fnv64(data)}) + "\n")
        for line in data.decode("utf-8").splitlines():
            if not line.strip():
                continue
            ids = tok.encode(json.loads(line)["text"], add_special_tokens=False).ids
            f.write(json.dumps({"n": len(ids), "fnv64": "%016x" % ids_fnv(ids)}) + "\n")


def tiny_tokenizer(src, path):
    tok = Tokenizer(models.BPE())
    tok.normalizer = normalizers.Sequence([normalizers.NFC()])
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=600, min_frequency=2, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  special_tokens=["<|endoftext|>"])
    texts = [json.loads(l)["text"] for l in open(src, encoding="utf-8").read().splitlines()[:200]]
    tok.train_from_iterator(texts, trainer)
    tok.add_tokens([AddedToken("<mask>", lstrip=True, rstrip=False, normalized=False),
                    AddedToken("[SEP]", rstrip=True, normalized=False),
                    AddedToken("word", single_word=True, normalized=False),
                    AddedToken("caf\u00e9", normalized=True),
                    AddedToken("Ab", normalized=False), AddedToken("Abc", normalized=False)])
    tok.add_special_tokens([AddedToken("<|sep|>", lstrip=True, rstrip=True)])
    j = json.loads(tok.to_str())
    j["model"]["merges"] = [" ".join(m) if isinstance(m, list) else m for m in j["model"]["merges"]]
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        json.dump(j, f, ensure_ascii=False, indent=1)
    return Tokenizer.from_file(path)


def classify(pt, c):
    """L, N, S (whitespace) or O as HF's Qwen split pattern sees character c."""
    n = len(pt.pre_tokenize_str("x" + c + "x"))
    if n == 1:
        return "L"  # [^...]?\p{L}+ swallowed it with both letters
    if n == 3:
        return "N"  # \p{N} alone between the letters
    # Between letters both whitespace and other characters join the next letter; followed by
    # '!' an other character joins the punctuation run, a whitespace one stays alone.
    return "O" if len(pt.pre_tokenize_str(c + "!")) == 1 else "S"


def unicode_classes(tok, path):
    pt = tok.pre_tokenizer
    ranges = []
    for cp in range(0x110000):
        if 0xD800 <= cp <= 0xDFFF:
            continue
        k = classify(pt, chr(cp))
        if k == "O":
            continue
        if ranges and ranges[-1][1] == cp - 1 and ranges[-1][2] == k:
            ranges[-1][1] = cp
        else:
            ranges.append([cp, cp, k])
    with open(path, "w") as f:
        json.dump({"source": "HF tokenizers Qwen3 pre_tokenizer", "ranges": ranges}, f,
                  separators=(",", ":"))
    return ranges


def write_class_table(ranges, path):
    import tokenizers
    kinds = {"L": "UC_LETTER", "N": "UC_NUMBER", "S": "UC_SPACE"}
    rows = [r for r in ranges if r[0] >= 0x80]
    with open(path, "w") as f:
        f.write("/* Classes of non-ASCII code points for the pre-tokenizer (\\p{L}, \\p{N}, \\s), as HF\n"
                " * tokenizers %s splits them with the Qwen3 pattern (its regex engine has newer Unicode\n"
                " * tables than utf8proc here). Generated by tools/tokenizer_fixtures.py; do not edit.\n"
                " * Code points not listed are UC_OTHER. */\n" % tokenizers.__version__)
        f.write('#include "text/unicode_classes.h"\n\n')
        f.write("// clang-format off\n")
        f.write("const UnicodeRange UNICODE_CLASS_RANGES[] = {\n")
        for a, b, k in rows:
            f.write("    {0x%04X, 0x%04X, %s},\n" % (a, b, kinds[k]))
        f.write("};\n// clang-format on\nconst size_t UNICODE_CLASS_N_RANGES = %d;\n" % len(rows))


VARIANT_TEXTS = ["hello world", " hello", "a<mask>b c", "x\n\ny  z", "it's 12 caf\u00e9", "  ",
                 "", "word a word", "<|sep|>x y", "\ufb01 \u2460 \uff21", "cafe\u0301 \u212b"]


def variants(tiny_path, path):
    base = json.load(open(tiny_path, encoding="utf-8"))
    bl = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False}
    pres = {
        "prefix": dict(bl, add_prefix_space=True, use_regex=True),
        "no_regex": bl,
        "split_string": {"type": "Sequence", "pretokenizers": [
            {"type": "Split", "pattern": {"String": " "}, "behavior": "Isolated", "invert": False},
            bl]},
        "split_regex_prefix": {"type": "Sequence", "pretokenizers": [
            {"type": "Split", "pattern": {"Regex": "\\s+|\\p{N}+|\\P{L}"},
             "behavior": "Isolated", "invert": False}, dict(bl, add_prefix_space=True)]},
    }
    norms = {"nfc": {"type": "NFC"}, "none": None, "nfkc": {"type": "NFKC"},
             "seq_nfd_nfc": {"type": "Sequence", "normalizers": [{"type": "NFD"}, {"type": "NFC"}]}}
    out = []
    for pname, pre in pres.items():
        for nname, norm in norms.items():
            j = dict(base, pre_tokenizer=pre, normalizer=norm)
            tok = Tokenizer.from_str(json.dumps(j))
            cases = [{"text": t, "ids": tok.encode(t, add_special_tokens=False).ids}
                     for t in VARIANT_TEXTS]
            out.append({"name": pname + "/" + nname, "pre_tokenizer": pre, "normalizer": norm,
                        "cases": cases})
    with open(path, "w", encoding="utf-8") as f:
        json.dump({"variants": out}, f, ensure_ascii=True)


def main():
    os.makedirs(OUT, exist_ok=True)
    qwen = Tokenizer.from_file(os.path.join(SHARED, "tokenizers", "qwen3", "tokenizer.json"))
    c4 = os.path.join(SHARED, "data", "c4_sample", "c4_sample.jsonl")
    write_cases(qwen, os.path.join(OUT, "qwen3_edge.jsonl"))
    ranges = unicode_classes(qwen, os.path.join(OUT, "qwen3_classes.json"))
    write_class_table(ranges, os.path.join(ROOT, "src", "text", "unicode_classes.c"))
    c4_fixture(qwen, c4, os.path.join(OUT, "c4_qwen3.jsonl"))
    tiny = tiny_tokenizer(c4, os.path.join(OUT, "tiny_gpt2", "tokenizer.json"))
    write_cases(tiny, os.path.join(OUT, "tiny_edge.jsonl"))
    variants(os.path.join(OUT, "tiny_gpt2", "tokenizer.json"), os.path.join(OUT, "tiny_variants.json"))


if __name__ == "__main__":
    main()
