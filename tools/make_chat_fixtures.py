#!/usr/bin/env python3
"""Chat rendering fixtures: transformers' apply_chat_template on the real Qwen3 tokenizer.

Writes tests/fixtures/chat/qwen3_chat.jsonl, one conversation a line:
  {"name", "messages", "add_generation_prompt", "enable_thinking",
   "ids": [...] (apply_chat_template's input_ids),
   "assistant": "0011..." (one flag a token: transformers' assistant_masks)}

Qwen3's template has no {% generation %} block, so transformers cannot mark assistant tokens
with it. The mask comes from the same template with one generation block put around each
assistant turn's body and its <|im_end|> (the header "<|im_start|>assistant\\n" and the "\\n"
after <|im_end|> stay outside), and this script checks that the tagged template renders every
conversation to exactly the text of the original.

Usage: python3 tools/make_chat_fixtures.py [SHARED_DIR]   (default ../shared)
"""
import json
import os
import sys

from transformers import AutoTokenizer

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SHARED = sys.argv[1] if len(sys.argv) > 1 else os.path.join(ROOT, "..", "shared")
OUT = os.path.join(ROOT, "tests", "fixtures", "chat", "qwen3_chat.jsonl")


def tagged(template):
    """The template with a generation block around each assistant body and its <|im_end|>."""
    head = "{{- '<|im_start|>' + message.role + '\\n' }}{%- generation %}"
    edits = [
        ("{%- set content = message.content %}",
         "{%- set content = message.content %}" + head, 1),
        ("'<|im_start|>' + message.role + '\\n<think>\\n'", "'<think>\\n'", 1),
        ("'<|im_start|>' + message.role + '\\n' + content", "content", 2),
        ("{%- endif %}\n        {{- '<|im_end|>\\n' }}",
         "{%- endif %}\n        {{- '<|im_end|>' }}{%- endgeneration %}{{- '\\n' }}", 1),
    ]
    for old, new, count in edits:
        assert template.count(old) == count, old
        template = template.replace(old, new)
    return template


def u(text):
    return {"role": "user", "content": text}


def a(text, reasoning=None):
    m = {"role": "assistant", "content": text}
    if reasoning is not None:
        m["reasoning_content"] = reasoning
    return m


def s(text):
    return {"role": "system", "content": text}


CASES = [
    ("single_turn", [u("Hello"), a("Hi there!")]),
    ("system_multi_turn",
     [s("You are a helpful assistant."), u("What is 2+2?"), a("4."), u("And 3+3?"), a("6.")]),
    ("think_in_history",
     [u("Q1"), a("<think>\nfirst thoughts\n</think>\n\nA1"), u("Q2"),
      a("<think>\nsecond thoughts\n</think>\n\nA2")]),
    ("reasoning_content_field",
     [u("Q1"), a("A1", reasoning="r1"), u("Q2"), a("A2", reasoning="\nr2\n")]),
    ("empty_reasoning_field", [u("Q"), a("A", reasoning="")]),
    ("think_without_open_tag", [u("Q"), a("just thinking</think>\n\nthe answer")]),
    ("two_closing_tags", [u("Q"), a("<think>x</think>mid</think>\nend")]),
    ("nested_open_tags", [u("Q"), a("<think>a<think>b\n\n</think>c")]),
    ("generation_prompt_thinking", [s("Be brief."), u("Hi"), a("Hello."), u("Bye")]),
    ("leading_newlines", [u("\n\nspaced"), a("\n\n  indented answer\n"), u("x"), a(" \n y")]),
    ("earlier_turn_leading_ws", [u("a"), a("\n \nfirst"), u("b"), a("second")]),
    ("system_not_first", [u("hi"), a("hello"), s("new rules"), u("ok?"), a("ok")]),
    ("system_only", [s("You are a cat.")]),
    ("unicode", [u("caf\u00e9 cafe\u0301 \u4f60\u597d \U0001F600"),
                 a("\u00fcber \u0645\u0631\u062d\u0628\u0627 \U0001F44D\u200d")]),
    ("special_text_inside", [u("say <|im_end|> and <think>"), a("ok <|im_start|>user\nfake")]),
    ("tool_response_turns",
     [u("weather?"), a("<think>call tool</think>\n\ncalling"),
      u("<tool_response>\nsunny\n</tool_response>"), a("<think>got it</think>It is sunny.")]),
    ("empty_assistant", [u("say nothing"), a("")]),
    ("assistant_first", [a("I speak first"), u("ok")]),
    ("ends_with_user", [s("sys"), u("one"), a("two"), u("three")]),
    ("long_turns", [u("word " * 60), a("answer " * 80 + "\n\n```python\nprint(1)\n```")]),
]

# (add_generation_prompt, enable_thinking) per case: a conversation ending with a user turn is
# rendered for generation both ways; others as training data.
PROMPTS = {"generation_prompt_thinking": [(True, True), (True, False)],
           "ends_with_user": [(True, False), (False, True)],
           "system_only": [(True, True)]}


def main():
    tok = AutoTokenizer.from_pretrained(os.path.join(SHARED, "tokenizers", "qwen3"))
    original = tok.chat_template
    masked = tagged(original)
    os.makedirs(os.path.dirname(OUT), exist_ok=True)
    n = 0
    with open(OUT, "w", encoding="utf-8") as f:
        for name, messages in CASES:
            for gen, think in PROMPTS.get(name, [(False, True)]):
                kw = dict(add_generation_prompt=gen, enable_thinking=think)
                text = tok.apply_chat_template(messages, tokenize=False, **kw)
                assert tok.apply_chat_template(messages, tokenize=False, chat_template=masked,
                                               **kw) == text, name
                enc = tok.apply_chat_template(messages, tokenize=True, return_dict=True,
                                              return_assistant_tokens_mask=True,
                                              chat_template=masked, **kw)
                ids = list(enc["input_ids"])
                assert ids == tok(text, add_special_tokens=False)["input_ids"], name
                mask = "".join(str(int(b)) for b in enc["assistant_masks"])
                assert len(mask) == len(ids)
                f.write(json.dumps({"name": name, "messages": messages,
                                    "add_generation_prompt": gen, "enable_thinking": think,
                                    "ids": ids, "assistant": mask}, ensure_ascii=False) + "\n")
                n += 1
    print(f"wrote {n} conversations to {OUT}")


if __name__ == "__main__":
    main()
