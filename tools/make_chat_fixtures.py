#!/usr/bin/env python3
"""Chat rendering fixtures: transformers' apply_chat_template on the real Qwen3 tokenizer.

Writes tests/fixtures/chat/qwen3_chat.jsonl, one conversation a line:
  {"name", "messages", "tools" (when the case offers tools), "add_generation_prompt",
   "enable_thinking",
   "ids": [...] (apply_chat_template's input_ids),
   "assistant": "0011..." (one flag a token: transformers' assistant_masks)}
and tests/fixtures/chat/qwen3_variants_chat.jsonl, the same for the later Qwen3 templates
(tools/qwen3_templates.py: "template" names the one), with conversations whose messages have
null or no content, which those templates render as empty and the original cannot render.

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

import qwen3_templates

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SHARED = sys.argv[1] if len(sys.argv) > 1 else os.path.join(ROOT, "..", "shared")
OUT = os.path.join(ROOT, "tests", "fixtures", "chat", "qwen3_chat.jsonl")
OUT_VARIANTS = os.path.join(ROOT, "tests", "fixtures", "chat", "qwen3_variants_chat.jsonl")


def tagged(template):
    """The template with a generation block around each assistant body and its <|im_end|>."""
    head = "{{- '<|im_start|>' + message.role + '\\n' }}{%- generation %}"
    branch = '{%- elif message.role == "assistant" %}'
    edits = [
        (branch, branch + head, 1),
        ("'<|im_start|>' + message.role + '\\n<think>\\n'", "'<think>\\n'", 1),
        ("'<|im_start|>' + message.role + '\\n' + content }}", "content }}", 2),
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


def t(text):
    return {"role": "tool", "content": text}


def call(name, arguments, wrapped=True):
    """A tool call in OpenAI's shape ({"type", "function": {...}}) or bare."""
    f = {"name": name, "arguments": arguments}
    return {"type": "function", "function": f} if wrapped else f


def a_calls(text, calls, **kw):
    m = a(text, kw.pop("reasoning", None))
    if m.get("reasoning_content") is None:
        m.pop("reasoning_content", None)
    m.update(kw)
    m["tool_calls"] = calls
    return m


WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Current weather in a city \u2014 \"quoted\"",
    "parameters": {"type": "object", "properties": {
        "city": {"type": "string", "description": "e.g. Z\u00fcrich"},
        "unit": {"type": "string", "enum": ["c", "f"]}}, "required": ["city"]}}}
SEARCH = {"type": "function", "function": {"name": "search", "parameters": {
    "type": "object", "properties": {"q": {"type": "string"}, "k": {"type": "integer",
                                                                    "default": 5}}}}}
# Arguments whose JSON text tests tojson: floats in both notations, a negative zero, a large
# integer, escapes, non-ASCII, nesting, null and booleans.
ODD_ARGS = {"city": "S\u00e3o Paulo \U0001F327", "t": 1e-05, "big": 1e16, "x": 100.0, "z": -0.0,
            "n": 12345678901234567, "r": 0.1, "esc": "tab\there \"q\" \\ \u0001 \u2028",
            "nested": {"l": [1, 2.5, [], {}], "none": None, "ok": True, "no": False}}


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
    ("tool_call_roundtrip",
     [u("Weather in Paris?"), a_calls("", [call("get_weather", {"city": "Paris"})]),
      t('{"temp": 21, "sky": "clear"}'), a("It is 21 degrees and clear.")], [WEATHER]),
    ("tools_with_system_parallel_calls",
     [s("You are a travel agent."), u("Compare Oslo and Rome."),
      a_calls("I'll look both up.", [call("get_weather", {"city": "Oslo", "unit": "c"}),
                                     call("get_weather", '{"city": "Rome"}', wrapped=False)]),
      t("Oslo: 3C"), t("Rome: 18C"), a("Rome is warmer.", reasoning="compare 3 and 18")],
     [WEATHER, SEARCH]),
    ("tool_call_after_think",
     [u("Find papers on LoRA"),
      a_calls("<think>\nsearch first\n</think>\n\nSearching.", [call("search", {"q": "LoRA"})]),
      t("3 results"), a("<think>summarise</think>Found 3.")], [SEARCH]),
    ("tool_call_odd_arguments",
     [u("x"), a_calls("", [call("get_weather", ODD_ARGS)]), t("ok"), a("done")], [WEATHER]),
    ("tool_call_function_falsy",
     [u("x"), a_calls("", [{"function": {}, "name": "search", "arguments": {"q": "a"}}]),
      t("r"), a("y")], [SEARCH]),
    ("tool_message_first", [t("stale result"), a("Noted.")]),
    ("ends_with_tool", [u("q"), a_calls("", [call("search", {"q": "q"})]), t("r1")], [SEARCH]),
    ("tools_empty_list", [u("hi"), a("hello")], []),
    ("reasoning_aliases",
     [u("Q1"), {"role": "assistant", "content": "A1", "thinking": "t1"}, u("Q2"),
      {"role": "assistant", "content": "A2", "reasoning_content": None, "reasoning": "r2"}]),
]

