#!/usr/bin/env python3
"""Builds small random Qwen3 / Qwen3-MoE checkpoints (fp32, eager attention) and the greedy
continuations transformers' generate(do_sample=False) produces for them, as references for
tests/test_generate.c.

For each case writes tests/fixtures/generate/<name>/:
  config.json, model.safetensors   save_pretrained (no generation_config.json, no EOS id: every
                                   prompt runs the full NEW tokens)
  prompts.txt                      one prompt of token ids per line, of different lengths
  expected_ids.txt                 the NEW generated ids of each prompt, one line each
  expected_logprobs.txt            log_softmax of the raw logits at each chosen id (%.9g)
  generation_config.json           (a case with `gen`) the generation settings it was made with

Each prompt is generated alone (no padding), so the reference does not depend on how
transformers pads a batch; the C test generates all prompts of a case in one batch.

Near ties: greedy decoding is only well defined where the best logit leads the second by more
than float noise. A case's seed is increased until, at every step of every prompt, the margin
exceeds MIN_MARGIN, and (MoE) every token's k-th router probability exceeds the (k+1)-th by
MIN_GAP; the tool asserts both and prints them.

And tests/fixtures/generate/cli_tiny/: a one-layer model over the vocabulary of
tests/fixtures/tokenizer/tiny_gpt2 (tokenizer.json copied in, EOS id 0 = <|endoftext|>), for
tests/e2e_generate.sh: expected.json holds the prompt text, its ids (tokenizers' encode) and the
greedy continuation of at most CLI_NEW tokens (ending at EOS if transformers' generate stops
there).

cli_tiny_fp8/: cli_tiny with its projection weights fp8 block-quantized (8 x 8 blocks, bf16
scales; fixture_util.quantize_fp8, as Qwen's -FP8 releases store them) and expected.json from
the model transformers loads from it (dequantized on this CPU-only machine), for
tests/e2e_generate.sh and tests/e2e_finetune.sh.

cli_tiny/docs.jsonl and expected_eval.json: the reference for `qtitan eval --dataset`. The
documents' ids (tokenizers), each followed by EOS, form one stream in file order; rows of
EVAL_SEQ tokens are cut from it, and inside a row positions restart after every EOS and
segments do not see each other (training's document mask). Each segment runs through the
model alone; every stream token after the first (or the first EVAL_MAX of them) is a target.
Recorded: mean loss and bits per byte (summed loss / ln 2 / UTF-8 bytes of the predicted
text), for the whole file and for the first EVAL_MAX targets. "strided" holds the same for
`--stride EVAL_STRIDE`: Hugging Face's sliding-window perplexity loop (the perplexity guide of
the transformers docs) over the stream as one sequence: windows of EVAL_SEQ tokens every
EVAL_STRIDE, labels -100 but for the last end - prev_end tokens of each, the model's own
shift; the loss is the exact mean over the predicted tokens (the guide weights each window's
mean by its label count less one, which is not quite that).

chat_ids.json: the ids transformers' apply_chat_template(..., add_generation_prompt=True)
gives for the conversations `qtitan generate --chat` builds (an optional system turn, then the
prompt as a user turn; enable_thinking true and false; two offering the tools of
chat_tools.json, as generate --tools does), with the Qwen3 tokenizer of
../shared/tokenizers/qwen3 (skipped when absent), for tests/e2e_generate_chat.sh.

chat_messages.jsonl: conversations for `generate --messages` (one a line, as chat data holds
them) with the ids apply_chat_template(..., add_generation_prompt=True) gives for each under
Qwen3's string-content template (tests/fixtures/chat/templates).

warpers.json: rows of random logits and the ids transformers' sampling warpers keep, with
typical_p, epsilon_cutoff and eta_cutoff among them (WARPER_CASES), for test_generate.

gen_configs.json: generation_config.json contents and the sampling transformers' generate()
resolves from each for a model (do_sample, temperature, top_k, top_p, min_p, max_new_tokens,
eos_token_id, num_beams, length_penalty, early_stopping), for test_generate.

beams.json: transformers' beam search (generate(num_beams=k, do_sample=False)) on the models of
the cases above, with length penalties, early_stopping settings, EOS ids and processors
(BEAM_CASES; build_beams says what each entry holds), for tests/test_beam.c; and
cli_tiny/expected_beams.jsonl, the beams `qtitan generate --num-beams` gives on cli_tiny, for
tests/e2e_generate.sh.

Usage: python tools/make_generate_fixtures.py [OUT_DIR]
"""
import json
import math
import shutil
import os

import torch
from fixture_util import (eager_model, load_dequantized, out_root, quantize_fp8, save_model,
                          scramble, seeded, write_ids)
from transformers import Qwen3Config, Qwen3ForCausalLM, Qwen3MoeConfig, Qwen3MoeForCausalLM

NEW = 64
MIN_MARGIN = 1e-3
MIN_GAP = 1e-4

BASE = dict(vocab_size=96, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
            head_dim=8, intermediate_size=48, rope_theta=10000.0, max_position_embeddings=256,
            rms_norm_eps=1e-6, eos_token_id=None, bos_token_id=None, pad_token_id=None)

