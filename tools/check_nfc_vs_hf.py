#!/usr/bin/env python3
"""Compares utf8proc's NFC or NFKC (what qtitan uses) with HF tokenizers' normalizer on every
code point and on the canonical decomposition of every code point that has one, and prints
the differences (the two libraries ship different Unicode versions).
Usage: python3 tools/check_nfc_vs_hf.py [NFC|NFKC]
"""
import ctypes
import sys

from tokenizers import normalizers

lib = ctypes.CDLL("libutf8proc.so.2")
FORM = sys.argv[1] if len(sys.argv) > 1 else "NFC"
lib.utf8proc_NFC.restype = ctypes.c_void_p
lib.utf8proc_NFKC.restype = ctypes.c_void_p
lib.utf8proc_NFD.restype = ctypes.c_void_p
libc = ctypes.CDLL("libc.so.6")


def utf8proc(fn, s):
    p = fn(s.encode())
    r = ctypes.string_at(p).decode()
    libc.free(ctypes.c_void_p(p))
    return r


hf = getattr(normalizers, FORM)()
compose = lib.utf8proc_NFC if FORM == "NFC" else lib.utf8proc_NFKC
diffs = 0
for cp in range(1, 0x110000):
    if 0xD800 <= cp <= 0xDFFF:
        continue
    c = chr(cp)
    d = utf8proc(lib.utf8proc_NFD, c)
    for s in [c] if d == c else [c, d]:
        a, b = hf.normalize_str(s), utf8proc(compose, s)
        if a != b:
            diffs += 1
            print("U+%04X input %s: HF %s, utf8proc %s" % (
                cp, [hex(ord(x)) for x in s], [hex(ord(x)) for x in a], [hex(ord(x)) for x in b]))
print(f"{diffs} difference(s)")
