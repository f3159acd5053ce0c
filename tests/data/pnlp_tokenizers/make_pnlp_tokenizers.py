"""Writes the PaddleNLP-written tokenizer folders of this directory with PaddleNLP 2.8.1's own classes and
``save_pretrained`` (run by the PaddleNLP venv: ``$PNLP_PYTHON tests/data/pnlp_tokenizers/make_pnlp_tokenizers.py``),
from the trained tokenizers of ``tests/data/tokenizers``:

* ``llama_sp/``: ``LlamaTokenizer(vocab_file=sp_bpe/tokenizer.model)`` (``sentencepiece.bpe.model``, no
  ``added_tokens_decoder``);
* ``ernie_wordpiece/``: ``ErnieTokenizer(vocab_file=wordpiece/vocab.txt)`` (lower-casing ``vocab.txt``);
* ``gpt_bpe/``: ``GPTTokenizer(vocab_file=gpt2_bpe/vocab.json, merges_file=gpt2_bpe/merges.txt)``.
"""

import sys
import zlib  # noqa: F401  (paddle 2.6.2 needs zlib imported before it)
from pathlib import Path

HERE = Path(__file__).resolve().parent
SRC = HERE.parent / "tokenizers"


def main(out: Path) -> int:
    from paddlenlp.transformers import ErnieTokenizer, GPTTokenizer, LlamaTokenizer

    LlamaTokenizer(vocab_file=str(SRC / "sp_bpe" / "tokenizer.model")).save_pretrained(str(out / "llama_sp"))
    ErnieTokenizer(vocab_file=str(SRC / "wordpiece" / "vocab.txt")).save_pretrained(str(out / "ernie_wordpiece"))
    GPTTokenizer(
        vocab_file=str(SRC / "gpt2_bpe" / "vocab.json"), merges_file=str(SRC / "gpt2_bpe" / "merges.txt")
    ).save_pretrained(str(out / "gpt_bpe"))
    return 0


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1]) if len(sys.argv) > 1 else HERE))