CASES = [
    dict(name="dense_tied_gqa", seed=101, moe=False, lens=[5, 11, 17],
         cfg=dict(num_key_value_heads=2, tie_word_embeddings=True)),
    dict(name="dense_untied_mha", seed=201, moe=False, lens=[3, 9, 14, 20],
         cfg=dict(num_key_value_heads=4, tie_word_embeddings=False)),
    dict(name="moe", seed=301, moe=True, lens=[4, 13],
         cfg=dict(num_key_value_heads=2, tie_word_embeddings=False, moe_intermediate_size=16,
                  num_experts=8, num_experts_per_tok=2, norm_topk_prob=True)),
    # YaRN RoPE over an original context of 16 (factor 4): the decode path's cached keys and
    # new queries are rotated by the blended frequencies and scaled cos / sin.
    # transformers' repetition_penalty (a logits processor, so greedy takes it), given by the
    # case's generation_config.json, which the C test reads.
    dict(name="dense_reppen", seed=501, moe=False, lens=[4, 15],
         gen=dict(do_sample=False, repetition_penalty=1.3),
         cfg=dict(num_key_value_heads=2, tie_word_embeddings=False)),
    # transformers' no_repeat_ngram_size (the prompt's n-grams count too), with sampling left
    # greedy, likewise from the case's generation_config.json.
    dict(name="dense_norepeat", seed=601, moe=False, lens=[3, 12],
         gen=dict(do_sample=False, no_repeat_ngram_size=2),
         cfg=dict(num_key_value_heads=4, tie_word_embeddings=True)),
    dict(name="dense_yarn", seed=401, moe=False, lens=[6, 19],
         cfg=dict(num_key_value_heads=2, tie_word_embeddings=True,
                  rope_scaling=dict(rope_type="yarn", factor=4.0,
                                    original_max_position_embeddings=16))),
]


def router_gap(model, ids, k):
    out = model(input_ids=ids, output_router_logits=True)
    gap = float("inf")
    for lg in out.router_logits:
        top = torch.topk(torch.softmax(lg.float(), dim=-1), k + 1, dim=-1).values
        gap = min(gap, float((top[:, k - 1] - top[:, k]).min()))
    return gap


def run(case, seed):
    gen = seeded(seed)
    classes = (Qwen3MoeConfig, Qwen3MoeForCausalLM) if case["moe"] else (Qwen3Config,
                                                                          Qwen3ForCausalLM)
    cfg, model = eager_model(*classes, **dict(BASE, **case["cfg"]))
    scramble(model, gen)
    model.eval()
    prompts = [torch.randint(0, cfg.vocab_size, (n,), generator=gen) for n in case["lens"]]
    results, margin, gap = [], float("inf"), float("inf")
    with torch.no_grad():
        for p in prompts:
            # An explicit mask: without it generate takes every pad_token_id in a prompt for
            # padding.
            out = model.generate(p[None], attention_mask=torch.ones_like(p[None]),
                                 do_sample=False, max_new_tokens=NEW,
                                 min_new_tokens=NEW, output_logits=True, output_scores=True,
                                 return_dict_in_generate=True, eos_token_id=None,
                                 pad_token_id=0,
                                 **{k: v for k, v in case.get("gen", {}).items()
                                    if k != "do_sample"})
            new = out.sequences[0, p.shape[0]:]
            assert new.shape[0] == NEW
            lps = []
            # The margin is the processed scores' (what greedy takes the argmax of); the
            # log-probs are the raw logits', as qtitan reports them.
            for t, (lg, sc) in enumerate(zip(out.logits, out.scores)):
                lg, sc = lg[0].double(), sc[0].double()
                top2 = torch.topk(sc, 2).values
                margin = min(margin, float(top2[0] - top2[1]))
                assert int(sc.argmax()) == int(new[t])
                lps.append(float(torch.log_softmax(lg, dim=-1)[new[t]]))
            if case["moe"]:
                gap = min(gap, router_gap(model, out.sequences[:, :-1], cfg.num_experts_per_tok))
            results.append((p, new, lps))
    return model, results, margin, gap


def write_case(d, gen, results):
    """A case's generation_config.json (when gen), prompts, expected ids and log-probs."""
    if gen:
        with open(os.path.join(d, "generation_config.json"), "w") as f:
            json.dump(gen, f)
            f.write("\n")
    write_ids(os.path.join(d, "prompts.txt"), [p for p, _, _ in results])
    write_ids(os.path.join(d, "expected_ids.txt"), [n for _, n, _ in results])
    with open(os.path.join(d, "expected_logprobs.txt"), "w") as f:
        f.writelines(" ".join("%.9g" % x for x in l) + "\n" for _, _, l in results)


def build(case, out_root):
    seed = case["seed"]
    while True:
        model, results, margin, gap = run(case, seed)
        if margin > MIN_MARGIN and gap > MIN_GAP:
            break
        seed += 1000
    d = os.path.join(out_root, case["name"])
    save_model(model, d)
    write_case(d, case.get("gen"), results)
    print(f"{case['name']}: seed {seed}, min greedy margin {margin:.3g}, min router gap {gap:.3g}")


