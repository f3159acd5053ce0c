"""Every config.json key *name* tietool reads to size a model, in one place (data, not code: add a name
here and every reader follows it).

* vocabulary sizes: :data:`VOCAB_SIZE_KEYS` (the last part of a dotted key at any nesting; walked by
  :mod:`surgery.io.vocabkeys`), :data:`TABLE_SIZE_KEYS` (the one sizing the language model's own table);
* the language model's block: :data:`TEXT_BLOCKS`; its hidden size: :data:`HIDDEN_SIZE_KEYS`;
* the sizes a tensor-parallel shape names (``merge``): :data:`TP_SIZE_KEYS`, :data:`KEY_DIM`.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

# The names (last part of a dotted key) that size a vocabulary, as HF transformers / PaddleFormers /
# PaddleNLP configs spell them: resize and verify both follow them.
VOCAB_SIZE_KEYS: tuple[str, ...] = (
    "vocab_size",  # every family; nested in text_config / llm_config for multimodal wrappers
    "padded_vocab_size",  # ChatGLM / GLM: the padded table size
    "decoder_vocab_size",  # Marian / seq2seq models with a separate target vocabulary
    "vocab_size_per_layer_input",  # Gemma3n's per-layer token tables
    "draft_vocab_size",  # EAGLE-3 draft models: the head's (draft) vocabulary beside the target's vocab_size
)

# The key that sizes the language model's own table, in order of preference within one config block:
# ChatGLM/GLM pad the table and store its size as padded_vocab_size (their vocab_size, when present, is the
# tokenizer's).
TABLE_SIZE_KEYS: tuple[str, ...] = ("padded_vocab_size", "vocab_size")

# Config blocks of a language model (its vocabulary is the text vocabulary), at any nesting.
TEXT_BLOCKS: tuple[str, ...] = ("text_config", "llm_config", "language_config")

# The hidden size of a config block, in order of preference (HF / PaddleNLP spellings: Llama hidden_size,
# T5 / BART d_model, GPT-2 n_embd, ...).
HIDDEN_SIZE_KEYS: tuple[str, ...] = ("hidden_size", "d_model", "n_embd", "hidden_dim", "dim")

# The config.json key of each quantity a tensor-parallel shape is computed from (``merge``'s config_dims:
# ``V``, ``H``, ``I``, the attention heads, the kv heads, the head dimension).
TP_SIZE_KEYS: Mapping[str, str] = MappingProxyType(
    {
        "V": "vocab_size",
        "H": "hidden_size",
        "I": "intermediate_size",
        "HEADS": "num_attention_heads",
        "KV_HEADS": "num_key_value_heads",
        "HEAD_DIM": "head_dim",
    }
)

# the config_dims symbol each config.json key gives (a key whose symbol is there is not missing)
KEY_DIM: Mapping[str, str] = MappingProxyType({TP_SIZE_KEYS[s]: s for s in ("V", "H", "I", "HEADS")})
