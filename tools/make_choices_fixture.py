#!/usr/bin/env python3
"""Reference for `qtitan eval --choices` (tests/e2e_eval_choices.sh): lm-evaluation-harness
scoring multiple-choice questions with the cli_tiny model of tools/make_generate_fixtures.py.

Writes into tests/fixtures/generate/cli_tiny/:
  choices.jsonl          the questions, one JSON object a line ({"context", "choices",
                         "label"}), chosen to cover lm-eval's encoding: trailing spaces, tabs,
                         newlines and a no-break space moved from the context to the choice, an
                         empty context (the prefix token, once also written at the start of the
                         choice), choices whose characters and UTF-8 bytes differ, a question
                         without a label, and a context long enough to be cut at a small
                         max_length
  expected_choices.json  for each max_length (the model's context, and 12): every choice's
                         log-likelihood from lm_eval's HFLM.loglikelihood, and acc, acc_norm,
                         acc_bytes with their standard errors as lm-eval's multiple_choice
                         process_results and mean_stderr compute them

The tokenizer is cli_tiny's tokenizer.json with eos_token <|endoftext|> and no bos_token, so
lm-eval's prefix token is <|endoftext|>, as qtitan takes it for a folder without
tokenizer_config.json.

And tests/fixtures/generate/qwen3_requests.json: (context, continuation) pairs encoded by
lm-eval's own request encoding (TemplateLM.loglikelihood, HFLM._encode_pair) with the Qwen3
tokenizer of ../shared/tokenizers/qwen3 (its tokenizer_config.json: eos_token <|im_end|>, no
bos_token, so <|im_end|> is the prefix token): whitespace of every kind Python strips at the
end of a context, empty contexts, CJK and emoji, for tests/test_choices.c.

Needs lm_eval (pip install lm_eval) besides torch and transformers.
Usage: python tools/make_choices_fixture.py [OUT_DIR]
"""
import json
import os

import numpy as np
import torch
from fixture_util import out_root
from lm_eval.api.instance import Instance
from lm_eval.api.metrics import mean_stderr
from lm_eval.models.huggingface import HFLM
from transformers import AutoModelForCausalLM, PreTrainedTokenizerFast

LONG = " ".join(["the quick brown fox jumps over the lazy dog"] * 3)
QUESTIONS = [
    {"context": "The capital of France is", "choices": [" Paris", " London", " Berlin", " a city"],
     "label": 0},
    {"context": "Q: Which one is a fruit?\nA: ", "choices": ["apple", "car", "stone"], "label": 0},
    {"context": "Pick one:\n", "choices": ["red", "blue"], "label": 1},
    {"context": "Caf\u00e9 au", "choices": [" lait", " caf\u00e9 \u2615", " na\u00efve ol\u00e9"],
     "label": 2},
    {"context": "", "choices": ["Hello world", "<|endoftext|>Hello there"], "label": 1},
    {"context": "One two", "choices": [" three", " four"]},
    {"context": "Answer:\t\u00a0", "choices": ["yes", "no", "maybe so"], "label": 0},
    {"context": LONG, "choices": [" again and again", " once"], "label": 1},
    {"context": "2 + 2 =", "choices": [" 4", " 5", " four"], "label": 0},
]
MAX_LENGTHS = [None, 12]


REQUESTS = [
    ("Question: What is 2+2?\nAnswer:", " 4"),
    ("Question: What is 2+2?\nAnswer: ", "4"),
    ("\u65e5\u672c\u306e\u9996\u90fd\u306f", "\u6771\u4eac\u3067\u3059"),
    ("The caf\u00e9 is\t", "open"),
    ("Line one\n\n", "Line two"),
    ("Ends with a no-break space\u00a0", "x"),
    ("Ends with an ideographic space\u3000", "y"),
    ("A line separator\u2028", "next"),
    ("A unit separator\x1f", "field"),
    ("Spaces and a newline  \n ", " indented"),
    ("", "Hello world"),
    ("", "<|im_end|>Hello"),
    ("emoji \U0001F642", " \U0001F643 test"),
    ("He said: \"", "yes\""),
    ("numbers 123", "4567"),
    ("<think>\n\n</think>\n\n", "The answer is B."),
]


