#!/usr/bin/env python3
"""The PaddleFormers route for one operation, as a user without tietool would do it (bf16, CPU).

    python bench/pf_route.py tie|untie|resize CKPT OUT [--vocab N]
    python bench/pf_route.py add-tokens CKPT OUT --tokens T... [--special]

* tie:    ``from_pretrained`` (a tied config re-ties the head on load) → ``tie_weights()`` →
          ``save_pretrained``
* untie:  ``from_pretrained`` → ``config.tie_word_embeddings = False`` and the head replaced by a clone of the
          embedding (its own parameter) → ``save_pretrained``
* resize: ``from_pretrained`` → ``resize_token_embeddings(N)`` → ``save_pretrained``
* add-tokens: ``AutoTokenizer.from_pretrained`` and the model's → ``tok.add_tokens(T, special_tokens=...)``
          → ``resize_token_embeddings(len(tok))`` → ``save_pretrained`` of the model and of the tokenizer
          (the recipe of HF's ``add_tokens`` docs). On a checkpoint with slack rows ``len(tok)`` is below the
          rows and this trims them: ``sample_checkpoints/pf_llama_tied_fp32`` (100 rows) with a 90-token
          tokenizer, 2 tokens added, came out with 92 rows and ``vocab_size`` 92.

``from_pretrained`` writes ``flex-ckpt.auto_generated.metadata`` into the folder it loads; it is removed again
afterwards so the input stays as it was (the time to write it is part of the route). Prints one JSON line with
the phase times.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import sys
import time
from pathlib import Path

META = "flex-ckpt.auto_generated.metadata"


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("op", choices=["tie", "untie", "resize", "add-tokens"])
    ap.add_argument("ckpt", type=Path)
    ap.add_argument("out", type=Path)
    ap.add_argument("--vocab", type=int, default=128512)
    ap.add_argument("--tokens", nargs="+", default=[], help="add-tokens: the strings to add")
    ap.add_argument("--special", action="store_true", help="add-tokens: add them as special tokens")
    a = ap.parse_args()
    os.environ.setdefault("CUDA_VISIBLE_DEVICES", "")
    had_meta = (a.ckpt / META).exists()
    t0 = time.perf_counter()
    log = io.StringIO()
    with contextlib.redirect_stdout(log), contextlib.redirect_stderr(log):
        import paddle
        from paddleformers.transformers import AutoTokenizer, LlamaForCausalLM

        paddle.set_device("cpu")
        t_import = time.perf_counter()
        try:
            m = LlamaForCausalLM.from_pretrained(str(a.ckpt), dtype="bfloat16")
        finally:
            if not had_meta:
                with contextlib.suppress(FileNotFoundError):
                    (a.ckpt / META).unlink()
        tok = AutoTokenizer.from_pretrained(str(a.ckpt)) if a.op == "add-tokens" else None
        t_load = time.perf_counter()
        sizes = {}
        if a.op == "tie":
            m.config.tie_word_embeddings = True
            m.tie_weights()
        elif a.op == "untie":
            m.config.tie_word_embeddings = False
            head = m.get_output_embeddings()
            emb = m.get_input_embeddings().weight
            w = head.create_parameter(
                shape=list(emb.shape),
                dtype=emb.dtype,
                default_initializer=paddle.nn.initializer.Constant(0.0),
            )
            w.set_value(emb.clone())
            head.weight = w
        elif a.op == "resize":
            m.resize_token_embeddings(a.vocab)
        else:
            sizes["len_before"] = len(tok)
            sizes["added"] = tok.add_tokens(a.tokens, special_tokens=a.special)
            sizes["len_after"] = len(tok)
            m.resize_token_embeddings(len(tok))
            sizes["rows_after"] = int(m.get_input_embeddings().weight.shape[0])
        t_op = time.perf_counter()
        m.save_pretrained(str(a.out))
        if tok is not None:
            tok.save_pretrained(str(a.out))
        t_save = time.perf_counter()
    files = sorted(p.name for p in a.out.iterdir())
    print(
        json.dumps(
            {
                "op": a.op,
                "import_s": round(t_import - t0, 2),
                "load_s": round(t_load - t_import, 2),
                "op_s": round(t_op - t_load, 2),
                "save_s": round(t_save - t_op, 2),
                "files": files,
                **sizes,
            }
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
