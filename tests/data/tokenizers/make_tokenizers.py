"""Train the test tokenizers of this folder from ``corpus.txt``, deterministically, with the real trainers.

Run: ``python tests/data/tokenizers/make_tokenizers.py [OUT]`` (OUT defaults to this folder). Each folder is
one way a checkpoint stores its tokenizer (see README.md here): the model files come from the trainers
(``tokenizers`` BPE/WordPiece, ``sentencepiece`` unigram/BPE) and transformers' conversion; the
``tokenizer_config.json`` / ``special_tokens_map.json`` / ``added_tokens.json`` files are written in the
layout transformers 4.x ``save_pretrained`` writes them (and hub checkpoints carry them: Qwen2, Llama-2, BERT,
GPT-2), because transformers 5.x ``save_pretrained`` no longer writes ``added_tokens_decoder`` or
``special_tokens_map.json``. Every folder is checked by tests/oracles/test_tokenizer_data.py to load in
transformers and PaddleFormers ``AutoTokenizer``.
"""

from __future__ import annotations

import base64
import io
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
CORPUS = HERE / "corpus.txt"
FOLDERS = ("bytelevel_bpe", "gpt2_bpe", "sp_bpe", "sp_bpe_with_json", "sp_unigram", "tiktoken", "wordpiece")


def _lines() -> list[str]:
    return [line for line in CORPUS.read_text(encoding="utf-8").split("\n") if line.strip()]


def _dump(path: Path, data) -> None:
    """JSON as transformers 4.x save_pretrained writes config files (indent 2, sorted keys, UTF-8)."""
    path.write_text(json.dumps(data, indent=2, sort_keys=True, ensure_ascii=False) + "\n", encoding="utf-8")


def _decoder_entry(content: str, special: bool, normalized: bool | None = None) -> dict:
    return {
        "content": content,
        "lstrip": False,
        "normalized": (not special) if normalized is None else normalized,
        "rstrip": False,
        "single_word": False,
        "special": special,
    }


def _byte_bpe(vocab_size: int, special: list[str]):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        special_tokens=special,
        show_progress=False,
    )
    tok.train_from_iterator(_lines(), trainer)
    return tok


def bytelevel_bpe(out: Path) -> None:
    """Qwen2 style: byte-level BPE (300 base tokens) in tokenizer.json, 3 special added tokens and one
    non-special added token (``<think>``, as Qwen3 has it) after the base vocabulary."""
    from tokenizers import AddedToken

    tok = _byte_bpe(300, [])
    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    tok.add_special_tokens([AddedToken(s, special=True, normalized=False) for s in specials])
    tok.add_tokens([AddedToken("<think>", special=False, normalized=False)])
    out.mkdir(parents=True)
    tok.save(str(out / "tokenizer.json"))  # what save_pretrained writes (backend_tokenizer.save)
    dec = {str(tok.token_to_id(s)): _decoder_entry(s, True) for s in specials}
    dec[str(tok.token_to_id("<think>"))] = _decoder_entry("<think>", False, normalized=False)
    _dump(
        out / "tokenizer_config.json",
        {
            "add_prefix_space": False,
            "added_tokens_decoder": dec,
            "additional_special_tokens": specials[1:],
            "bos_token": None,
            "clean_up_tokenization_spaces": False,
            "eos_token": "<|endoftext|>",
            "errors": "replace",
            "model_max_length": 32768,
            "pad_token": "<|endoftext|>",
            "split_special_tokens": False,
            "tokenizer_class": "Qwen2Tokenizer",
            "unk_token": None,
        },
    )
    eot = _decoder_entry("<|endoftext|>", True)
    eot.pop("special")
    _dump(
        out / "special_tokens_map.json",
        {"additional_special_tokens": specials[1:], "eos_token": eot, "pad_token": eot},
    )