CLI_NEW = 24
CLI_PROMPT = "The quick brown fox jumps over the lazy dog"


def greedy_cli(model, ids, logprobs=None):
    """transformers' greedy continuation of CLI_NEW tokens for prompt ids, and the smallest
    lead of the chosen logit over the second; logprobs (a list) gets each chosen id's
    log_softmax."""
    p = torch.tensor([ids])
    with torch.no_grad():
        out = model.generate(p, attention_mask=torch.ones_like(p), do_sample=False,
                             max_new_tokens=CLI_NEW, output_logits=True,
                             return_dict_in_generate=True, pad_token_id=0)
    margin = min(float(torch.topk(l[0], 2).values[0] - torch.topk(l[0], 2).values[1])
                 for l in out.logits)
    new = [int(x) for x in out.sequences[0, len(ids):]]
    if logprobs is not None:
        logprobs.extend(float(torch.log_softmax(l[0].double(), -1)[t])
                        for l, t in zip(out.logits, new))
    return new, margin


def write_cli_expected(d, ids, new, **more):
    with open(os.path.join(d, "expected.json"), "w") as f:
        json.dump(dict(prompt=CLI_PROMPT, prompt_ids=ids, ids=new, **more), f)
        f.write("\n")


def build_cli_fp8(d, out_root):
    """cli_tiny_fp8 from the cli_tiny directory d."""
    q = os.path.join(out_root, "cli_tiny_fp8")
    shutil.rmtree(q, ignore_errors=True)
    os.makedirs(q)
    for f in ("config.json", "model.safetensors", "tokenizer.json"):
        shutil.copy(os.path.join(d, f), q)
    quantize_fp8(q, block=[8, 8], scale_dtype=torch.bfloat16)
    model = load_dequantized(Qwen3ForCausalLM, q)
    model.eval()
    with open(os.path.join(d, "expected.json")) as f:
        ids = json.load(f)["prompt_ids"]
    logprobs = []
    new, margin = greedy_cli(model, ids, logprobs)
    assert margin > MIN_MARGIN, margin
    write_cli_expected(q, ids, new, logprobs=logprobs)
    print(f"cli_tiny_fp8: {len(new)} new tokens, min greedy margin {margin:.3g}")


def build_cli(root, out_root):
    from transformers import PreTrainedTokenizerFast
    tok_path = os.path.join(root, "tests", "fixtures", "tokenizer", "tiny_gpt2", "tokenizer.json")
    tok = PreTrainedTokenizerFast(tokenizer_file=tok_path)
    seed = 7
    while True:
        gen = seeded(seed)
        cfg, model = eager_model(Qwen3Config, Qwen3ForCausalLM,
                                 **dict(BASE, vocab_size=608, hidden_size=16, num_hidden_layers=1,
                                        num_attention_heads=2, num_key_value_heads=1,
                                        intermediate_size=24, tie_word_embeddings=True,
                                        eos_token_id=0))
        scramble(model, gen)
        model.eval()
        ids = tok(CLI_PROMPT, add_special_tokens=False)["input_ids"]
        new, margin = greedy_cli(model, ids)
        if margin > MIN_MARGIN:
            break
        seed += 1000
    d = os.path.join(out_root, "cli_tiny")
    save_model(model, d)
    shutil.copy(tok_path, os.path.join(d, "tokenizer.json"))
    write_cli_expected(d, ids, new)
    print(f"cli_tiny: seed {seed}, {len(new)} new tokens, min greedy margin {margin:.3g}")
    build_eval(model, tok, d)
    build_cli_fp8(d, out_root)
    build_cli_beams(model, tok, d, ids)


def build_cli_beams(model, tok, d, ids):
    """cli_tiny/expected_beams.jsonl: transformers' beam search (CLI_BEAMS) from the CLI prompt,
    one line per returned beam: its new ids (an ending EOS kept), sequences_score and text."""
    p = torch.tensor(ids)
    with torch.no_grad():
        seqs, scores = beam_generate(model, p, CLI_BEAMS, [0])
    with open(os.path.join(d, "expected_beams.jsonl"), "w") as f:
        for sq, sc in zip(seqs, scores):
            text = tok.decode(sq, skip_special_tokens=True)
            f.write(json.dumps(dict(ids=sq, score=sc, text=text)) + "\n")
    print(f"cli_tiny beams: lengths {[len(x) for x in seqs]}")

EVAL_SEQ = 16
EVAL_MAX = 40
EVAL_DOCS = ["The quick brown fox jumps over the lazy dog.",
             "A caf\u00e9 in Paris serves coffee \u2615 and tea.",
             "Short.",
             "Numbers: 12 plus 30 is 42, and 7 times 6 is 42 too; the answer is 42."]


