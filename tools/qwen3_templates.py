#!/usr/bin/env python3
"""The later Qwen3 chat templates, derived from the first one by the edits Qwen made to it.

The Qwen3 models of April 2025 ship one template (../shared/tokenizers/qwen3). Qwen changed it
twice since:
  * "string content": every message's content is read through `content`, set to the message's
    content when that is a string and to '' otherwise (null content, as OpenAI's tool-call
    messages carry, renders as nothing instead of failing); reasoning_content is taken when it
    is a string. Later revisions of the hybrid-thinking models' tokenizer_config.json carry
    it (as projects quoting Qwen3-8B's file show).
  * the 2507 releases keep that body and change only the generation prompt: Instruct-2507
    opens a plain assistant turn and Thinking-2507 one that starts with "<think>\\n"; neither
    reads enable_thinking.
This module rebuilds those texts byte for byte from the original (each edit must match exactly
once) so the fixtures can be made without network access; qtitan recognises a template by the
FNV-1a hash of its exact text (src/text/chat_template.c), printed by `main`. The texts were
checked by eye against copies of the published files (the 2507 ones as tokenizer_config.json
and GGUF metadata quote them); should a published file differ by a byte, qtitan names its hash
in a sentence instead of rendering it wrongly.

Usage: python3 tools/qwen3_templates.py [SHARED_DIR]
  writes tests/fixtures/chat/templates/<name>.jinja and prints each template's hash.
"""
import json
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OUT = os.path.join(ROOT, "tests", "fixtures", "chat", "templates")

STRING_CONTENT_EDITS = [
    ('message.role == "user" and not(',
     'message.role == "user" and message.content is string and not('),
    ("{%- for message in messages %}\n    {%- if (message.role",
     "{%- for message in messages %}\n"
     "    {%- if message.content is string %}\n"
     "        {%- set content = message.content %}\n"
     "    {%- else %}\n"
     "        {%- set content = '' %}\n"
     "    {%- endif %}\n"
     "    {%- if (message.role"),
    ("'\\n' + message.content + '<|im_end|>' + '\\n' }}",
     "'\\n' + content + '<|im_end|>' + '\\n' }}"),
    ('    {%- elif message.role == "assistant" %}\n'
     "        {%- set content = message.content %}\n"
     "        {%- set reasoning_content = '' %}\n"
     "        {%- if message.reasoning_content is defined and message.reasoning_content is not "
     "none %}",
     '    {%- elif message.role == "assistant" %}\n'
     "        {%- set reasoning_content = '' %}\n"
     "        {%- if message.reasoning_content is string %}"),
    ("            {%- if '</think>' in message.content %}\n"
     "                {%- set content = message.content.split('</think>')[-1].lstrip('\\n') %}\n"
     "                {%- set reasoning_content = message.content.split('</think>')[0]"
     ".rstrip('\\n').split('<think>')[-1].lstrip('\\n') %}",
     "            {%- if '</think>' in content %}\n"
     "                {%- set reasoning_content = content.split('</think>')[0].rstrip('\\n')"
     ".split('<think>')[-1].lstrip('\\n') %}\n"
     "                {%- set content = content.split('</think>')[-1].lstrip('\\n') %}"),
    ("        {{- message.content }}\n        {{- '\\n</tool_response>' }}",
     "        {{- content }}\n        {{- '\\n</tool_response>' }}"),
]

HYBRID_PROMPT = ("{%- if add_generation_prompt %}\n"
                 "    {{- '<|im_start|>assistant\\n' }}\n"
                 "    {%- if enable_thinking is defined and enable_thinking is false %}\n"
                 "        {{- '<think>\\n\\n</think>\\n\\n' }}\n"
                 "    {%- endif %}\n"
                 "{%- endif %}")
PLAIN_PROMPT = "{%- if add_generation_prompt %}\n    {{- '<|im_start|>assistant\\n' }}\n{%- endif %}"
THINK_PROMPT = ("{%- if add_generation_prompt %}\n"
                "    {{- '<|im_start|>assistant\\n<think>\\n' }}\n"
                "{%- endif %}")


def edit(text, old, new):
    assert text.count(old) == 1, f"the edit does not match exactly once: {old!r}"
    return text.replace(old, new)


def original(shared):
    with open(os.path.join(shared, "tokenizers", "qwen3", "tokenizer_config.json"),
              encoding="utf-8") as f:
        return json.load(f)["chat_template"]


def variants(shared):
    """{name: template text}: the original and the three revisions."""
    v0 = original(shared)
    v1 = v0
    for old, new in STRING_CONTENT_EDITS:
        v1 = edit(v1, old, new)
    assert v1.endswith(HYBRID_PROMPT)
    body = v1[:-len(HYBRID_PROMPT)]
    return {"qwen3": v0, "qwen3_string_content": v1,
            "qwen3_2507_instruct": body + PLAIN_PROMPT,
            "qwen3_2507_thinking": body + THINK_PROMPT}


def fnv64(data):
    h = 0xCBF29CE484222325
    for c in data:
        h = ((h ^ c) * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return h


def main():
    shared = sys.argv[1] if len(sys.argv) > 1 else os.path.join(ROOT, "..", "shared")
    os.makedirs(OUT, exist_ok=True)
    for name, text in variants(shared).items():
        data = text.encode("utf-8")
        print(f"{name}: {len(data)} bytes, hash {fnv64(data):016x}")
        if name != "qwen3":
            with open(os.path.join(OUT, name + ".jinja"), "wb") as f:
                f.write(data)


if __name__ == "__main__":
    main()