def gpt2_bpe(out: Path) -> None:
    """GPT-2 style: vocab.json + merges.txt (byte-level BPE, 300 tokens, ``<|endoftext|>`` at id 0) and one
    added special token ``<pad>`` (id 300) in added_tokens.json, as a 4.x slow GPT2Tokenizer saves it."""
    tok = _byte_bpe(300, ["<|endoftext|>"])
    out.mkdir(parents=True)
    tok.model.save(str(out))  # vocab.json + merges.txt
    _dump(out / "added_tokens.json", {"<pad>": 300})
    _dump(
        out / "tokenizer_config.json",
        {
            "add_bos_token": False,
            "add_prefix_space": False,
            "added_tokens_decoder": {
                "0": _decoder_entry("<|endoftext|>", True),
                "300": _decoder_entry("<pad>", True),
            },
            "bos_token": "<|endoftext|>",
            "clean_up_tokenization_spaces": True,
            "eos_token": "<|endoftext|>",
            "errors": "replace",
            "model_max_length": 1024,
            "pad_token": "<pad>",
            "tokenizer_class": "GPT2Tokenizer",
            "unk_token": "<|endoftext|>",
        },
    )
    _dump(
        out / "special_tokens_map.json",
        {
            "bos_token": "<|endoftext|>",
            "eos_token": "<|endoftext|>",
            "pad_token": "<pad>",
            "unk_token": "<|endoftext|>",
        },
    )


def _sp_model(model_type: str, vocab_size: int) -> bytes:
    import sentencepiece as spm

    blob = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(_lines()),
        model_writer=blob,
        vocab_size=vocab_size,
        model_type=model_type,
        hard_vocab_limit=False,
        num_threads=1,
        pad_id=-1,  # Llama-2: <unk>=0 <s>=1 </s>=2, no pad piece
        character_coverage=0.9995,
        normalization_rule_name="identity",  # Llama-2's trainer settings, without byte_fallback (256 pieces)
        split_digits=True,
        remove_extra_whitespaces=False,
        allow_whitespace_only_pieces=True,
        minloglevel=2,
    )
    return blob.getvalue()


def _llama_config(tokenizer_class: str) -> dict:
    return {
        "add_bos_token": True,
        "add_eos_token": False,
        "added_tokens_decoder": {
            "0": _decoder_entry("<unk>", True),
            "1": _decoder_entry("<s>", True),
            "2": _decoder_entry("</s>", True),
        },
        "bos_token": "<s>",
        "clean_up_tokenization_spaces": False,
        "eos_token": "</s>",
        "legacy": False,
        "model_max_length": 4096,
        "pad_token": None,
        "padding_side": "right",
        "sp_model_kwargs": {},
        "tokenizer_class": tokenizer_class,
        "unk_token": "<unk>",
    }


def _llama_map() -> dict:
    def entry(s: str) -> dict:
        e = _decoder_entry(s, True)
        e.pop("special")
        return e

    return {"bos_token": entry("<s>"), "eos_token": entry("</s>"), "unk_token": entry("<unk>")}


def sentencepiece_folder(out: Path, model_type: str, vocab_size: int) -> None:
    """Llama-2 style: tokenizer.model (SentencePiece ``model_type``) + a LlamaTokenizer tokenizer_config."""
    out.mkdir(parents=True)
    (out / "tokenizer.model").write_bytes(_sp_model(model_type, vocab_size))
    _dump(out / "tokenizer_config.json", _llama_config("LlamaTokenizer"))
    _dump(out / "special_tokens_map.json", _llama_map())


def sp_bpe_with_json(out: Path, sp_bpe: Path) -> None:
    """sp_bpe's tokenizer.model plus the tokenizer.json transformers converts from it (LlamaTokenizerFast)."""
    from transformers import AutoTokenizer

    out.mkdir(parents=True)
    shutil.copy(sp_bpe / "tokenizer.model", out / "tokenizer.model")
    with tempfile.TemporaryDirectory() as tmp:
        AutoTokenizer.from_pretrained(str(sp_bpe)).save_pretrained(tmp)
        shutil.copy(Path(tmp) / "tokenizer.json", out / "tokenizer.json")
    _dump(out / "tokenizer_config.json", _llama_config("LlamaTokenizerFast"))
    _dump(out / "special_tokens_map.json", _llama_map())