def eval_reference(model, tok, n_targets):
    docs = [tok(t, add_special_tokens=False)["input_ids"] for t in EVAL_DOCS]
    stream = []
    for d in docs:
        stream += d + [0]  # EOS = <|endoftext|>, id 0 in tiny_gpt2
    n_targets = min(n_targets, len(stream) - 1)
    total, count = 0.0, 0
    for start in range(0, n_targets, EVAL_SEQ):
        row = stream[start:start + EVAL_SEQ]
        seg = 0
        while seg < len(row):
            end = seg
            while end < len(row) and row[end] != 0:
                end += 1
            end = min(end + 1, len(row))  # the EOS closes its segment
            with torch.no_grad():
                lg = model(torch.tensor([row[seg:end]])).logits[0].double()
            lp = torch.log_softmax(lg, dim=-1)
            for j in range(seg, end):
                pos = start + j + 1  # stream position of the target
                if pos <= n_targets:
                    total -= float(lp[j - seg, stream[pos]])
                    count += 1
            seg = end
    # Bytes of the predicted text: targets that are not EOS, decoded per document.
    nbytes, pos = 0, 0
    for d in docs:
        lo, hi = max(pos, 1), min(pos + len(d), n_targets + 1)
        if hi > lo:
            nbytes += len(tok.decode(stream[lo:hi]).encode("utf-8"))
        pos += len(d) + 1
    return dict(loss=total / count, bits_per_byte=total / math.log(2) / nbytes, tokens=count,
                bytes=nbytes)


EVAL_STRIDE = 6


def strided_reference(model, tok, n_targets):
    stream = []
    for t in EVAL_DOCS:
        stream += tok(t, add_special_tokens=False)["input_ids"] + [0]
    stream = stream[:n_targets + 1]
    total, count, prev_end = 0.0, 0, 0
    for begin in range(0, len(stream), EVAL_STRIDE):
        end = min(begin + EVAL_SEQ, len(stream))
        trg_len = end - prev_end
        ids = torch.tensor([stream[begin:end]])
        labels = ids.clone()
        labels[:, :-trg_len] = -100
        with torch.no_grad():
            lg = model(ids).logits[0].double()
        lp = torch.log_softmax(lg, dim=-1)
        for j in range(1, end - begin):  # the model's shift: position j - 1 predicts j
            if labels[0, j] != -100:
                total -= float(lp[j - 1, labels[0, j]])
                count += 1
        prev_end = end
        if end == len(stream):
            break
    ref = eval_reference(model, tok, n_targets)  # the same targets: its bytes hold
    assert count == ref["tokens"], (count, ref["tokens"])
    return dict(loss=total / count, bits_per_byte=total / math.log(2) / ref["bytes"],
                tokens=count, bytes=ref["bytes"])


def build_eval(model, tok, d):
    with open(os.path.join(d, "docs.jsonl"), "w") as f:
        for t in EVAL_DOCS:
            f.write(json.dumps({"text": t}) + "\n")
    ref = dict(seq_len=EVAL_SEQ, max_tokens=EVAL_MAX, all=eval_reference(model, tok, 1 << 30),
               first=eval_reference(model, tok, EVAL_MAX),
               strided=dict(stride=EVAL_STRIDE, all=strided_reference(model, tok, 1 << 30),
                            first=strided_reference(model, tok, EVAL_MAX)))
    with open(os.path.join(d, "expected_eval.json"), "w") as f:
        json.dump(ref, f, indent=1)
        f.write("\n")
    print(f"cli_tiny eval: {ref}")


CHAT_CASES = [
    dict(system="You are terse.", prompt="What is 2+2?", thinking=True),
    dict(system="You are terse.", prompt="Name a colour.", thinking=False),
    dict(system=None, prompt="Hello there", thinking=True),
    dict(system=None, prompt="caf\u00e9 \u2615?", thinking=False),
    dict(system="You are terse.", prompt="Weather in Oslo?", thinking=True, tools=True),
    dict(system=None, prompt="Weather in Z\u00fcrich?", thinking=False, tools=True),
    # The 2507 templates (tests/fixtures/chat/templates, tools/qwen3_templates.py) in a folder
    # where chat_template.jinja holds them, as transformers 5 saves a tokenizer.
    dict(system="You are terse.", prompt="What is 2+2?", thinking=True,
         template="qwen3_2507_instruct"),
    dict(system=None, prompt="Weather in Oslo?", thinking=True, tools=True,
         template="qwen3_2507_thinking"),
]
# The tools file of the cases with tools=True (generate --tools), written as chat_tools.json.
CHAT_TOOLS = [
    {"type": "function", "function": {
        "name": "get_weather", "description": "Current weather \u2014 in \"C\"",
        "parameters": {"type": "object", "properties": {
            "city": {"type": "string"}, "days": {"type": "integer", "default": 1},
            "scale": {"type": "number", "minimum": 0.5, "maximum": 1e16}},
            "required": ["city"]}}},
    {"type": "function", "function": {"name": "noop", "parameters": {}}},
]


