"""Which layout a checkpoint's Linear weights are stored in, proven from their shapes (``tietool convert``).

A Paddle ``nn.Linear`` weight is ``[in, out]``, an HF / PaddleFormers one ``[out, in]``. The container does
not say which (PaddleFormers writes safetensors in either, ERNIEKit writes Paddle-layout safetensors), so
each Linear weight's shape is compared with the sizes of the config its two axes must have
(:class:`~surgery.arch.Size`: hidden_size, intermediate_size, heads x head_dim, ...):

* ``[in, out]`` or ``[out, in]`` when the shape is one of the two and ``in != out``;
* a square weight (``in == out``, e.g. ``o_proj`` when heads x head_dim == hidden) takes the layout its
  non-square siblings proved, all of one checkpoint being in one layout;
* a shape that is neither, a size the config lacks, or a checkpoint whose Linear weights are all square:
  not proven, and refused by name; Linear weights proven in both layouts: refused.

What the checkpoint says besides its shapes (``__metadata__`` ``format`` ``np`` / ``pt``, the ``dtype`` or
``torch_dtype`` key, ``source: paddle``) is evidence, reported beside the proof, never the proof. Pure: reads
headers only.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum

from .. import arch
from ..io import surface
from ..io.checkpoint import Checkpoint
from ..model.errors import CheckpointError, Opt, RefusedError

Size = arch.Size


class Layout(str, Enum):
    """The stored layout of a Linear weight."""

    IN_OUT = "[in, out]"  # Paddle nn.Linear (PaddleNLP, PaddleFormers legacy, ERNIEKit)
    OUT_IN = "[out, in]"  # HF / PaddleFormers safetensors


def _int(v: object) -> int | None:
    return v if isinstance(v, int) and not isinstance(v, bool) and v > 0 else None


def sizes(cfg: dict) -> dict[Size, int]:
    """The sizes of config ``cfg`` that Linear weight axes have (a size the config does not give, or gives
    as a list, as ERNIE-VL's per-modality sizes, is absent). ``head_dim`` defaults to hidden / heads and
    ``num_key_value_heads`` to the heads, as the Llama and ERNIE 4.5 configs default them."""
    h, nh = _int(cfg.get("hidden_size")), _int(cfg.get("num_attention_heads"))
    kv = _int(cfg.get("num_key_value_heads")) or nh
    hd = _int(cfg.get("head_dim")) or (h // nh if h and nh and h % nh == 0 else None)
    inter, moe = _int(cfg.get("intermediate_size")), _int(cfg.get("moe_intermediate_size"))
    shared = _int(cfg.get("moe_num_shared_experts"))
    shared_expert = _int(cfg.get("shared_expert_intermediate_size"))
    n_shared = _int(cfg.get("n_shared_experts"))
    got: dict[Size, int | None] = {
        Size.HIDDEN: h,
        Size.HIDDEN2: 2 * h if h else None,
        Size.Q: nh * hd if nh and hd else None,
        Size.KV: kv * hd if kv and hd else None,
        Size.QKV: (nh + 2 * kv) * hd if nh and kv and hd else None,
        Size.INTER: inter,
        Size.INTER2: 2 * inter if inter else None,
        Size.MOE_INTER: moe,
        Size.MOE_INTER2: 2 * moe if moe else None,
        Size.SHARED_INTER: moe * shared if moe and shared else None,
        Size.SHARED_INTER2: 2 * moe * shared if moe and shared else None,
        Size.EXPERTS: _int(cfg.get("moe_num_experts")),
        Size.NUM_EXPERTS: _int(cfg.get("num_experts")),
        Size.SHARED_EXPERT_INTER: shared_expert,
        Size.SHARED_EXPERT_INTER2: 2 * shared_expert if shared_expert else None,
        Size.N_SHARED_INTER: moe * n_shared if moe and n_shared else None,
        Size.N_SHARED_INTER2: 2 * moe * n_shared if moe and n_shared else None,
        Size.ONE: 1,
        Size.VOCAB: _int(cfg.get("vocab_size")),
    }
    got.update(_mla_sizes(cfg, nh))
    got.update(_gated_sizes(cfg, nh, kv, hd))
    return {k: v for k, v in got.items() if v is not None}


def _mla_sizes(cfg: dict, nh: int | None) -> dict[Size, int | None]:
    """The sizes of multi-head latent attention (DeepSeek-V3's ``q_lora_rank``, ``kv_lora_rank``,
    ``qk_nope_head_dim``, ``qk_rope_head_dim``, ``v_head_dim``) and its routed-expert count."""
    ql, kl = _int(cfg.get("q_lora_rank")), _int(cfg.get("kv_lora_rank"))
    nope, rope, v = (_int(cfg.get(k)) for k in ("qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim"))
    return {
        Size.N_ROUTED: _int(cfg.get("n_routed_experts")),
        Size.Q_LORA: ql,
        Size.KV_LORA: kl,
        Size.KV_LORA_ROPE: kl + rope if kl and rope else None,
        Size.MLA_Q: nh * (nope + rope) if nh and nope and rope else None,
        Size.MLA_KV: nh * (nope + v) if nh and nope and v else None,
        Size.MLA_O: nh * v if nh and v else None,
    }


def _gated_sizes(cfg: dict, nh: int | None, kv: int | None, hd: int | None) -> dict[Size, int | None]:
    """The sizes of Qwen3-Next's gated attention (a query head and its gate) and of its linear attention
    (``linear_num_key_heads``, ``linear_key_head_dim``, ``linear_num_value_heads``,
    ``linear_value_head_dim``)."""
    keys = ("linear_num_key_heads", "linear_key_head_dim", "linear_num_value_heads", "linear_value_head_dim")
    nk, dk, nv, dv = (_int(cfg.get(k)) for k in keys)
    return {
        Size.Q_GATED: 2 * nh * hd if nh and hd else None,
        Size.QKV_GATED: (2 * nh + 2 * kv) * hd if nh and kv and hd else None,
        Size.LINEAR_QKVZ: 2 * nk * dk + 2 * nv * dv if nk and dk and nv and dv else None,
        Size.LINEAR_BA: 2 * nv if nv else None,
        Size.LINEAR_V: nv * dv if nv and dv else None,
    }


@dataclass(frozen=True)
class Verdict:
    """One Linear weight: its ``layout`` when its shape proves it (None: not proven, ``why``)."""

    name: str
    shape: tuple[int, ...]
    layout: Layout | None
    why: str = ""
    square: bool = False


def verdict(name: str, shape: tuple[int, ...], dims: tuple[Size, Size], known: dict[Size, int]) -> Verdict:
    """The layout ``shape`` proves for a Linear weight whose ``[in, out]`` axes are the sizes ``dims``.

    One size the config lacks is enough when the other one sits on exactly one axis (hidden_size on the
    first axis of a ``[hidden, 2·moe_intermediate]`` expert with moe_intermediate_size unknown)."""
    din, dout = known.get(dims[0]), known.get(dims[1])
    want = f"[{dims[0].value}, {dims[1].value}] = [{din or '?'}, {dout or '?'}]"
    if len(shape) != 2:
        return Verdict(name, shape, None, f"is {list(shape)}, not 2-D; [in, out] would be {want}")
    a, b = shape
    if din and dout:
        if (a, b) == (din, dout) == (dout, din):
            return Verdict(name, shape, None, "is square", square=True)
        if (a, b) in ((din, dout), (dout, din)):
            return Verdict(name, shape, Layout.IN_OUT if (a, b) == (din, dout) else Layout.OUT_IN)
        return Verdict(name, shape, None, f"is {list(shape)}, which is neither {want} nor its transpose")
    one = din or dout
    if one is None or a == b or one not in (a, b):
        missing = " / ".join(d.value for d in dims if d not in known)
        return Verdict(name, shape, None, f"is {list(shape)} and config.json has no {missing}")
    first_is_in = (a == one) == bool(din)
    return Verdict(name, shape, Layout.IN_OUT if first_is_in else Layout.OUT_IN)


@dataclass
class Proof:
    """The layout of a checkpoint's Linear weights: ``layout`` (None when it has none), the weights whose
    shape proved it (``proven``), the square ones that take it from them (``square``), the evidence besides
    the shapes (``evidence``: what it says, and whether it agrees)."""

    layout: Layout | None
    proven: list[str] = field(default_factory=list)
    square: list[str] = field(default_factory=list)
    evidence: list[tuple[str, Layout]] = field(default_factory=list)

    def note(self) -> str:
        """One line for the report: the layout, how many weights proved it, the evidence."""
        if self.layout is None:
            return "no Linear weight in the files"
        agree = [e for e, lay in self.evidence if lay is self.layout]
        differ = [e for e, lay in self.evidence if lay is not self.layout]
        text = (
            f"Linear weights are {self.layout.value}: proven by the shapes of {len(self.proven)} of them "
            f"against config.json (e.g. {self.proven[0]})"
            + (f", {len(self.square)} square ones taken as their siblings" if self.square else "")
        )
        if agree:
            text += f"; {', '.join(agree)} agree"
        if differ:
            text += f"; {', '.join(differ)} say otherwise (the shapes decide)"
        return text


def evidence(ckpt: Checkpoint) -> list[tuple[str, Layout]]:
    """What the checkpoint says of its layout besides its shapes: safetensors ``__metadata__`` ``format``
    (``np``: written by Paddle code, PaddleNLP / PaddleFormers ``save_to_hf=False`` / ERNIEKit; ``pt``: the
    HF layout), config ``source: paddle`` (PaddleFormers' legacy save) and a ``dtype`` key without
    ``torch_dtype`` (PaddleNLP, ERNIEKit)."""
    out: list[tuple[str, Layout]] = []
    formats = (
        {str((m or {}).get("format")) for m in ckpt.st_metadata.values()} if ckpt.fmt.has_metadata else set()
    )
    if formats == {"np"}:
        out.append(("__metadata__ format np", Layout.IN_OUT))
    elif formats == {"pt"}:
        out.append(("__metadata__ format pt", Layout.OUT_IN))
    cfg = ckpt.config
    if cfg.get("source") == "paddle":
        out.append(("config source: paddle", Layout.IN_OUT))
    if "dtype" in cfg and "torch_dtype" not in cfg:
        out.append(("config key dtype (no torch_dtype)", Layout.IN_OUT))
    return out


def prove(ckpt: Checkpoint, weights: dict[str, tuple[Size, Size]], what: str, strict: bool = True) -> Proof:
    """The layout of Linear weights ``weights`` (name → sizes of its ``[in, out]`` axes) of ``ckpt``.

    ``strict=False`` (a model type without a row: the weights are only named like a row's, their sizes may
    be others, DeepSeek's MLA ``q_proj``): weights whose shape proves nothing are left out, not refused.

    Raises:
        CheckpointError: weights proven in both layouts, or a shape that fits neither (named).
        RefusedError: the layout of some weights is not proven (named, with why): no non-square sibling,
            or a size config.json lacks. ``what`` names the operation for the fix.
    """
    known = sizes(ckpt.config)
    found = [verdict(n, tuple(ckpt.tensors[n].shape), d, known) for n, d in weights.items()]
    by = {lay: [v for v in found if v.layout is lay] for lay in Layout}
    if by[Layout.IN_OUT] and by[Layout.OUT_IN]:
        a, b = by[Layout.IN_OUT][0], by[Layout.OUT_IN][0]
        err = CheckpointError if strict else RefusedError  # only named like a row's: not proven, not damage
        raise err(
            f"the Linear weights are in two layouts: {a.name} is {list(a.shape)} ([in, out]) but {b.name} is "
            f"{list(b.shape)} ([out, in]) for this config",
            ckpt.path,
            "check config.json's sizes (hidden_size, intermediate_size, heads, head_dim) against the files, "
            "or re-export the checkpoint in one layout",
        )
    layout = Layout.IN_OUT if by[Layout.IN_OUT] else Layout.OUT_IN if by[Layout.OUT_IN] else None
    if not strict:
        found = [v for v in found if v.layout is not None or (v.square and layout is not None)]
    bad = [v for v in found if v.layout is None and not (v.square and layout is not None)]
    mismatched = [v for v in bad if "neither" in v.why or "not 2-D" in v.why]
    if mismatched:
        v = mismatched[0]
        raise CheckpointError(
            f"tensor {v.name} {v.why}: its shape does not fit config.json"
            + (f" ({len(mismatched) - 1} more)" if len(mismatched) > 1 else ""),
            ckpt.path,
            "check config.json (hidden_size, intermediate_size, num_attention_heads, num_key_value_heads, "
            "head_dim) against the files",
        )
    if bad:
        shown = surface.few([f"{v.name} {v.why}" for v in bad], 1)
        raise RefusedError(
            f"tietool cannot prove the layout ([in, out] or [out, in]) of {len(bad)} Linear "
            f"weight(s): {shown}; it will not guess it",
            ckpt.path,
            f"add the missing sizes to config.json as the training run had them, or {what}",
        )
    return Proof(
        layout,
        [v.name for v in found if v.layout is not None],
        [v.name for v in found if v.square],
        evidence(ckpt),
    )


def hint_container_only() -> str:
    """The fix that cannot damage: a container change, which rewrites no tensor."""
    return f"use {Opt('to', 'safetensors')} to change only the container (names and layouts copied as stored)"
