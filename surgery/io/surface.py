"""What is in a folder besides a whole checkpoint, told from file names, config keys and tensor names.

Some folders hold weights that are not a whole model: tensor- or pipeline-parallel rank files (each a slice
of the weights), a LoRA/PEFT adapter or an adapter-wrapped state dict, a quantized embedding or head. No
operation on the vocabulary is right for those, so every command refuses them (:func:`refuse_folder`,
:func:`refuse_tensors`), saying the true cause and a fix that cannot do damage (never "rename a rank
file": one rank's file would pass for the whole model with half the vocabulary).

Other files are not refused but kept out of the checkpoint (:class:`LeftOut`): weight files the index does
not list or of the other format (loaders may prefer a lone ``model.safetensors`` over an index), rank files
beside whole weights, and training state (optimizer moments, master weights, ...) that a write would make
stale. ``inspect`` and the write report list them; ``cli/render/common.py`` words the reasons.

The facts are tables (:data:`RULES`, :data:`TRAINING_STATE`, the patterns below); the functions only match.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import Any

from ..model.errors import Opt, RefusedError, UsageError
from ..model.tensor import FLOAT_DTYPES, TensorInfo


class Cause(Enum):
    """Why a folder is not a whole checkpoint."""

    TENSOR_PARALLEL = "tensor-parallel"
    PIPELINE_PARALLEL = "pipeline-parallel"
    EXPERT_PARALLEL = "expert-parallel"
    SHARDING = "sharding"
    ADAPTER = "adapter"
    ADAPTER_WRAPPED = "adapter-wrapped"
    QUANTIZED = "quantized"
    FLEX = "flex-checkpoint"


@dataclass(frozen=True)
class Rule:
    """A cause in words and the fix for it (a fix that never damages the weights)."""

    what: str
    fix: str
    opts: tuple[Opt, ...] = ()  # formatted into ``fix`` ({0}, ...) when the refusal is made, in its wording


# The words are short on purpose: the refusal is one terminal line (file, cause, detail, fix); the reference
# pages (docs/reference/exit-codes.md, merge.md, training-checkpoints.md) say the rest.
_MERGE_TP = (
    "merge them into a new folder first: tietool merge (local folders only), or PaddleFormers/PaddleNLP "
    "merge_tensor_parallel; one rank's file alone is not the model"
)
_MERGE_ADAPTER = (
    "merge the adapter into the base model first (PaddleNLP/PaddleFormers merge_lora, or PEFT "
    "merge_and_unload() then save_pretrained) and run tietool on the merged folder"
)
RULES: dict[Cause, Rule] = {
    Cause.TENSOR_PARALLEL: Rule(
        "tensor-parallel rank files: each holds a slice of the split tensors (the vocabulary's too), not "
        "whole weights",
        _MERGE_TP,
    ),
    Cause.PIPELINE_PARALLEL: Rule(
        "pipeline-parallel rank files: each holds some of the layers, not whole weights",
        _MERGE_TP.replace("merge_tensor_parallel", "save_pretrained of a unified checkpoint", 1),
    ),
    Cause.EXPERT_PARALLEL: Rule(
        "expert-parallel rank files: each holds some of the experts (and a copy of the other weights), not "
        "a whole model",
        "join them into a new folder first: tietool merge (local folders only), or save the model whole "
        "from PaddleFormers/PaddleNLP on the same expert-parallel layout; one rank's file alone is not the "
        "model",
    ),
    Cause.SHARDING: Rule(
        "sharding (ZeRO) rank files: each holds some of the parameters, not a whole model",
        "load the training checkpoint in PaddleFormers/PaddleNLP on the same sharding layout, save it whole "
        "(save_pretrained or a unified checkpoint) and run tietool on that folder",
    ),
    Cause.ADAPTER: Rule(
        "a LoRA/PEFT adapter, not a whole model: it holds only the adapter weights", _MERGE_ADAPTER
    ),
    Cause.ADAPTER_WRAPPED: Rule(
        "an adapter-wrapped (PEFT/LoRA) state dict, not a plain checkpoint: its vocabulary tables may appear "
        "twice (original_module untrained, modules_to_save trained)",
        _MERGE_ADAPTER,
    ),
    Cause.FLEX: Rule(
        "a flex checkpoint (a PaddleFormers Trainer checkpoint-N/, paddle.distributed.save_state_dict): "
        "each rank's slices of the weights, not whole weights",
        "merge it into a new folder first (tietool merge), or keep the checkpoint-N/ resumable: resize / "
        "add-tokens with {0}; tietool inspect lists what it holds",
        (Opt("keep_training_state", True),),
    ),
    Cause.QUANTIZED: Rule(
        "the embedding/head is quantized (packed integers with scales): tietool edits float tables only, "
        "and rows of a quantized table cannot be added, copied or compared as floats",
        "tie/untie/resize the float checkpoint the quantized one was made from, then quantize again",
    ),
}

# -------------------------------------------------------------------- file names
WEIGHT_EXT = (".safetensors", ".pdparams")
# a rank tag in a weight file name, as the PaddleNLP 2.8 / PaddleFormers 1.2 trainers' weight_name_suffix
# and sharded_name_suffix write them (TrainingArguments, joined by "_", added before the extension):
# model_state.tp00.pdparams, model_state.tp01_pp00.pdparams, model-00001-of-00002.tp00.safetensors,
# model_state_pp01.pdparams; expert parallelism: moe00 (one per data-parallel rank) or moe_sharding00
# (PaddleFormers, expert_model_parallel_size > 1); sharding stage 1: shard00
RANK_RE = re.compile(r"(?:^|[._-])(tp|pp|shard|moe_sharding|moe)(\d+)(?=[._-])", re.IGNORECASE)
# rank tag -> what the files hold; a folder with several kinds is refused for the first in this order
RANK_TAGS: dict[str, Cause] = {
    "moe_sharding": Cause.EXPERT_PARALLEL,
    "moe": Cause.EXPERT_PARALLEL,
    "shard": Cause.SHARDING,
    "tp": Cause.TENSOR_PARALLEL,
    "pp": Cause.PIPELINE_PARALLEL,
}
ADAPTER_CONFIGS = ("lora_config.json", "adapter_config.json", "prefix_config.json")
# adapter weights: PEFT's adapter_model, PaddleNLP / PaddleFormers' lora_model_state and (PaddleFormers 1.2
# LoRAModel.save_pretrained through save_checkpoint(save_peft=True), utils/env.py SAFE_PEFT_WEIGHTS_NAME)
# peft_model.safetensors, its shards and index
ADAPTER_WEIGHTS_RE = re.compile(
    r"^(lora_model_state|adapter_model|prefix_model_state|lora_model|peft_model)([.-].*)?\.(pdparams|safetensors|bin)$"
)
# files a training run writes beside the weights; per-parameter ones go stale when the vocabulary changes
TRAINING_STATE = re.compile(
    r"^(optimizer.*\.(pdopt|pt|pth|bin|safetensors|json)|.*\.pdopt|master_weights.*|scheduler\.(pdparams|pt)"
    r"|trainer_state\.json|rng_state.*|scaler\.(pdparams|pt))$"
)
# a Trainer checkpoint-N/'s flex saves (PaddleFormers 1.2 trainer.py _save_flex_model_state /
# _save_flex_optimizer_state; surgery.io.flex): the weights, moments and master weights at that step's shapes,
# per parameter, beside whole-model weights (save_hf_steps); stale when the model changes, as TRAINING_STATE
TRAINER_FLEX_STATE = re.compile(
    r"^(model_state|optimizer_state|master_weight)/(\d+_\d+\.distcp|\d+\.metadata(\.lock)?)$"
)
# a loader's index of safetensors weights: paddle's flex_checkpoint load_state_dict (dcp/load_state_dict.py,
# create_hf_ckpt_metadata) writes flex-ckpt.auto_generated.metadata into the folder at the first load (so does
# PaddleFormers 1.2's from_pretrained, measured) and reuses one that exists: it describes the input's
# tensors, never an output's, and the loader writes it anew
LOADER_CACHE = re.compile(r"^[^/]+\.auto_generated\.metadata$")
# weights of another library, beside the checkpoint (transformers may read them)
OTHER_WEIGHTS_RE = re.compile(r"^pytorch_model.*\.bin(\.index\.json)?$")


class LeftOutReason(Enum):
    """Why a file in the folder is not part of the checkpoint (not copied to an output)."""

    NOT_IN_INDEX = "not-in-index"  # a weight file of the checkpoint's format that the index does not list
    OTHER_FORMAT = "other-format"  # weights in the other format (or another library's) beside the checkpoint
    RANK_FILE = "rank-file"  # a tensor/pipeline-parallel slice beside whole weights
    TRAINING_STATE = "training-state"  # optimizer / master weights / scheduler / trainer state / rng
    LOADER_CACHE = "loader-cache"  # a loader's own index of the weights (LOADER_CACHE), rewritten by it


@dataclass(frozen=True)
class LeftOut:
    """A file the checkpoint does not include. ``bytes`` is its size; ``kept`` says that an output copies it
    anyway (``--keep-training-state``)."""

    file: str
    reason: LeftOutReason
    bytes: int
    kept: bool = False

    def as_dict(self) -> dict[str, Any]:
        return {"file": self.file, "reason": self.reason.value, "bytes": self.bytes, "kept": self.kept}


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0


def refuse(cause: Cause, path: Path, detail: str, fix: str | None = None) -> RefusedError:
    """The refusal for ``cause``: the rule's words, the detail (files, names), the rule's fix (or ``fix``,
    where the rule's does not apply: :data:`FLEX_MERGE_FIX`)."""
    rule = RULES[cause]
    if fix is None:
        fix = rule.fix.format(*rule.opts) if rule.opts else rule.fix
    return RefusedError(f"{rule.what} ({detail})", path, fix)


# the fix of a flex checkpoint that is not a Trainer checkpoint-N/ (no optimizer_state/ beside model_state/):
# --keep-training-state edits only those
FLEX_MERGE_FIX = "merge it into a new folder first (tietool merge); tietool inspect lists what it holds"


def _parallel_degree(config: dict) -> tuple[Cause, int] | None:
    for key, cause in (
        ("tensor_parallel_degree", Cause.TENSOR_PARALLEL),
        ("pipeline_parallel_degree", Cause.PIPELINE_PARALLEL),
    ):
        v = config.get(key)
        if isinstance(v, int) and not isinstance(v, bool) and v > 1:
            return cause, v
    return None


def few(names: list[str], shown: int = 2) -> str:
    """``names`` for a refusal line: the first ``shown``, then how many more (``a, b and 2 more``)."""
    rest = len(names) - shown
    return ", ".join(names[:shown]) + (f" and {rest} more" if rest > 0 else "")


def rank_files(names: set[str]) -> list[str]:
    """Weight files (and their indexes) whose names carry a tensor/pipeline-parallel rank tag."""
    return sorted(n for n in names if n.endswith(WEIGHT_EXT + (".json",)) and RANK_RE.search(n))


def rank_tags(name: str) -> dict[str, int]:
    """The rank tags of a file name: ``model_state.tp01_moe_sharding00.pdparams`` → ``{tp: 1,
    moe_sharding: 0}``."""
    return {m.group(1).lower(): int(m.group(2)) for m in RANK_RE.finditer(name)}


def rank_cause(ranks: list[str]) -> Cause:
    """What rank files ``ranks`` are, by their tags (:data:`RANK_TAGS`, first kind found in its order)."""
    tags = {t for n in ranks for t in rank_tags(n)}
    return next(c for t, c in RANK_TAGS.items() if t in tags)


def refuse_folder(path: Path, names: set[str], config: dict, has_whole: bool) -> None:
    """Refuse a folder of rank files or an adapter, from file names and config.json alone.

    Args:
        names: the folder's file names.
        has_whole: the folder holds whole-model weights under a standard name.
    """
    ranks = [n for n in rank_files(names) if not n.endswith(".json")]
    degree = _parallel_degree(config)
    if degree is not None:
        cause, n = degree
        key = cause.value.replace("-", "_").replace("parallel", "parallel_degree")
        files = f"; files: {few(ranks)}" if ranks else ""
        raise refuse(cause, path, f"config.json {key} = {n}{files}")
    if ranks and not has_whole:
        raise refuse(rank_cause(ranks), path, f"{few(ranks)}; no whole-model weight file")
    adapter = sorted(n for n in names if ADAPTER_WEIGHTS_RE.match(n) or n in ADAPTER_CONFIGS)
    if adapter and not has_whole:
        raise refuse(Cause.ADAPTER, path, f"{', '.join(adapter[:4])}; no base-model weight file")


# -------------------------------------------------------------------- tensor names
ADAPTER_NAME_RE = re.compile(
    r"(^base_model\.model\.|(^|\.)(lora_[AB]|lora_embedding_[AB]|original_module|modules_to_save|base_layer)"
    r"(\.|$))"
)
# tensors of a quantized layer, by the suffix after the module name
QUANT_SUFFIX_RE = re.compile(
    r"\.(weight_packed|weight_scale|weight_scale_inv|weight_zero_point|weight_shape|weight_g_idx|qweight"
    r"|qzeros|scales|g_idx|SCB|absmax|quant_map|quant_state\..*|weight_quant|weight_format)$"
)
# module names of an input embedding or LM head (the architecture table's, without ".weight")
VOCAB_MODULE_RE = re.compile(
    r"(^|\.)(embed_tokens|tok_embeddings|word_embeddings|wte|shared|word_embedding|embeddings|lm_head"
    r"|output|embed_out|decoder)$"
)


def quant_module(name: str) -> str | None:
    """The module a quantization tensor belongs to (``model.embed_tokens`` of
    ``model.embed_tokens.weight_packed``), or None for other names."""
    m = QUANT_SUFFIX_RE.search(name)
    return name[: m.start()] if m else None


def refuse_tensors(path: Path, config: dict, tensors: dict[str, TensorInfo]) -> None:
    """Refuse adapter-wrapped names and a quantized embedding/head, from the tensor headers."""
    wrapped = [n for n in tensors if ADAPTER_NAME_RE.search(n)]
    if wrapped:
        vocab = [n for n in wrapped if "modules_to_save" in n or "original_module" in n]
        shown = (vocab or wrapped)[:2]
        raise refuse(Cause.ADAPTER_WRAPPED, path, f"{len(wrapped)} wrapped names, e.g. {', '.join(shown)}")
    quant = [n for n in tensors if (m := quant_module(n)) is not None and VOCAB_MODULE_RE.search(m)]
    if quant:
        qc = " and config.json has a quantization_config" if has_quantization_config(config) else ""
        raise refuse(Cause.QUANTIZED, path, f"{few(quant)}{qc}")


def has_quantization_config(config: dict) -> bool:
    blocks = [config] + [v for k, v in config.items() if k.endswith("_config") and isinstance(v, dict)]
    return any(isinstance(b.get("quantization_config"), dict) for b in blocks)


def check_named(ckpt_path: Path, tensors: dict[str, TensorInfo], logical: dict[str, str], **named) -> None:
    """Refuse an ``--embedding`` / ``--head`` NAME that cannot be a vocabulary table.

    Args:
        logical: name → the dtype its values mean (``bfloat16`` for bf16 bits).
        named: option → tensor name (``embedding="..."``), None when not given.

    Raises:
        UsageError: a piece of a split parameter (``NAME@@.0``), a quantization tensor, an integer dtype,
            or a tensor that is not 2-D.
    """
    for opt, name in named.items():
        if name is None or name not in tensors:
            if name is not None and (m := re.match(r"^(.*)@@\.\d+$", name)):
                raise UsageError(
                    f"--{opt} {name} is a piece of {m.group(1)}, which paddle.save split into pieces "
                    "(UnpackBigParamInfor@@); tietool joins them as paddle.load does",
                    ckpt_path,
                    f"pass --{opt} {m.group(1)}",
                )
            continue
        t, dt = tensors[name], logical[name]
        why = None
        if quant_module(name) is not None:
            why = "a quantization tensor (packed integers, scales or shapes of a quantized layer)"
        elif dt not in FLOAT_DTYPES:
            why = f"{dt}, an integer or quantized dtype where a float table is expected"
        elif len(t.shape) != 2:
            why = f"{len(t.shape)}-D {list(t.shape)}, where a table [vocab, hidden] is expected"
        if why:
            raise UsageError(
                f"--{opt} {name} is {why}",
                ckpt_path,
                "tietool inspect shows the embedding and head it finds; name a float [vocab, hidden] table",
            )


def output_left_out(
    path: Path, left_out: list[LeftOut], training_state: list[str], changed: bool, keep_training_state: bool
) -> list[LeftOut]:
    """What a write leaves out of its output: the files that are not part of the checkpoint, and the
    training state (``kept`` when it is copied).

    Training state is dropped whenever the operation changes the model, for every operation: optimizer
    moments, master weights and their index are stored per parameter (by name and shape). resize changes
    the vocabulary tables' shapes, so resuming from them fails or pairs moments with the wrong rows; tie
    removes the head's parameter (its moments become orphans) and untie adds one that has none, so a
    trainer resuming from the output would fail or silently restart the head's statistics. The scheduler,
    trainer_state.json and rng state belong to that same resume point and go with them. An unchanged output
    (a no-op) keeps them; ``--keep-training-state`` keeps them anyway, and the report says they are stale.
    """
    kept = keep_training_state or not changed
    return list(left_out) + [
        LeftOut(f, LeftOutReason.TRAINING_STATE, _size(path / f), kept=kept) for f in training_state
    ]


def check_found(path: Path, logical: dict[str, str], found: dict[str, str | None]) -> None:
    """Refuse a found embedding/head stored as integers or float8: a quantized table, whatever its name.

    Args:
        logical: name → the dtype its values mean.
        found: role (``embedding``, ``head``) → tensor name (None: no such tensor in the files).
    """
    for role, name in found.items():
        if name is not None and name in logical and logical[name] not in FLOAT_DTYPES:
            raise refuse(Cause.QUANTIZED, path, f"the {role} {name} is stored as {logical[name]}")
