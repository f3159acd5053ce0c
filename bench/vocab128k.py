#!/usr/bin/env python3
"""The inputs of the harness's ``vocab/`` cases (``bench/cases.py``): ``tietool prune`` to a 32k keep-list and
``tietool transplant`` of a 32k donor tokenizer, on a PaddleFormers-written Llama with a real 128k tokenizer
(issue 33's "Done when"), against ``cp -r`` of the same folder.

The real tokenizer files are not in the repository (licences, size): the harness takes them from

* ``TIETOOL_BENCH_TOKENIZER_128K``: Llama-3's ``tokenizer.model`` (the tiktoken rank file Meta ships,
  128,000 ranks; sha256 ``82e9d319…5551b55``) or a folder with a ``tokenizer.json`` of ≥ 128k tokens
  (e.g. the hub's Llama-3 one);
* ``TIETOOL_BENCH_DONOR``: a SentencePiece ``tokenizer.model`` (e.g. Mistral-7B-v0.1's 32,000 pieces, shipped
  as ``mistral_common/data/tokenizer.model.v1``) or a folder of tokenizer files;

(``bench/README.md`` says where each was found). Without them the ``vocab/`` cases are listed as skipped,
naming the variable; at ``--size tiny`` they run on the repository's own real test tokenizers instead.

Made once, untimed, in ``bench/_work``:

* ``tok128k_tokenizer/``: a rank file becomes ``tokenizer.json`` as transformers' own Llama-3 conversion
  does it (``TikTokenConverter``: Llama-3's split pattern and its 256 special tokens, ids 128,000-128,255,
  from ``llama/tokenizer.py`` of meta-llama/llama3), saved by transformers' ``save_pretrained`` with the
  4.x config keys added (as ``add_tokens.py``); 128,256 tokens;
* ``ckpt_128k/``: PaddleFormers 1.2's ``LlamaForCausalLM`` (vocab 128,256, hidden 2048, intermediate 5632,
  4 layers, 16 heads, 8 KV heads, untied, bf16, random init) ``save_pretrained`` to safetensors, with the
  tokenizer files beside it (~1.43 GB; paddle, ~1 min);
* ``keep_32k.json``: the first N ids and, recursively, both parts of every merge making a kept token (a
  tiktoken-converted BPE lists every split of a token as a merge, so the first 32,000 ids alone are not
  closed: prune refuses them, naming 10,128 ids), N = 22,571 the largest giving ≤ 31,744 ids; ranks 0-255
  are Llama-3's byte tokens; the case adds ``--keep-special`` (the 256 specials): ≤ 32,000 kept;
* ``donor_32k/``: the donor ``tokenizer.model`` with a ``tokenizer_config.json`` (LlamaTokenizer, ``<s>``,
  ``</s>``, ``<unk>``).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

WORK = Path(__file__).resolve().parent / "_work"
ENV_TOK, ENV_DONOR = "TIETOOL_BENCH_TOKENIZER_128K", "TIETOOL_BENCH_DONOR"
KEEP = 32000
# meta-llama/llama3 llama/tokenizer.py (Tokenizer.pat_str, special_tokens)
PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+"
    r"|\s+(?!\S)|\s+"
)
SPECIALS = [
    "<|begin_of_text|>",
    "<|end_of_text|>",
    "<|reserved_special_token_0|>",
    "<|reserved_special_token_1|>",
    "<|reserved_special_token_2|>",
    "<|reserved_special_token_3|>",
    "<|start_header_id|>",
    "<|end_header_id|>",
    "<|reserved_special_token_4|>",
    "<|eot_id|>",
] + [f"<|reserved_special_token_{i}|>" for i in range(5, 256 - 5)]
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "tokenizer.model")

BUILD = """
import os, sys
os.environ.setdefault("CUDA_VISIBLE_DEVICES", "")
import paddle
from paddleformers.transformers import LlamaConfig, LlamaForCausalLM
paddle.set_device("cpu")
paddle.seed(0)
vocab, out = int(sys.argv[1]), sys.argv[2]
cfg = LlamaConfig(vocab_size=vocab, hidden_size=2048, intermediate_size=5632, num_hidden_layers=4,
                  num_attention_heads=16, num_key_value_heads=8, max_position_embeddings=8192,
                  rms_norm_eps=1e-5, rope_theta=500000.0, tie_word_embeddings=False,
                  bos_token_id=128000, eos_token_id=128001, dtype="bfloat16")
paddle.set_default_dtype("bfloat16")
model = LlamaForCausalLM(cfg)
model.save_pretrained(out, safe_serialization=True)
"""


def why_missing() -> str | None:
    """Why the real inputs cannot be made here (an unset or wrong variable), or None."""
    for var in (ENV_TOK, ENV_DONOR):
        p = os.environ.get(var)
        if not p:
            return f"needs {var} (a real 128k tokenizer / 32k donor: bench/README.md)"
        if not Path(p).exists():
            return f"{var}={p} does not exist"
    return None


def _tokenizer_from_ranks(rank_file: Path, folder: Path) -> None:
    """Llama-3's rank file as transformers converts it (``TikTokenConverter``), saved by transformers."""
    from transformers import PreTrainedTokenizerFast
    from transformers.convert_slow_tokenizer import TikTokenConverter

    conv = TikTokenConverter(vocab_file=str(rank_file), pattern=PATTERN, extra_special_tokens=SPECIALS)
    t = PreTrainedTokenizerFast(
        tokenizer_object=conv.converted(), bos_token="<|begin_of_text|>", eos_token="<|end_of_text|>"
    )
    t.save_pretrained(str(folder))
    cfg_path = folder / "tokenizer_config.json"
    cfg = json.loads(cfg_path.read_text())
    added = json.loads((folder / "tokenizer.json").read_text())["added_tokens"]
    keys = ("content", "lstrip", "normalized", "rstrip", "single_word", "special")
    cfg["added_tokens_decoder"] = {str(a["id"]): {k: a[k] for k in keys} for a in added}
    cfg["tokenizer_class"] = "PreTrainedTokenizerFast"
    cfg_path.write_text(json.dumps(cfg, indent=2, ensure_ascii=False) + "\n")


