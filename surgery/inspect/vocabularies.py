"""The vocabularies a config names, which one is the text model's, and the tensors found by shape and by
value beyond the named vocabulary tables.

A config may name several vocabularies: a draft model's head vocabulary beside the target's
(``draft_vocab_size``), a thinker's text vocabulary and a talker's codec vocabulary
(``thinker_config.text_config.vocab_size``, ``talker_config.vocab_size``). The text vocabulary is the
language model's (:data:`~surgery.arch.TEXT_BLOCKS` at any nesting); :func:`text_block` finds it
or says that it is not clear. :func:`sized_by` finds every tensor with an axis of a vocabulary's size, of
any dtype and anywhere, so that a tensor no name rule covers is named, never left behind. A size that
another config key also names (``hidden_size``, ``intermediate_size``, ...; inside a layer also sizes
combined from them, :func:`derived_sizes`) cannot tell a float vocabulary axis (:func:`float_counts`;
:func:`ambiguous_sizes`), except for a float vector outside the layers: a bias over the vocabulary.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

from .. import arch
from ..io.vocabkeys import walk
from ..model.tensor import TensorInfo

FLOATS = ("float16", "bfloat16", "float32", "float64")


@dataclass(frozen=True)
class Vocabulary:
    """One vocabulary the config names: its dotted key in config.json and its size."""

    key: str
    size: int

    @property
    def block(self) -> str:
        """The dotted path of the config block holding the key (``""``: the top level)."""
        return self.key.rpartition(".")[0]


@dataclass(frozen=True)
class TextBlock:
    """The language model's config block: ``block`` (the parsed dict), ``key`` (its dotted path, None: the
    top level), and ``unclear``: the candidate blocks when several could be it (then ``key`` is None)."""

    block: dict
    key: str | None
    unclear: tuple[str, ...] = ()


def _int(v: object) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def vocabularies(config: dict) -> list[Vocabulary]:
    """Every vocabulary-size key of ``config`` (any nesting, :data:`arch.VOCAB_SIZE_KEYS`), in file order."""
    return [Vocabulary(k, v) for k, v in walk(config) if k.split(".")[-1] in arch.VOCAB_SIZE_KEYS and _int(v)]


def _blocks(data: object, prefix: str = "") -> Iterable[tuple[str, dict]]:
    """``(dotted path, block)`` of every dict under ``data`` (the top level is ``""``)."""
    if isinstance(data, dict):
        yield prefix.rstrip("."), data
        for k, v in data.items():
            yield from _blocks(v, f"{prefix}{k}.")


def _sizes(block: dict) -> list[int]:
    return [block[k] for k in arch.VOCAB_SIZE_KEYS if _int(block.get(k))]


def text_block(config: dict, tokenizer_size: Callable[[], int | None] = lambda: None) -> TextBlock:
    """The language model's config block.

    A top-level ``text_config`` (``llm_config``, ...); else the one such block at any nesting that names a
    vocabulary (``thinker_config.text_config``); else the top level when it names one. Several candidates
    (such blocks, or, when the top level names none, nested blocks of different vocabulary sizes: a
    thinker's and a talker's) are told apart only by the tokenizer (``tokenizer_size``: the one candidate
    whose vocabulary holds every tokenizer id while the others do not); otherwise ``unclear`` lists them.
    """
    for k in arch.TEXT_BLOCKS:
        if isinstance(config.get(k), dict):
            return TextBlock(config[k], k)
    found = [(p, b) for p, b in _blocks(config) if p.rpartition(".")[2] in arch.TEXT_BLOCKS and _sizes(b)]
    if len(found) == 1:
        return TextBlock(found[0][1], found[0][0])
    if not found and not _sizes(config):
        found = [(p, b) for p, b in _blocks(config) if p and _sizes(b)]
        if len({max(_sizes(b)) for _, b in found}) < 2:
            return TextBlock(config, None)
    if not found:
        return TextBlock(config, None)
    n = tokenizer_size()
    fits = [(p, b) for p, b in found if n is not None and max(_sizes(b)) >= n]
    if len(fits) == 1:
        return TextBlock(fits[0][1], fits[0][0])
    return TextBlock(config, None, tuple(p for p, _ in found))


def table_size_key(block: dict, prefix: str | None) -> str | None:
    """The dotted key that sizes the language model's table in ``block`` (:data:`arch.TABLE_SIZE_KEYS` order),
    or None."""
    k = next((k for k in arch.TABLE_SIZE_KEYS if _int(block.get(k))), None)
    return None if k is None else f"{prefix}.{k}" if prefix else k


def ambiguous_sizes(config: dict, hidden: int | None) -> set[int]:
    """Sizes an axis may have for another reason than a vocabulary: every integer the config names under
    a key that is no vocabulary size and no token id (``hidden_size``, ``intermediate_size``,
    ``n_routed_experts``, ...), and the head size ``hidden_size / num_attention_heads`` it implies."""
    out = {hidden} if hidden else set()
    for k, v in walk(config):
        last = k.split(".")[-1]
        if _int(v) and last not in arch.VOCAB_SIZE_KEYS and not last.endswith(("token_id", "token_index")):
            out.add(v)
    heads = config.get("num_attention_heads")
    if hidden and _int(heads) and heads and hidden % heads == 0:
        out.add(hidden // heads)
    return out


def dtype_kind(logical: str) -> str:
    """``float``, ``bool`` or ``int`` (any other dtype: integers and packed types)."""
    return "float" if logical in FLOATS else "bool" if logical == "bool" else "int"


def derived_sizes(config: dict, hidden: int | None) -> set[int]:
    """Sizes a layer weight's axis may have from config keys combined (:func:`ambiguous_sizes` alone, 2x and
    3x each (fused gate | up, fused q | k | v of equal heads), the product of any two (heads x head_dim,
    moe_intermediate_size x shared experts) and ``(heads + 2 x kv heads) x head_dim``): a float axis of such
    a size inside a numbered block cannot tell a vocabulary axis."""
    base = sorted(v for v in ambiguous_sizes(config, hidden) if v > 0)
    out = set(base) | {k * v for v in base for k in (2, 3)} | {a * b for a in base for b in base}
    heads, kv, dim = (config.get(k) for k in ("num_attention_heads", "num_key_value_heads", "head_dim"))
    kv = kv if _int(kv) else heads
    if isinstance(heads, int) and heads > 0 and not _int(dim) and hidden:
        dim = hidden // heads
    if isinstance(heads, int) and isinstance(kv, int) and isinstance(dim, int):
        out.add((heads + 2 * kv) * dim)
    return out


def sized_by(tensors: dict[str, TensorInfo], size: int, taken: set[str]) -> list[str]:
    """Tensors not in ``taken`` with an axis of ``size`` entries, any dtype, anywhere, in file order (the
    caller leaves out float tensors whose axis may have that size for another reason:
    :func:`float_counts`)."""
    return [n for n, t in tensors.items() if n not in taken and size in tuple(t.shape)]


def float_counts(
    name: str,
    shape: tuple[int, ...],
    size: int,
    ambiguous: set[int] | frozenset[int],
    derived: set[int] | frozenset[int],
    hidden: int | None,
) -> bool:
    """A float tensor ``name`` with an axis of ``size`` entries is on the vocabulary surface: inside a
    numbered block (a layer's own weights) when no config key names the size, alone or combined
    (``derived``, :func:`derived_sizes`); outside one when no config key names it (``ambiguous``), or
    always for a vector (``[size]``, ``[1, size]``: a bias over the vocabulary) unless ``size`` is the
    hidden size."""
    if arch.is_extra_table(name):
        return size not in ambiguous and size not in derived
    vector = len(shape) == 1 or (len(shape) == 2 and shape[0] == 1)
    return size not in ambiguous or (vector and size != hidden)
