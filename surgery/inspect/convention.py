"""The on-disk conventions ``tietool convert`` moves between, and which one a checkpoint is in.

A convention is a naming (:class:`~surgery.arch.Naming`: ``llama.``, ``ernie.``, ``model.``), a
Linear layout (``[in, out]`` or ``[out, in]``) and a head layout (``[hidden, vocab]`` or ``[vocab, hidden]``).
The naming is read from the tensor names against the model type's row of
:data:`~surgery.arch.CONVERSIONS`; the Linear layout is proven from the shapes
(:mod:`surgery.inspect.linear_layout`); the head's from its shape
(:func:`surgery.plan.convert_tensors.head_layout`). Pure.
"""

from __future__ import annotations

from dataclasses import dataclass

from .. import arch
from ..io.checkpoint import Checkpoint
from ..model.enums import Container
from ..model.errors import CheckpointError, RefusedError
from .linear_layout import Layout, prove

LEGACY_LOAD = 'from_pretrained(path, load_checkpoint_format="legacy", convert_from_hf=False)'
"""The PaddleFormers 1.2 call that loads its legacy Paddle layout (a plain ``from_pretrained`` of such
safetensors loads without a warning and gives wrong logits; measured in ``tests/oracles/test_convert.py``
``test_paddleformers_container_changes_load_as_said`` and ``tests/oracles/test_flex_families.py``)."""

Naming = arch.Naming


@dataclass(frozen=True)
class Convention:
    """One on-disk convention.

    Attributes:
        title: how messages name it.
        names: a :class:`~surgery.arch.Naming` value (``"paddlenlp"``, ``"kit"``, ``"hf"``), or
            ``"kept"`` for a container change.
        linear: ``"in-out"`` (Paddle ``nn.Linear``) or ``"out-in"`` (HF).
        head: ``"hidden-vocab"`` or ``"vocab-hidden"``.
    """

    title: str
    names: str
    linear: str
    head: str


PADDLENLP = Convention("PaddleNLP 2.x", "paddlenlp", "in-out", "hidden-vocab")
PF_LEGACY = Convention("PaddleFormers legacy (Paddle layout)", "hf", "in-out", "vocab-hidden")
HF = Convention("PaddleFormers/HF safetensors", "hf", "out-in", "vocab-hidden")
ERNIEKIT = Convention("ERNIEKit (ernie.* names, Paddle layout)", "kit", "in-out", "hidden-vocab")
# a container change: names and layouts as the input has them, whatever they are
KEPT = Convention("the input's names and layouts", "kept", "kept", "kept")
KNOWN = (PADDLENLP, PF_LEGACY, HF, ERNIEKIT)

# the head layout of a naming whose files hold no head (it is written, if at all, in the target's layout)
DEFAULT_HEAD = {Naming.PADDLENLP: "hidden-vocab", Naming.KIT: "hidden-vocab", Naming.HF: "vocab-hidden"}
_TITLES = {Naming.PADDLENLP: "PaddleNLP 2.x names", Naming.KIT: "ERNIEKit names", Naming.HF: "HF names"}


def convention(naming: Naming, layout: Layout, head: str) -> Convention:
    """The convention of ``naming``, Linear ``layout`` and ``head`` layout: one of :data:`KNOWN`, or one
    titled by its parts (PaddleNLP names with a ``[vocab, hidden]`` head, say)."""
    linear = "in-out" if layout is Layout.IN_OUT else "out-in"
    for c in KNOWN:
        if (c.names, c.linear, c.head) == (naming.value, linear, head):
            return c
    title = f"{_TITLES[naming]}, Linear {layout.value}, head [{head.replace('-', ', ')}]"
    return Convention(title, naming.value, linear, head)


def normalized(body: str) -> str:
    """``body`` with every all-digit name component written ``N`` (``layers.3.mlp.experts.12.x`` →
    ``layers.N.mlp.experts.N.x``), as the suffixes of the table are written."""
    return ".".join("N" if c.isdigit() else c for c in body.split("."))


def suffix_in(body: str, suffixes) -> str | None:
    """The longest of ``suffixes`` that ``body`` (normalized) ends with at a component boundary."""
    nb = normalized(body)
    hits = [s for s in suffixes if arch.matches(nb, s)]
    return max(hits, key=len) if hits else None


def rebase(body: str, fused: str, part: str) -> str:
    """The name of ``part`` (a suffix of the table) of the fused tensor ``body`` that matched ``fused``: the
    components before the match kept, the ``N`` of ``part`` filled with the matched numbers in order."""
    comps = body.split(".")
    n = len(fused.split("."))
    numbers = iter(c for c in comps[-n:] if c.isdigit())
    filled = [next(numbers) if c == "N" else c for c in part.split(".")]
    return ".".join(comps[:-n] + filled)


def naming_of(ckpt: Checkpoint, row: arch.ConversionRow) -> Naming | None:
    """The naming of the checkpoint's body tensors: the first of the row's namings (PaddleNLP, ERNIEKit,
    HF, in that order) whose prefix some tensor carries; None when none does."""
    for naming in Naming:
        pre = row.prefixes.get(naming)
        if pre is not None and any(n.startswith(pre + ".") for n in ckpt.tensors):
            return naming
    return None


def linear_weights(
    ckpt: Checkpoint, row: arch.ConversionRow, naming: Naming
) -> dict[str, tuple[arch.Size, arch.Size]]:
    """The Linear weights (plain and fused, 2-D or not) under the naming's prefix, with the sizes of their
    ``[in, out]`` axes; fused biases (1-D) are not Linear weights."""
    pre = row.prefixes[naming] + "."
    fused = row.fused.get(naming, {})
    out: dict[str, tuple[arch.Size, arch.Size]] = {}
    for name in ckpt.tensors:
        if not name.startswith(pre):
            continue
        body = name[len(pre) :]
        lin = suffix_in(body, row.linear)
        fz = suffix_in(body, fused)
        if lin is not None and (fz is None or len(lin) >= len(fz)):
            out[name] = row.linear[lin]
        elif fz is not None and fz.endswith(".weight"):
            out[name] = fused[fz].dims
    return out


def paddle_layout_evidence(ckpt: Checkpoint) -> str | None:
    """What shows that ``ckpt`` is PaddleFormers safetensors in its legacy Paddle layout (which loads only
    with :data:`LEGACY_LOAD`): config ``"source": "paddle"`` (PaddleFormers' ``save_pretrained
    (save_to_hf=False)`` writes it, and so does ``merge`` with the Paddle layout kept), or Linear weights
    proven ``[in, out]`` by their shapes (the model type's row, else the names of every row's Linear
    weights, :data:`~surgery.arch.ANY_LINEAR`). None: not PaddleFormers safetensors (no
    ``paddleformers_version``), or no such evidence. Reads headers only; raises nothing."""
    cfg = ckpt.config
    if ckpt.format != Container.SAFETENSORS or "paddleformers_version" not in cfg:
        return None
    if cfg.get("source") == "paddle":
        return 'config.json says "source": "paddle"'
    row = arch.conversion_row(cfg.get("model_type"))
    naming = naming_of(ckpt, row) if row is not None else None
    if row is not None and naming is not None:
        weights, strict = linear_weights(ckpt, row, naming), True
    else:
        hits = {n: suffix_in(n, arch.ANY_LINEAR) for n in ckpt.tensors}
        weights, strict = {n: arch.ANY_LINEAR[h] for n, h in hits.items() if h is not None}, False
    try:
        proof = prove(ckpt, weights, "", strict=strict)
    except (CheckpointError, RefusedError):
        return None
    return proof.note() if proof.layout is Layout.IN_OUT else None