# Conversations `generate --messages` continues (chat_messages.jsonl: each line a conversation
# as chat data holds it, with "ids", the ids apply_chat_template(..., add_generation_prompt=True)
# gives; the reader ignores that key, so the file is the command's input too).
CHAT_MESSAGES = [
    {"messages": [{"role": "system", "content": "You are terse."},
                  {"role": "user", "content": "What is 2+2?"},
                  {"role": "assistant", "content": "4.", "reasoning_content": "2 and 2 make 4"},
                  {"role": "user", "content": "And 3+3?"}]},
    {"messages": [{"role": "user", "content": "Weather in Oslo?"},
                  {"role": "assistant", "content": None, "tool_calls": [
                      {"type": "function", "function": {"name": "get_weather",
                                                        "arguments": {"city": "Oslo"}}}]},
                  {"role": "tool", "content": "{\"temp\": 3}"}],
     "tools": CHAT_TOOLS},
    {"messages": [{"role": "user", "content": "caf\u00e9?"}]},
]


def build_chat(root, out_root):
    tok_dir = os.path.join(os.path.dirname(root), "shared", "tokenizers", "qwen3")
    if not os.path.exists(os.path.join(tok_dir, "tokenizer_config.json")):
        print("chat_ids: skipped, no Qwen3 tokenizer at", tok_dir)
        return
    from transformers import AutoTokenizer
    tok = AutoTokenizer.from_pretrained(tok_dir)
    cases = []
    for c in CHAT_CASES:
        msgs = ([dict(role="system", content=c["system"])] if c["system"] else []) + \
               [dict(role="user", content=c["prompt"])]
        template = None
        if c.get("template"):
            with open(os.path.join(root, "tests", "fixtures", "chat", "templates",
                                   c["template"] + ".jinja"), encoding="utf-8") as f:
                template = f.read()
        ids = tok.apply_chat_template(msgs, tokenize=True, add_generation_prompt=True,
                                      enable_thinking=c["thinking"], chat_template=template,
                                      tools=CHAT_TOOLS if c.get("tools") else None)
        if isinstance(ids, dict) or hasattr(ids, "keys"):
            ids = ids["input_ids"]
        cases.append(dict(c, ids=[int(x) for x in ids]))
    with open(os.path.join(out_root, "chat_ids.json"), "w") as f:
        for c in cases:
            f.write(json.dumps(c) + "\n")
    # The string-content template renders the null content of the tool-calling turn.
    with open(os.path.join(root, "tests", "fixtures", "chat", "templates",
                           "qwen3_string_content.jinja"), encoding="utf-8") as f:
        revised = f.read()
    with open(os.path.join(out_root, "chat_messages.jsonl"), "w") as f:
        for c in CHAT_MESSAGES:
            ids = tok.apply_chat_template(c["messages"], tokenize=True, add_generation_prompt=True,
                                          tools=c.get("tools"), chat_template=revised)
            if isinstance(ids, dict) or hasattr(ids, "keys"):
                ids = ids["input_ids"]
            f.write(json.dumps(dict(c, ids=[int(x) for x in ids]), ensure_ascii=False) + "\n")
    with open(os.path.join(out_root, "chat_tools.json"), "w") as f:
        json.dump(CHAT_TOOLS, f, indent=1, ensure_ascii=False)
        f.write("\n")
    print(f"chat_ids: {len(cases)} conversations")


# generation_config.json contents, resolved as transformers' generate() resolves them for a
# model (GenerationMixin._prepare_generation_config): gen_configs.json, for test_generate.
GEN_CONFIGS = [
    {"bos_token_id": 151643, "do_sample": True, "eos_token_id": [151645, 151643],
     "pad_token_id": 151643, "temperature": 0.6, "top_k": 20, "top_p": 0.95},
    {"do_sample": True},
    {"temperature": 0.7},
    {},
    {"do_sample": True, "top_k": None, "min_p": 0.05, "max_new_tokens": 77},
    {"do_sample": False, "top_p": 0.8},
    {"do_sample": True, "repetition_penalty": 1.05, "top_p": 0.8, "top_k": 0, "eos_token_id": 7},
    {"do_sample": None, "temperature": 1.3, "num_beams": 1, "repetition_penalty": 1.0},
    {"do_sample": False, "num_beams": 4, "repetition_penalty": 1.2},
    {"do_sample": True, "no_repeat_ngram_size": 3, "typical_p": 0.9},
    {"num_beams": 3, "length_penalty": 0.5, "early_stopping": "never"},
    {"do_sample": False, "num_beams": 2, "early_stopping": True, "length_penalty": None},
    {"do_sample": True, "num_beams": 4, "early_stopping": False},
]


# Sampling warpers with typical_p, epsilon_cutoff and eta_cutoff (beside the others), as
# transformers' generate() builds them from a generation config (do_sample true).
WARPER_CASES = [dict(temperature=0.7, typical_p=0.5), dict(typical_p=0.9, top_k=8),
                dict(epsilon_cutoff=0.03), dict(eta_cutoff=0.01, top_p=0.9),
                dict(typical_p=0.3, epsilon_cutoff=0.02, eta_cutoff=0.05, min_p=0.05,
                     temperature=1.3),
                dict(eta_cutoff=0.2), dict(typical_p=0.99, temperature=2.0)]


