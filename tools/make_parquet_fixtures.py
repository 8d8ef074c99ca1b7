#!/usr/bin/env python3
"""Parquet files written by pyarrow, the library behind Hugging Face datasets' Parquet files,
as references for tests/test_parquet.c (src/text/parquet.c) and tests/e2e_parquet.sh.

Writes tests/fixtures/parquet/:
  snappy_dict.parquet   pyarrow's defaults (Snappy, dictionary-encoded, data pages v1), a
                        nullable "text" column beside an integer and a struct column, two row
                        groups
  zstd_v2.parquet       Zstandard, data pages v2, PLAIN strings, nulls, many small pages
  gzip_fallback.parquet gzip; the dictionary outgrows its limit, so the chunk holds a
                        dictionary page, dictionary-encoded pages, then PLAIN pages
  plain_required.parquet uncompressed, a non-nullable large_string "text": empty, long and
                        non-ASCII values
  delta_prefix.parquet  DELTA_BYTE_ARRAY strings (shared prefixes), Snappy, nulls, small pages
  delta_length.parquet  DELTA_LENGTH_BYTE_ARRAY strings, Zstandard, data pages v2, nulls
  many.parquet          "row 0" .. "row 5999" in one row group of small dictionary pages, for
                        test_parquet's streamed batches
  content.parquet       zstd_v2.parquet's texts in a "content" column, beside a "text" column
                        of other texts (training.dataset_text_field = "content")
  tiny_gzip.parquet, tiny_none_v2.parquet
                        four short values with a null (gzip, v1 pages; uncompressed, v2 pages):
                        test_parquet changes each byte of the first; both seed fuzz_parquet
  empty.parquet         a text column and no rows (one empty row group)
  expected.json         per file, its non-null "text" values in row order
  chat.parquet          conversations: a "messages" list of {role, content} beside a
                        "prompt_id" column (list/element names, Snappy, two row groups)
  chat_item.parquet     the same, written with pyarrow's older list/item names, Zstandard, v2
                        data pages
  chat.jsonl            the same conversations as JSON Lines
  chat_reasoning.parquet, chat_reasoning.jsonl
                        assistant messages with reasoning_content or thinking (or neither), in
                        Parquet and as JSON Lines
  alpaca.parquet, alpaca.jsonl
                        instruction / input (empty for some rows) / output string columns, and
                        the same rows as JSON Lines (training.data_format = instruction)
  prompts.parquet, prompts.jsonl
                        prompt / completion string columns, and as JSON Lines
and files qtitan must refuse with a sentence:
  lzo.parquet           lz4.parquet with its codec changed to LZO in the footer
  lz4.parquet, brotli.parquet
                        zstd_v2.parquet's texts with the LZ4_RAW and BROTLI codecs
  int_text.parquet      "text" holds integers
  no_text.parquet       no "text" column (its columns: "content", "id")
  nested_text.parquet   "text" is a list of strings
  chat_extra.parquet    messages whose "tool_calls" field is a string, not a list of calls
  chat_tool_calls.parquet / chat_tool_calls_bare.parquet (+ .jsonl)
                        conversations with tool calls in OpenAI's shape and bare, the same rows
                        as JSON Lines
  chat_tools.parquet    conversations beside a "tools" column (tool definitions), refused too
  chat_sharegpt.parquet chat.jsonl's conversations as ShareGPT writes them ("conversations" of
                        {from, value}, roles human / gpt / system)
  chat_many.parquet, chat_many_bad.parquet
                        3,000 short conversations (more than a render batch), and the same with
                        rows 1500 and 1600 bad, for test_chat_data

Usage: python3 tools/make_parquet_fixtures.py [OUT_DIR]
"""
import json
import os
import random

import pyarrow as pa
import pyarrow.parquet as pq
from fixture_util import out_root

OUT = out_root("parquet")


def texts(seed, n, null_every=0):
    r = random.Random(seed)
    words = ["the", "small", "caf\u00e9", "\u4f60\u597d", "model", "\U0001F600", "data", "\n",
             "tab\there", "quote\"s", "back\\slash", "\u0000nul"]
    out = []
    for i in range(n):
        if null_every and i % null_every == 3:
            out.append(None)
        else:
            out.append(" ".join(r.choice(words) for _ in range(r.randint(0, 12))))
    return out


def write(name, table, **kw):
    pq.write_table(table, os.path.join(OUT, name), **kw)