def wordpiece(out: Path) -> None:
    """BERT / ERNIE 3 style: vocab.txt from the WordPiece trainer (lower-cased, Chinese split per
    character)."""
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, trainers

    specials = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    tok = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    tok.normalizer = normalizers.BertNormalizer(lowercase=True)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    # tokenizers 0.22's WordPiece trainer is not deterministic (Rust HashMap order: 8 runs at vocab_size=300
    # gave 8 id orders and 2 token sets); trained until pairs are rarer than 5 (12 runs: one set of 234), then
    # written specials first and the rest sorted (WordPiece splits by greedy longest match: ids do not matter)
    trainer = trainers.WordPieceTrainer(
        vocab_size=5000, min_frequency=5, special_tokens=specials, show_progress=False
    )
    tok.train_from_iterator(_lines(), trainer)
    rest = sorted(t for t in tok.get_vocab() if t not in specials)
    out.mkdir(parents=True)
    (out / "vocab.txt").write_text("".join(t + "\n" for t in specials + rest), encoding="utf-8")
    _dump(
        out / "tokenizer_config.json",
        {
            "added_tokens_decoder": {str(i): _decoder_entry(s, True) for i, s in enumerate(specials)},
            "clean_up_tokenization_spaces": True,
            "cls_token": "[CLS]",
            "do_basic_tokenize": True,
            "do_lower_case": True,
            "mask_token": "[MASK]",
            "model_max_length": 512,
            "never_split": None,
            "pad_token": "[PAD]",
            "sep_token": "[SEP]",
            "strip_accents": None,
            "tokenize_chinese_chars": True,
            "tokenizer_class": "BertTokenizer",
            "unk_token": "[UNK]",
        },
    )
    _dump(out / "special_tokens_map.json", {s.strip("[]").lower() + "_token": s for s in specials})


def tiktoken_folder(out: Path) -> None:
    """Qwen-1 style: a ``qwen.tiktoken`` rank file (base64 token, rank) and a custom tokenizer class."""
    tok = _byte_bpe(300, [])

    alphabet = _bytes_to_unicode()
    inverse = {ch: b for b, ch in alphabet.items()}
    ranks = sorted(tok.get_vocab().items(), key=lambda kv: kv[1])
    out.mkdir(parents=True)
    with open(out / "qwen.tiktoken", "w", encoding="ascii", newline="\n") as f:
        for piece, rank in ranks:
            raw = bytes(inverse[ch] for ch in piece)
            f.write(f"{base64.b64encode(raw).decode('ascii')} {rank}\n")
    _dump(
        out / "tokenizer_config.json",
        {
            "auto_map": {"AutoTokenizer": ["tokenization_qwen.QWenTokenizer", None]},
            "model_max_length": 8192,
            "tokenizer_class": "QWenTokenizer",
        },
    )


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's byte -> printable character table (openai/gpt-2 encoder.py bytes_to_unicode)."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1))
    bs += list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, (chr(c) for c in cs), strict=True))


def main(out: Path) -> None:
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    out.mkdir(parents=True, exist_ok=True)
    for name in FOLDERS:
        shutil.rmtree(out / name, ignore_errors=True)
    bytelevel_bpe(out / "bytelevel_bpe")
    gpt2_bpe(out / "gpt2_bpe")
    sentencepiece_folder(out / "sp_unigram", "unigram", 250)
    sentencepiece_folder(out / "sp_bpe", "bpe", 250)
    sp_bpe_with_json(out / "sp_bpe_with_json", out / "sp_bpe")
    wordpiece(out / "wordpiece")
    tiktoken_folder(out / "tiktoken")


if __name__ == "__main__":
    main(Path(sys.argv[1]) if len(sys.argv) > 1 else HERE)