def build_warpers(out_root):
    """warpers.json: for each case of WARPER_CASES (top_k 0 unless given), rows of 40 random
    logits and the ids transformers' warpers keep (scores not -inf), for test_generate."""
    from transformers import GenerationConfig
    model = Qwen3ForCausalLM(Qwen3Config(vocab_size=40, hidden_size=16, intermediate_size=32,
                                         num_hidden_layers=1, num_attention_heads=2,
                                         num_key_value_heads=1, head_dim=8))
    gen = seeded(811)
    cases = []
    for c in WARPER_CASES:
        g = GenerationConfig(do_sample=True, **dict(dict(top_k=0), **c))
        procs = model._get_logits_processor(generation_config=g, input_ids_seq_length=1)
        rows = []
        for r in range(4):
            lg = torch.randn(1, 40, generator=gen) * (1.0 + r)
            kept = ~torch.isinf(procs(torch.zeros(1, 1, dtype=torch.long), lg.clone()))[0]
            rows.append(dict(logits=[float(x) for x in lg[0]],
                             kept=[i for i in range(40) if kept[i]]))
        cases.append(dict(params=dict(dict(top_k=0), **c), rows=rows))
    with open(os.path.join(out_root, "warpers.json"), "w") as f:
        json.dump(cases, f, indent=1)
        f.write("\n")
    print(f"warpers: {len(cases)} cases, kept counts "
          f"{[[len(r['kept']) for r in c['rows']] for c in cases]}")


def build_gen_configs(out_root):
    from transformers import GenerationConfig, Qwen3Config, Qwen3ForCausalLM
    model = Qwen3ForCausalLM(Qwen3Config(vocab_size=64, hidden_size=16, intermediate_size=32,
                                         num_hidden_layers=1, num_attention_heads=2,
                                         num_key_value_heads=1, head_dim=8))
    cases = []
    for d in GEN_CONFIGS:
        model.generation_config = GenerationConfig.from_dict(dict(d))
        g, _ = model._prepare_generation_config(None)
        eos = g.eos_token_id
        cases.append({"file": d, "do_sample": bool(g.do_sample), "temperature": g.temperature,
                      "top_k": g.top_k, "top_p": g.top_p, "min_p": g.min_p or 0.0,
                      "max_new_tokens": g.max_new_tokens or 0,
                      "repetition_penalty": g.repetition_penalty or 1.0,
                      "no_repeat_ngram_size": g.no_repeat_ngram_size or 0,
                      "num_beams": g.num_beams or 1,
                      "length_penalty": 1.0 if g.length_penalty is None else g.length_penalty,
                      "early_stopping": g.early_stopping,
                      "eos": eos if isinstance(eos, list) else ([] if eos is None else [eos])})
    with open(os.path.join(out_root, "gen_configs.json"), "w") as f:
        json.dump(cases, f, indent=1)
        f.write("\n")
    print(f"gen_configs: {len(cases)} files")


def greedy_case(model, m64, prompts, g):
    """Greedy transformers continuations of prompts under the settings g (a
    generation_config.json's keys): (prompt, new ids, raw log-probs) each, the least margin
    between the best two processed scores, and whether float64 gives the same ids."""
    kw = {k: v for k, v in g.items() if k != "do_sample"}
    kw.setdefault("eos_token_id", None)
    results, margin, same64 = [], float("inf"), True

    def run(m, p):
        with torch.no_grad():
            return m.generate(p[None], attention_mask=torch.ones_like(p[None]), do_sample=False,
                              max_new_tokens=NEW, output_logits=True, output_scores=True,
                              return_dict_in_generate=True, pad_token_id=0, **kw)

    for p in prompts:
        out = run(model, p)
        new = out.sequences[0, p.shape[0]:]
        same64 &= run(m64, p).sequences[0, p.shape[0]:].tolist() == new.tolist()
        lps = []
        for t, (lg, sc) in enumerate(zip(out.logits, out.scores)):
            top2 = torch.topk(sc[0].double(), 2).values
            if torch.isfinite(top2[1]):
                margin = min(margin, float(top2[0] - top2[1]))
            lps.append(float(torch.log_softmax(lg[0].double(), dim=-1)[new[t]]))
        results.append((p, new, lps))
    return results, margin, same64


def untied_models(out_root):
    """dense_untied_mha's model (made by build) in float32 and float64, and its folder."""
    from transformers import AutoModelForCausalLM
    src = os.path.join(out_root, "dense_untied_mha")
    model, m64 = (AutoModelForCausalLM.from_pretrained(src, attn_implementation="eager",
                                                       dtype=dt).eval()
                  for dt in (torch.float32, torch.float64))
    return model, m64, src


def write_untied_case(out_root, src, name, g, results):
    """A case folder on dense_untied_mha's model: its config and weights, g and results."""
    d = os.path.join(out_root, name)
    os.makedirs(d, exist_ok=True)
    for f in ("config.json", "model.safetensors"):
        shutil.copy(os.path.join(src, f), os.path.join(d, f))
    write_case(d, g, results)