def main():
    os.makedirs(OUT, exist_ok=True)
    expected = {}

    t = texts(1, 300, null_every=17)
    t[5] = t[6] = t[7] = "repeated line"
    tab = pa.table({"id": pa.array(range(300), pa.int64()), "text": pa.array(t, pa.string()),
                    "meta": pa.array([{"url": f"u{i}", "score": i / 7} for i in range(300)])})
    write("snappy_dict.parquet", tab, row_group_size=128)
    expected["snappy_dict.parquet"] = [x for x in t if x is not None]

    t = texts(2, 500, null_every=5)
    write("zstd_v2.parquet", pa.table({"text": pa.array(t, pa.string())}), compression="zstd",
          use_dictionary=False, data_page_version="2.0", data_page_size=512)
    expected["zstd_v2.parquet"] = [x for x in t if x is not None]

    t = [f"line {i} " + "x" * (i % 50) for i in range(1000)] + texts(3, 200, null_every=9)
    write("gzip_fallback.parquet", pa.table({"text": pa.array(t, pa.string())}),
          compression="gzip", dictionary_pagesize_limit=2048, data_page_size=1024)
    expected["gzip_fallback.parquet"] = [x for x in t if x is not None]

    t = ["", "caf\u00e9 \u2615", "x" * 20000, "\u0645\u0631\u062d\u0628\u0627"] + texts(4, 50)
    schema = pa.schema([pa.field("text", pa.large_string(), nullable=False)])
    write("plain_required.parquet", pa.table({"text": pa.array(t, pa.large_string())},
                                             schema=schema),
          compression="none", use_dictionary=False)
    expected["plain_required.parquet"] = t

    r = random.Random(5)
    convs = []
    for i in range(40):
        msgs = [{"role": "system", "content": "You add numbers."}] if i % 3 == 0 else []
        for _ in range(1 + i % 3):
            a, b = r.randint(0, 99), r.randint(0, 99)
            msgs += [{"role": "user", "content": f"What is {a} plus {b}?"},
                     {"role": "assistant", "content": f"{a} plus {b} is {a + b}. caf\u00e9"}]
        convs.append(msgs)
    chat = pa.table({"prompt_id": [f"p{i}" for i in range(len(convs))],
                     "messages": pa.array(convs)})
    write("chat.parquet", chat, row_group_size=16)
    write("chat_item.parquet", chat, compression="zstd", data_page_version="2.0",
          use_compliant_nested_type=False)
    # The same conversations as ShareGPT writes them: "conversations" of {from, value}, the
    # roles "human" and "gpt".
    names = {"user": "human", "assistant": "gpt", "system": "system"}
    sharegpt = [[{"from": names[m["role"]], "value": m["content"]} for m in c] for c in convs]
    write("chat_sharegpt.parquet", pa.table({"id": list(range(len(convs))),
                                             "conversations": pa.array(sharegpt)}),
          row_group_size=16)
    with open(os.path.join(OUT, "chat.jsonl"), "w", encoding="utf-8") as f:
        for c in convs:
            f.write(json.dumps({"messages": c}, ensure_ascii=False) + "\n")
    alpaca = [{"instruction": f"Add {a} and {b}.", "input": "" if a % 2 else f"Show {a}+{b}",
               "output": str(a + b)} for a, b in ((r.randint(0, 99), r.randint(0, 99))
                                                  for _ in range(30))]
    write("alpaca.parquet", pa.Table.from_pylist(alpaca), row_group_size=10)
    prompts = [{"prompt": f"Name a number near {i}.", "completion": f"{i + 1}, caf\u00e9"}
               for i in range(30)]
    write("prompts.parquet", pa.Table.from_pylist(prompts), compression="zstd")
    for name, rows in (("alpaca.jsonl", alpaca), ("prompts.jsonl", prompts)):
        with open(os.path.join(OUT, name), "w", encoding="utf-8") as f:
            for row in rows:
                f.write(json.dumps(row, ensure_ascii=False) + "\n")
    reasoning = []
    for i in range(24):
        a, b = r.randint(0, 99), r.randint(0, 99)
        msg = {"role": "assistant", "content": f"{a + b}", "reasoning_content": None,
               "thinking": None}
        if i % 3 == 0:
            msg["reasoning_content"] = f"{a} and {b} make {a + b}"
        elif i % 3 == 1:
            msg["thinking"] = f"add {a} to {b}"
        reasoning.append([{"role": "user", "content": f"{a}+{b}?", "reasoning_content": None,
                           "thinking": None}, msg])
    write("chat_reasoning.parquet", pa.table({"messages": pa.array(reasoning)}))
    with open(os.path.join(OUT, "chat_reasoning.jsonl"), "w", encoding="utf-8") as f:
        for c in reasoning:
            f.write(json.dumps({"messages": c}, ensure_ascii=False) + "\n")
    extra = [[{"role": "user", "content": "hi", "tool_calls": "[]"}]]
    write("chat_extra.parquet", pa.table({"messages": pa.array(extra)}))
    # Tool calls in OpenAI's shape (type, id, function: {name, arguments as JSON text}) and
    # bare ({name, arguments}); messages without calls have tool_calls null (or an empty list).
    for name, bare in (("chat_tool_calls", False), ("chat_tool_calls_bare", True)):
        convs = []
        for i in range(20):
            city = ["Oslo", "Z\u00fcrich", "Rome", "S\u00e3o Paulo"][i % 4]
            calls = [{"name": "get_weather", "arguments": json.dumps({"city": city, "days": i})}]
            if i % 3 == 0:
                calls.append({"name": "search", "arguments": json.dumps({"q": f"{city} news"})})
            if not bare:
                calls = [{"id": f"call_{i}_{k}", "type": "function", "function": c}
                         for k, c in enumerate(calls)]
            convs.append([
                {"role": "user", "content": f"Weather in {city}?", "tool_calls": None},
                {"role": "assistant", "content": "" if i % 2 else "Checking.",
                 "tool_calls": calls},
                {"role": "tool", "content": f"{i} degrees", "tool_calls": None},
                {"role": "assistant", "content": f"It is {i} degrees in {city}.",
                 "tool_calls": [] if i % 5 == 0 else None}])
        write(name + ".parquet", pa.table({"messages": pa.array(convs)}), row_group_size=8,
              data_page_version="2.0" if bare else "1.0")
        with open(os.path.join(OUT, name + ".jsonl"), "w", encoding="utf-8") as f:
            for c in convs:
                f.write(json.dumps({"messages": c}, ensure_ascii=False) + "\n")
    # More rows than a render batch (1,024): chat data renders them in parallel, kept in order.
    many = [[{"role": "user", "content": f"Say {i}."}, {"role": "assistant", "content": str(i)}]
            for i in range(3000)]
    write("chat_many.parquet", pa.table({"messages": pa.array(many)}), row_group_size=700)
    # Rows 1500 and 1600 bad: a null user content (which the first Qwen3 template cannot
    # render) and a null role (refused as the row is read); row 1500 is the one reported.
    many[1499][0]["content"] = None
    many[1599][0]["role"] = None
    write("chat_many_bad.parquet", pa.table({"messages": pa.array(many)}), row_group_size=700)
    tools = [{"type": "function", "function": {"name": "f", "description": "d"}}]
    write("chat_tools.parquet", pa.table({
        "messages": pa.array([[{"role": "user", "content": "hi"},
                               {"role": "assistant", "content": "ho"}]]),
        "tools": pa.array([tools])}))

    t = [None if i % 13 == 5 else f"https://example.com/page/{i // 7}/{i}" + " caf\u00e9" * (i % 3)
         for i in range(400)]
    write("delta_prefix.parquet", pa.table({"text": pa.array(t, pa.string())}),
          use_dictionary=False, column_encoding={"text": "DELTA_BYTE_ARRAY"}, data_page_size=1024)
    expected["delta_prefix.parquet"] = [x for x in t if x is not None]
    write("many.parquet", pa.table({"text": [f"row {i}" for i in range(6000)]}),
          data_page_size=1024, row_group_size=6000)

    z = pq.read_table(os.path.join(OUT, "zstd_v2.parquet")).column("text")
    write("content.parquet", pa.table({"text": pa.array(["other"] * len(z)), "content": z}))

    t = texts(6, 300, null_every=7)
    write("delta_length.parquet", pa.table({"text": pa.array(t, pa.string())}),
          use_dictionary=False, column_encoding={"text": "DELTA_LENGTH_BYTE_ARRAY"},
          compression="zstd", data_page_version="2.0", data_page_size=2048)
    expected["delta_length.parquet"] = [x for x in t if x is not None]

    tiny = pa.table({"text": pa.array(["ab", "cd", None, "ab"], pa.string())})
    write("tiny_gzip.parquet", tiny, compression="gzip")
    write("tiny_none_v2.parquet", tiny, compression="none", data_page_version="2.0")
    expected["tiny_gzip.parquet"] = expected["tiny_none_v2.parquet"] = ["ab", "cd", "ab"]
    # No rows: pyarrow writes one empty row group whose chunk offsets are 0.
    write("empty.parquet", pa.table({"text": pa.array([], pa.string())}))
    expected["empty.parquet"] = []

    small = pa.table({"text": pa.array(["a", "b"], pa.string())})
    z = pq.read_table(os.path.join(OUT, "zstd_v2.parquet"))
    write("lz4.parquet", z, compression="lz4")
    write("brotli.parquet", z, compression="brotli")
    expected["lz4.parquet"] = expected["brotli.parquet"] = expected["zstd_v2.parquet"]
    # LZO, which pyarrow does not write: the footer's codec field (ColumnMetaData field 4, after
    # field 3: header byte 0x15, then zigzag 7 = 0x0e for LZ4_RAW) set to zigzag 3 = 0x06.
    data = bytearray(open(os.path.join(OUT, "lz4.parquet"), "rb").read())
    meta_len = int.from_bytes(data[-8:-4], "little")
    start = len(data) - 8 - meta_len
    at = bytes(data[start:-8]).find(b"\x15\x0e")
    assert at >= 0 and bytes(data[start:-8]).count(b"\x15\x0e") == 1
    data[start + at + 1] = 0x06
    open(os.path.join(OUT, "lzo.parquet"), "wb").write(data)
    write("int_text.parquet", pa.table({"text": pa.array([1, 2], pa.int64())}))
    write("no_text.parquet", pa.table({"content": pa.array(["a"]), "id": pa.array([1])}))
    write("nested_text.parquet", pa.table({"text": pa.array([["a", "b"], ["c"]])}))

    with open(os.path.join(OUT, "expected.json"), "w", encoding="utf-8") as f:
        json.dump(expected, f, ensure_ascii=False)
        f.write("\n")
    for n in sorted(os.listdir(OUT)):
        print(n, os.path.getsize(os.path.join(OUT, n)))


if __name__ == "__main__":
    main()