# (add_generation_prompt, enable_thinking) per case: a conversation ending with a user turn is
# rendered for generation both ways (once for the templates without enable_thinking: they do not
# read it, and qtitan refuses enable_thinking = false for them); others as training data.
PROMPTS = {"generation_prompt_thinking": [(True, True), (True, False)],
           "ends_with_user": [(True, False), (False, True)],
           "system_only": [(True, True)],
           "ends_with_tool": [(True, True)]}


# Messages whose content is null or missing (OpenAI's tool-call turns carry "content": null):
# the later templates render them as empty; the original cannot (transformers raises).
NULL_CASES = [
    ("null_content_tool_call",
     [u("Weather in Oslo?"), a_calls(None, [call("get_weather", {"city": "Oslo"})]),
      t('{"temp": 3}'), a("3 degrees.")], [WEATHER]),
    ("missing_content_tool_call",
     [u("Find LoRA"), {"role": "assistant", "tool_calls": [call("search", {"q": "LoRA"})]},
      t(None), a("Nothing found.")], [SEARCH]),
    ("null_user_is_not_a_query", [u("first"), a("one"), u(None), a("two", reasoning="r")]),
    ("null_system_later", [u("hi"), a("x"), s(None), u("y"), a(None)]),
]

# Cases rendered with the 2507 templates beside those that end with a generation prompt.
BOTH_2507 = {"single_turn", "tool_call_roundtrip", "null_content_tool_call"}


def renderings(name, switch):
    return [p for p in PROMPTS.get(name, [(False, True)]) if switch or p[1]]


def render(tok, template, name, messages, tools, gen, think):
    """One fixture line: the ids apply_chat_template gives and its assistant mask."""
    masked = tagged(template)
    kw = dict(add_generation_prompt=gen, enable_thinking=think, tools=tools,
              chat_template=template)
    text = tok.apply_chat_template(messages, tokenize=False, **kw)
    kw["chat_template"] = masked
    assert tok.apply_chat_template(messages, tokenize=False, **kw) == text, name
    enc = tok.apply_chat_template(messages, tokenize=True, return_dict=True,
                                  return_assistant_tokens_mask=True, **kw)
    ids = list(enc["input_ids"])
    assert ids == tok(text, add_special_tokens=False)["input_ids"], name
    mask = "".join(str(int(b)) for b in enc["assistant_masks"])
    assert len(mask) == len(ids)
    line = {"name": name, "messages": messages}
    if tools is not None:
        line["tools"] = tools
    line.update(add_generation_prompt=gen, enable_thinking=think, ids=ids, assistant=mask)
    return line


def main():
    tok = AutoTokenizer.from_pretrained(os.path.join(SHARED, "tokenizers", "qwen3"))
    templates = qwen3_templates.variants(SHARED)
    assert templates["qwen3"] == tok.chat_template
    for name, messages, *tools in NULL_CASES:
        try:
            tok.apply_chat_template(messages, tokenize=False, tools=tools[0] if tools else None)
        except Exception:
            continue
        raise SystemExit(f"{name}: the original template rendered null content")
    os.makedirs(os.path.dirname(OUT), exist_ok=True)
    for out, names, cases in ((OUT, ["qwen3"], CASES),
                              (OUT_VARIANTS, [n for n in templates if n != "qwen3"],
                               CASES + NULL_CASES)):
        n = 0
        with open(out, "w", encoding="utf-8") as f:
            for tname in names:
                switch = "enable_thinking" in templates[tname]
                for name, messages, *tools in cases:
                    # The 2507 templates differ from the string-content one in the generation
                    # prompt only: their fixtures are the cases that end with one, and BOTH_2507.
                    if "2507" in tname and name not in PROMPTS and name not in BOTH_2507:
                        continue
                    tools = tools[0] if tools else None
                    for gen, think in renderings(name, switch):
                        line = render(tok, templates[tname], name, messages, tools, gen, think)
                        if out == OUT_VARIANTS:
                            line = {"template": tname, **line}
                        f.write(json.dumps(line, ensure_ascii=False) + "\n")
                        n += 1
        print(f"wrote {n} conversations to {out}")


if __name__ == "__main__":
    main()