def build_bans(out_root):
    """dense_bans/: dense_untied_mha's model, greedy (as run() makes the cases above) under a
    generation_config.json with the processors that forbid ids: eos_token_id with
    min_new_tokens = NEW (so the completions still run NEW tokens), suppress_tokens,
    begin_suppress_tokens and bad_words_ids (one single id, one pair), each id taken from the
    continuations without them so that each changes them; kept only where float64 agrees."""
    model, m64, src = untied_models(out_root)
    gen = seeded(701)
    V = model.config.vocab_size
    for attempt in range(100):
        prompts = [torch.randint(0, V, (n,), generator=gen) for n in (4, 9)]
        free = [n.tolist() for _, n, _ in greedy_case(model, m64, prompts, {})[0]]
        g = dict(do_sample=False, eos_token_id=free[0][3], min_new_tokens=NEW,
                 suppress_tokens=[free[0][5]], begin_suppress_tokens=[free[0][0], free[1][0]],
                 bad_words_ids=[[free[1][2]], [free[0][7], free[0][8]]])
        results, margin, same64 = greedy_case(model, m64, prompts, g)
        assert all(len(n) == NEW for _, n, _ in results)
        if margin > MIN_MARGIN and same64:
            break
    write_untied_case(out_root, src, "dense_bans", g, results)
    print(f"dense_bans: {g}, min greedy margin {margin:.3g}")


def build_procs(out_root):
    """dense_procs/ and dense_decay/: dense_untied_mha's model, greedy under generation_config.json
    files with the logits processors of sample.h's LogitProcs beyond the bans of dense_bans.
    dense_procs: sequence_bias (a one-id sequence pushed down, a two-id one pushed up),
    encoder_repetition_penalty, encoder_no_repeat_ngram_size, forced_bos_token_id (a one-id
    prompt among the prompts), begin_suppress_tokens (moved one step later by it) and
    forced_eos_token_id; dense_decay: exponential_decay_length_penalty beside an EOS id, so the
    completions end at different steps. Ids are taken from the continuations without the
    setting, and a case is kept only where leaving out any one setting changes some
    continuation and float64 gives the same ids."""
    model, m64, src = untied_models(out_root)
    gen = seeded(801)
    V = model.config.vocab_size

    def ids_of(results):
        return [n.tolist() for _, n, _ in results]

    def settings(prompts):
        free = ids_of(greedy_case(model, m64, prompts, {})[0])
        g = dict(do_sample=False,
                 sequence_bias=[[[free[1][2]], -40.0], [[free[2][0], free[1][5]], 30.0]],
                 encoder_repetition_penalty=2.5, encoder_no_repeat_ngram_size=2,
                 forced_bos_token_id=free[2][3], forced_eos_token_id=free[1][7])
        # begin_suppress_tokens: what the one-id prompt's second id is with the rest
        g["begin_suppress_tokens"] = [ids_of(greedy_case(model, m64, prompts[:1], g)[0])[0][1]]
        return g

    def decay(prompts):
        free = ids_of(greedy_case(model, m64, prompts, {})[0])
        return dict(do_sample=False, eos_token_id=free[0][NEW - 1],
                    exponential_decay_length_penalty=[3, 1.6])

    for name, lens, make in (("dense_procs", (1, 6, 9), settings),
                             ("dense_decay", (4, 7, 10), decay)):
        for attempt in range(200):
            prompts = [torch.randint(0, V, (n,), generator=gen) for n in lens]
            g = make(prompts)
            results, margin, same64 = greedy_case(model, m64, prompts, g)
            got = ids_of(results)
            each = all(ids_of(greedy_case(model, m64, prompts,
                                          {k: v for k, v in g.items() if k != key})[0]) != got
                       for key in g if key not in ("do_sample", "eos_token_id"))
            ends = sorted({len(x) for x in got})
            if margin > MIN_MARGIN and same64 and each and (name != "dense_decay" or
                                                            (len(ends) > 1 and ends[-1] < NEW)):
                break
        else:
            raise SystemExit(f"{name}: no prompts found")
        write_untied_case(out_root, src, name, g, results)
        print(f"{name}: {g}, lengths {[len(x) for x in got]}, min greedy margin {margin:.3g}")