def _made(path: Path, make) -> Path:
    if not path.exists():
        tmp = path.with_name(path.name + ".partial")
        shutil.rmtree(tmp, ignore_errors=True)
        make(tmp)
        tmp.rename(path)
    return path


def tokenizer_128k() -> Path:
    src = Path(os.environ[ENV_TOK])

    def make(tmp: Path) -> None:
        tmp.mkdir(parents=True)
        if src.is_file():
            _tokenizer_from_ranks(src, tmp)
        else:
            for n in TOKENIZER_FILES:
                if (src / n).is_file():
                    shutil.copy(src / n, tmp / n)

    return _made(WORK / "tok128k_tokenizer", make)


def n_tokens(folder: Path) -> int:
    """The largest id of ``tokenizer.json`` (base vocabulary and added tokens) + 1."""
    t = json.loads((folder / "tokenizer.json").read_text())
    return max([*t["model"]["vocab"].values(), *(a["id"] for a in t["added_tokens"])]) + 1


def checkpoint() -> Path:
    """``ckpt_128k``: PaddleFormers' ``save_pretrained`` of a random bf16 Llama + the 128k tokenizer."""
    tok = tokenizer_128k()

    def make(tmp: Path) -> None:
        n = n_tokens(tok)
        if n < 128000:
            raise SystemExit(f"{ENV_TOK}: {n} tokens, not ≥ 128,000")
        subprocess.run([sys.executable, "-c", BUILD, str(n), str(tmp)], check=True)
        for f in tok.iterdir():
            shutil.copy(f, tmp / f.name)

    return _made(WORK / "ckpt_128k", make)


def _merge_parts(tokenizer_json: Path) -> tuple[int, dict[int, list[tuple[int, int]]]]:
    """The base vocabulary's size and, per token id, the (left, right) ids of every BPE merge making it."""
    model = json.loads(tokenizer_json.read_text())["model"]
    vocab, parts = model["vocab"], {}
    for m in model["merges"]:
        left, right = m if isinstance(m, list) else m.split(" ", 1)
        parts.setdefault(vocab[left + right], []).append((vocab[left], vocab[right]))
    return len(vocab), parts


def _closure(n: int, parts: dict[int, list[tuple[int, int]]]) -> set[int]:
    """Ids 0..n-1 and, recursively, both parts of every merge that makes a kept token (what prune requires:
    a kept token BPE reaches through a dropped one would make kept text encode differently)."""
    keep, todo = set(range(n)), list(range(n))
    while todo:
        for pair in parts.get(todo.pop(), ()):
            for p in pair:
                if p not in keep:
                    keep.add(p)
                    todo.append(p)
    return keep


def keep_list(ckpt: Path, target: int, name: str) -> Path:
    """``name`` in ``ckpt``'s parent: the merge closure (:func:`_closure`) of the first N base ids, N the
    largest with at most ``target`` ids in it (a bisection); a sorted JSON list. With Llama-3's ranks
    0-255 the byte tokens are in it."""
    dest = ckpt.parent / name
    if not dest.exists():
        base, parts = _merge_parts(ckpt / "tokenizer.json")
        lo, hi = 1, base
        while lo < hi:
            mid = (lo + hi + 1) // 2
            lo, hi = (mid, hi) if len(_closure(mid, parts)) <= target else (lo, mid - 1)
        dest.write_text(json.dumps(sorted(_closure(lo, parts))) + "\n")
    return dest


def donor() -> Path:
    """``donor_32k``: ``TIETOOL_BENCH_DONOR``'s files (a SentencePiece model: with a Llama config)."""
    src = Path(os.environ[ENV_DONOR])

    def make(tmp: Path) -> None:
        tmp.mkdir(parents=True)
        if src.is_file():
            shutil.copy(src, tmp / "tokenizer.model")
            cfg = {
                "tokenizer_class": "LlamaTokenizer",
                "bos_token": "<s>",
                "eos_token": "</s>",
                "unk_token": "<unk>",
                "add_bos_token": True,
                "add_eos_token": False,
            }
            (tmp / "tokenizer_config.json").write_text(json.dumps(cfg, indent=2) + "\n")
        else:
            shutil.copytree(src, tmp, dirs_exist_ok=True)

    return _made(WORK / "donor_32k", make)


if __name__ == "__main__":
    if why := why_missing():
        raise SystemExit(why)
    ck = checkpoint()
    print(ck, n_tokens(ck), keep_list(ck, KEEP - 256, "keep_32k.json"), donor())