class _Requests:
    """Just enough of an lm-eval model for TemplateLM.loglikelihood to encode requests."""
    backend = "causal"

    def __init__(self, tok):
        self.tok = tok
        self.prefix_token_id = tok.bos_token_id if tok.bos_token_id is not None else \
            tok.eos_token_id

    def tok_encode(self, string, add_special_tokens=None, **kw):
        return self.tok.encode(string, add_special_tokens=False)

    def _encode_pair(self, context, continuation):
        return HFLM._encode_pair(self, context, continuation)

    def _loglikelihood_tokens(self, reqs, disable_tqdm=False):
        return reqs


def build_qwen_requests(root, out):
    from lm_eval.api.model import TemplateLM
    from transformers import AutoTokenizer
    d = os.path.join(os.path.dirname(root), "shared", "tokenizers", "qwen3")
    if not os.path.exists(d):
        print(f"qwen3 requests: skipped, no {d}")
        return
    tok = AutoTokenizer.from_pretrained(d)
    reqs = [Instance(request_type="loglikelihood", doc={}, arguments=a, idx=0) for a in REQUESTS]
    enc = TemplateLM.loglikelihood(_Requests(tok), reqs, disable_tqdm=True)
    cases = [dict(context=c, continuation=k, context_ids=list(ce), continuation_ids=list(ke))
             for (c, k), (_, ce, ke) in zip(REQUESTS, enc)]
    with open(os.path.join(out, "qwen3_requests.json"), "w") as f:
        json.dump(dict(prefix=_Requests(tok).prefix_token_id, requests=cases), f, indent=1)
        f.write("\n")
    print(f"qwen3 requests: {len(cases)}")


def main():
    torch.set_num_threads(1)
    d = os.path.join(out_root("generate"), "cli_tiny")
    model = AutoModelForCausalLM.from_pretrained(d, attn_implementation="eager",
                                                 dtype=torch.float32).eval()
    tok = PreTrainedTokenizerFast(tokenizer_file=os.path.join(d, "tokenizer.json"),
                                  eos_token="<|endoftext|>")
    with open(os.path.join(d, "choices.jsonl"), "w") as f:
        for q in QUESTIONS:
            f.write(json.dumps(q) + "\n")
    runs = []
    for max_length in MAX_LENGTHS:
        lm = HFLM(pretrained=model, tokenizer=tok, batch_size=1, max_length=max_length)
        reqs = [Instance(request_type="loglikelihood", doc={}, arguments=(q["context"], c),
                         idx=j) for q in QUESTIONS for j, c in enumerate(q["choices"])]
        lls = [float(ll) for ll, _ in lm.loglikelihood(reqs, disable_tqdm=True)]
        k, hits = 0, {"acc": [], "acc_norm": [], "acc_bytes": []}
        for q in QUESTIONS:
            ll = np.array(lls[k:k + len(q["choices"])])
            k += len(q["choices"])
            if "label" not in q:
                continue
            chars = np.array([float(len(c)) for c in q["choices"]])
            nbytes = np.array([float(len(c.encode("utf-8"))) for c in q["choices"]])
            hits["acc"].append(float(np.argmax(ll) == q["label"]))
            hits["acc_norm"].append(float(np.argmax(ll / chars) == q["label"]))
            hits["acc_bytes"].append(float(np.argmax(ll / nbytes) == q["label"]))
        metrics = {m: dict(value=float(np.mean(v)), stderr=float(mean_stderr(v)))
                   for m, v in hits.items()}
        runs.append(dict(max_length=max_length or lm.max_length, loglikelihoods=lls,
                         metrics=metrics))
        print(f"max_length {lm.max_length}: " +
              ", ".join(f"{m} {v['value']:.3f}" for m, v in metrics.items()))
    with open(os.path.join(d, "expected_choices.json"), "w") as f:
        json.dump(runs, f, indent=1)
        f.write("\n")
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    build_qwen_requests(root, out_root("generate"))


if __name__ == "__main__":
    main()
