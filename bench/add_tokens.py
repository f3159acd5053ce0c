#!/usr/bin/env python3
"""The inputs of the harness's ``tokens/`` cases (``bench/cases.py``): ``tietool add-tokens`` of the 8 tokens
:data:`TOKENS` into the benchmark checkpoint, against ``resize`` (+8 rows) in the same run (issue 20).

Inputs (made once, untimed, in ``bench/_work``): two hard-linked copies (``cp -al``) of ``ckpt_60l``, each
with a real tokenizer beside it, written by transformers' ``save_pretrained``:

* ``tok_slack``: 128,000 tokens for 128,256 rows (256 slack rows: the 8 new tokens take slack rows, the
  model keeps its size);
* ``tok_full``: 128,256 tokens, as many as rows (no slack: the model grows by 8 rows).

The base vocabulary is a byte-level BPE (Llama-3 / Qwen2 style: ``tokenizers``' ``BpeTrainer`` with the
256-byte initial alphabet) of 127,998 tokens, trained on a generated corpus (seeded pseudo-words of syllables,
~10 s); ``tok_slack`` adds the special tokens ``<|begin_of_text|>`` and ``<|end_of_text|>`` (bos / eos),
``tok_full`` those and the 256 ``<|reserved_special_token_N|>`` of Llama-3. transformers 5 writes
``tokenizer.json`` and ``tokenizer_config.json`` (``extra_special_tokens``); the config then gets the
``added_tokens_decoder`` and ``tokenizer_class: PreTrainedTokenizerFast`` that transformers 4.x writes and
most published checkpoints carry, so both styles of key are present for add-tokens to keep in step.

Made by :func:`prepare` on first use (needs ``tokenizers`` and ``transformers``).
"""

from __future__ import annotations

import json
import random
import subprocess
import time
from pathlib import Path

WORK = Path(__file__).resolve().parent / "_work"

TOKENS = [
    "<|im_start|>",
    "<|im_end|>",
    "<think>",
    "</think>",
    "<tool_call>",
    "</tool_call>",
    "<|pad|>",
    "<|eot|>",
]
ROWS = 128256
BASE = 127998  # BPE tokens; + 2 specials = 128,000 (slack), + 258 = 128,256 (full)
VARIANTS = {"slack": 128000, "full": 128256}
RESIZE_TO = ROWS + len(TOKENS)


# ---------------------------------------------------------------- inputs (untimed, once)


def _corpus(n_lines: int = 20000):
    """Seeded pseudo-words (1-5 syllables) from a 300,000-word lexicon, half Zipf-like, half uniform."""
    rng = random.Random(0)
    syl = [a + b for a in "bcdfghjklmnprstvwz" for b in "aeiou"] + list("aeiou")
    lex: set[str] = set()
    while len(lex) < 300000:
        lex.add("".join(rng.choice(syl) for _ in range(rng.randint(1, 5))))
    words = sorted(lex)
    rng.shuffle(words)
    r = random.Random(1)
    for _ in range(n_lines):
        yield " ".join(
            words[min(int(r.paretovariate(0.7)) - 1, len(words) - 1)] if r.random() < 0.5 else r.choice(words)
            for _ in range(200)
        )


def _train_bpe():
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tr = trainers.BpeTrainer(
        vocab_size=BASE, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False
    )
    tok.train_from_iterator(_corpus(), tr)
    if tok.get_vocab_size() != BASE:
        raise SystemExit(f"BPE training reached {tok.get_vocab_size()} tokens, not {BASE}")
    return tok


def _write_tokenizer(base, folder: Path, n_tokens: int) -> None:
    """transformers' save_pretrained of ``base`` + specials up to ``n_tokens``, then the 4.x config keys."""
    from tokenizers import Tokenizer
    from transformers import PreTrainedTokenizerFast

    t = PreTrainedTokenizerFast(
        tokenizer_object=Tokenizer.from_str(base.to_str()),
        bos_token="<|begin_of_text|>",
        eos_token="<|end_of_text|>",
    )
    extra = [f"<|reserved_special_token_{i}|>" for i in range(n_tokens - BASE - 2)]
    if extra:
        t.add_special_tokens({"additional_special_tokens": extra})
    if len(t) != n_tokens:
        raise SystemExit(f"tokenizer has {len(t)} tokens, not {n_tokens}")
    t.save_pretrained(str(folder))
    cfg_path = folder / "tokenizer_config.json"
    cfg = json.loads(cfg_path.read_text())
    added = json.loads((folder / "tokenizer.json").read_text())["added_tokens"]
    keys = ("content", "lstrip", "normalized", "rstrip", "single_word", "special")
    cfg["added_tokens_decoder"] = {str(a["id"]): {k: a[k] for k in keys} for a in added}
    cfg["tokenizer_class"] = "PreTrainedTokenizerFast"
    cfg_path.write_text(json.dumps(cfg, indent=2, ensure_ascii=False) + "\n")


def prepare(ckpt: Path) -> dict[str, Path]:
    """``tok_slack`` and ``tok_full``: ``cp -al`` of ``ckpt`` with a tokenizer of 128,000 / 128,256 tokens."""
    dirs = {v: WORK / f"tok_{v}" for v in VARIANTS}
    ready = {v: WORK / f".tok_{v}.ready" for v in VARIANTS}
    if all(r.exists() for r in ready.values()):
        return dirs
    t0 = time.perf_counter()
    base = _train_bpe()
    print(f"trained byte-level BPE of {BASE} tokens in {time.perf_counter() - t0:.1f} s", flush=True)
    for v, d in dirs.items():
        subprocess.run(["rm", "-rf", str(d)], check=True)
        subprocess.run(["cp", "-al", str(ckpt), str(d)], check=True)
        _write_tokenizer(base, d, VARIANTS[v])
        ready[v].write_text("")
    return dirs
