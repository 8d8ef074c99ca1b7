#!/usr/bin/env python3
"""Reads the TensorBoard event files of a qtitan run with TensorBoard's own reader and fails
unless they hold, for every step record of DUMP/metrics.jsonl, the same scalars (as float32)
at the same steps, and nothing else under the step tags. Checks both TensorBoard's raw record
reader (lengths and masked CRC-32C of every record) and its EventAccumulator.

A tools/ check (CI has no tensorboard package); the C-side framing is tested by
tests/test_tensorboard.c.

usage: tools/check_tensorboard.py DUMP_FOLDER [--tb-folder tb]"""
import argparse
import glob
import json
import math
import os
import struct
import sys

from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from tensorboard.compat.tensorflow_stub.pywrap_tensorflow import masked_crc32c


def check_records(path):
    """Every record's length and masked CRC-32Cs, as TensorBoard's record reader checks them."""
    data = open(path, "rb").read()
    pos, n = 0, 0
    while pos < len(data):
        header = data[pos:pos + 8]
        (length,) = struct.unpack("<Q", header)
        (crc_len,) = struct.unpack("<I", data[pos + 8:pos + 12])
        payload = data[pos + 12:pos + 12 + length]
        (crc_data,) = struct.unpack("<I", data[pos + 12 + length:pos + 16 + length])
        if crc_len != masked_crc32c(header) or crc_data != masked_crc32c(payload):
            sys.exit(f"FAIL: {path}: bad CRC in record {n} at byte {pos}")
        pos += 16 + length
        n += 1
    return n


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("dump")
    ap.add_argument("--tb-folder", default="tb")
    a = ap.parse_args()
    runs = sorted(glob.glob(os.path.join(a.dump, a.tb_folder, "*")))
    if not runs:
        sys.exit(f"FAIL: no run folder under {os.path.join(a.dump, a.tb_folder)}")
    run = runs[-1]
    files = glob.glob(os.path.join(run, "events.out.tfevents.*"))
    if len(files) != 1:
        sys.exit(f"FAIL: {run}: expected one event file, found {len(files)}")
    nrec = check_records(files[0])
    acc = EventAccumulator(run, size_guidance={"scalars": 0})
    acc.Reload()
    records = [json.loads(l) for l in open(os.path.join(a.dump, "metrics.jsonl"))]
    tags = acc.Tags()["scalars"]
    checked = 0
    for key in records[0]:
        if key == "step":
            continue
        if key not in tags:
            sys.exit(f"FAIL: TensorBoard has no scalar {key} (tags: {tags})")
        events = acc.Scalars(key)
        got = {e.step: e.value for e in events}
        if len(events) != len(records):
            sys.exit(f"FAIL: {key}: {len(events)} events, {len(records)} metrics.jsonl records")
        for r in records:
            want = r[key]
            if r["step"] not in got:
                sys.exit(f"FAIL: {key}: no event at step {r['step']}")
            v = got[r["step"]]
            w32 = struct.unpack("<f", struct.pack("<f", want))[0] if want is not None else math.nan
            if not (v == w32 or (math.isnan(v) and math.isnan(w32))):
                sys.exit(f"FAIL: {key} at step {r['step']}: TensorBoard {v}, metrics.jsonl {want}")
            checked += 1
    print(f"check_tensorboard: ok ({files[0]}: {nrec} records, {checked} scalars match "
          f"metrics.jsonl over {len(records)} steps)")


if __name__ == "__main__":
    main()