# Beam search: transformers' generate(num_beams=k, do_sample=False) on models of the cases above
# (read back from their folders). "eos_at" picks EOS ids as the tokens at those positions of the
# search's best sequence without EOS, so beams end at different steps; "proc" are logits
# processors (on log-probabilities, as beam search applies them); with "contrast", a prompt is
# kept only where those settings would give other beams.
BEAM_CASES = [
    dict(model="dense_tied_gqa", k=4, lp=1.0, es=False, new=20, eos_at=[4], ret=2, lens=[5, 11]),
    dict(model="dense_untied_mha", k=3, lp=0.5, es=True, new=16, eos_at=[3], ret=1, lens=[7]),
    dict(model="dense_tied_gqa", k=2, lp=2.0, es="never", new=12, eos_at=[2, 6], ret=2,
         lens=[4, 9]),
    dict(model="dense_untied_mha", k=2, lp=-1.0, es="never", new=10, eos_at=[3], ret=2,
         lens=[6]),
    dict(model="dense_reppen", k=4, lp=1.0, es=False, new=10, eos_at=[], ret=3, lens=[8],
         proc=dict(repetition_penalty=1.3, no_repeat_ngram_size=2)),
    dict(model="moe", k=3, lp=1.0, es=False, new=12, eos_at=[2], ret=1, lens=[5, 10]),
    # Beams that end early and a length penalty that favours long ones: early_stopping false
    # stops on its heuristic (the best running score at the current length) where "never"
    # would go on.
    dict(model="dense_untied_mha", k=3, lp=2.0, es=False, new=16, eos_at=[0, 1], ret=3,
         lens=[5, 8]),
    # The same with "never": a prompt is kept only where false would return other beams.
    dict(model="dense_untied_mha", k=3, lp=2.0, es="never", new=16, eos_at=[0, 1], ret=3,
         lens=[5, 8], contrast=dict(es=False)),
    # The other processors of generation_config.json (sample.h's LogitProcs) on beams: a prompt
    # is kept only where the search without them returns other beams.
    dict(model="dense_untied_mha", k=3, lp=1.0, es=False, new=12, eos_at=[3], ret=2,
         lens=[6, 9], contrast=dict(proc={}),
         proc=dict(sequence_bias=[[[5], 2.0], [[7, 9], 3.0]], encoder_repetition_penalty=1.5,
                   encoder_no_repeat_ngram_size=2, exponential_decay_length_penalty=[6, 1.15],
                   forced_eos_token_id=11)),
]


# `qtitan generate --num-beams 3 --no-repeat-ngram-size 2 --num-return-sequences 2` on cli_tiny
# (the ban keeps its greedy run from repeating one id).
CLI_BEAMS = dict(k=3, lp=1.0, es=False, new=CLI_NEW, ret=2, proc=dict(no_repeat_ngram_size=2))


def beam_generate(model, p, c, eos):
    out = model.generate(p[None], attention_mask=torch.ones_like(p[None]), do_sample=False,
                         num_beams=c["k"], length_penalty=c["lp"], early_stopping=c["es"],
                         max_new_tokens=c["new"], num_return_sequences=c["ret"],
                         eos_token_id=eos or None, pad_token_id=eos[0] if eos else 0,
                         return_dict_in_generate=True, output_scores=True,
                         **c.get("proc", {}))
    seqs = []
    for r in range(c["ret"]):
        n = int((out.beam_indices[r] >= 0).sum())
        seqs.append([int(x) for x in out.sequences[r, p.shape[0]:p.shape[0] + n]])
    return seqs, [float(x) for x in out.sequences_scores]


def build_beams(out_root):
    """beams.json: for each case and prompt, transformers' best num_return_sequences beams (the
    new ids, an ending EOS kept), their sequences_scores and each id's log-probability under
    the model (log_softmax of its logits, from a forward of prompt + ids). A prompt is kept only
    where the search in float64 returns the same ids (no near ties at float32 noise)."""
    from transformers import AutoModelForCausalLM
    gen = seeded(901)
    cases = []
    for c in BEAM_CASES:
        model, m64 = (AutoModelForCausalLM.from_pretrained(
            os.path.join(out_root, c["model"]), attn_implementation="eager",
            experts_implementation="eager", dtype=dt).eval()
            for dt in (torch.float32, torch.float64))
        V = model.config.vocab_size
        for n in c["lens"]:
            for attempt in range(500):
                p = torch.randint(0, V, (n,), generator=gen)
                with torch.no_grad():
                    free, _ = beam_generate(model, p, dict(c, ret=1, proc={}), [])
                    eos = [free[0][i] for i in c["eos_at"]]
                    eos = list(dict.fromkeys(eos))
                    seqs, scores = beam_generate(model, p, c, eos)
                    seqs64, _ = beam_generate(m64, p, c, eos)
                    other = (beam_generate(model, p, dict(c, **c["contrast"]), eos)[0]
                             if "contrast" in c else None)
                if seqs == seqs64 and other != seqs:
                    break
            else:
                raise SystemExit(f"beams: no prompt of {n} tokens for case {c}")
            lps = []
            with torch.no_grad():
                for sq in seqs:
                    full = torch.cat([p, torch.tensor(sq, dtype=p.dtype)])[None]
                    lg = torch.log_softmax(model(full).logits[0].double(), -1)
                    lps.append([float(lg[n - 1 + t, sq[t]]) for t in range(len(sq))])
            cases.append(dict(model=c["model"], num_beams=c["k"], length_penalty=c["lp"],
                              early_stopping=c["es"], max_new_tokens=c["new"], eos=eos,
                              prompt=[int(x) for x in p], sequences=seqs, scores=scores,
                              logprobs=lps, **c.get("proc", {})))
            print(f"beams {c['model']} k={c['k']} prompt {n}: lengths "
                  f"{[len(x) for x in seqs]}, eos {eos}")
    with open(os.path.join(out_root, "beams.json"), "w") as f:
        json.dump(cases, f, indent=1)
        f.write("\n")


def main():
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    out = out_root("generate")
    torch.set_num_threads(1)
    for case in CASES:
        build(case, out)
    build_cli(root, out)
    build_chat(root, out)
    build_gen_configs(out)
    build_warpers(out)
    build_bans(out)
    build_procs(out)
    build_beams(out)


if __name__ == "__main__":
    main()
