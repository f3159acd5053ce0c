"""What people pass instead of a checkpoint folder, named: a Hub id, a folder of weights tietool does not
read (PyTorch pickles, GGUF), an adapter saved without config.json, a save still being written.

Each function looks at a path or its file names only (nothing is read or unpickled) and raises the one-line
error that names what the folder holds and what to do; :mod:`surgery.io.checkpoint` calls them where it
would otherwise say only "no such folder", "config.json not found" or "no whole-model weights found", and
the merge of rank files where it would say "nothing to merge". The patterns are tables below.
"""

from __future__ import annotations

import re
from pathlib import Path

from ..model.errors import CheckpointError
from . import surface

# a Hugging Face Hub repository id (huggingface_hub's validate_repo_id: ORG/NAME of letters, digits, "-",
# "_", "."; no "--" or ".." and not starting or ending with "-" or ".")
HUB_ID_RE = re.compile(r"^(?!.*(--|\.\.))[A-Za-z0-9][A-Za-z0-9_.-]{0,95}/[A-Za-z0-9][A-Za-z0-9_.-]{0,95}$")

# weight files of formats tietool does not read: PyTorch's pickles (torch.save) and llama.cpp's GGUF. A
# Trainer's own state files (optimizer.pt, scheduler.pt, rng_state.pth: surface.TRAINING_STATE) are not
# weights and do not count.
PYTORCH_RE = re.compile(r"^(pytorch_model.*\.bin|.*\.(pt|pth|ckpt))$")
GGUF_RE = re.compile(r"^.*\.gguf$")

# files of a save still being written: a temporary file (renamed to its name when complete); .distcp files
# without the .metadata that says what they hold (a save stopped or still going, or a folder copied in part:
# paddle.distributed.save_state_dict, Paddle 3.x dcp/save_state_dict.py, writes each rank's .distcp and the
# one .metadata from different processes, so no order between them can be relied on)
TMP_RE = re.compile(r"^.*\.(tmp|temp|partial)$")
FLEX_FOLDERS = ("model_state", "optimizer_state", "master_weight")
UNFINISHED_FIX = "wait for the save to finish or use the previous checkpoint-N"


def no_such_folder(path: Path | str) -> CheckpointError:
    """The error for a local folder that does not exist: when ``path`` is written as ``ORG/NAME`` (a Hub
    id) and ``ORG`` is not a local folder either, it says ``hf://ORG/NAME`` reads it from the Hub."""
    text = str(path)
    if HUB_ID_RE.match(text) and not Path(text.split("/")[0]).exists():
        return CheckpointError(
            "no such folder; it looks like a Hugging Face Hub id",
            path,
            f"did you mean hf://{text}? (a revision: hf://{text}@REVISION; merge, convert and add-tokens "
            f"take local folders: download it first, e.g. huggingface_hub.snapshot_download('{text}', "
            "local_dir=DIR))",
        )
    return CheckpointError("no such folder", path, "check the checkpoint path")


def refuse_foreign(path: Path, names: set[str]) -> None:
    """Refuse a folder whose only weights are PyTorch pickles or GGUF, naming the files.

    Args:
        names: the folder's file names (it holds no weights tietool reads: the caller checked).

    Raises:
        CheckpointError: naming up to three such files, what tietool does not read and the export that
            makes a folder it reads.
    """
    state = {n for n in names if surface.TRAINING_STATE.match(n)}
    torch = sorted(n for n in names - state if PYTORCH_RE.match(n))
    gguf = sorted(n for n in names if GGUF_RE.match(n))
    if torch:
        raise CheckpointError(
            f"{', '.join(torch[:3])}: PyTorch weights (a pickle); tietool never unpickles PyTorch files "
            "(.bin, .pt, .pth, .ckpt) and reads only .safetensors and .pdparams",
            path,
            "load the model where you trust the file and save it as safetensors (transformers: "
            "save_pretrained(DIR, safe_serialization=True); a state dict: safetensors.torch.save_file), then "
            "run tietool on that folder",
        )
    if gguf:
        raise CheckpointError(
            f"{', '.join(gguf[:3])}: GGUF (llama.cpp); tietool does not read GGUF and reads only "
            ".safetensors and .pdparams",
            path,
            "run tietool on the safetensors checkpoint the GGUF was made from (or load it with transformers' "
            "from_pretrained(..., gguf_file=...) and save_pretrained(DIR))",
        )


def refuse_adapter(path: Path, names: set[str]) -> None:
    """Refuse an adapter folder as PEFT or PaddleNLP/PaddleFormers save it (``adapter_config.json`` /
    ``lora_config.json`` and the adapter weights, no config.json), before config.json is asked for.

    Raises:
        RefusedError: the adapter refusal of :data:`surface.RULES` (exit 5), naming the files.
    """
    adapter = sorted(n for n in names if surface.ADAPTER_WEIGHTS_RE.match(n) or n in surface.ADAPTER_CONFIGS)
    if adapter:
        raise surface.refuse(
            surface.Cause.ADAPTER, path, f"{', '.join(adapter[:4])}; no config.json and no base-model weights"
        )


def refuse_unfinished(path: Path, names: set[str] | None = None) -> None:
    """Refuse a save still being written (or cut short): a temporary file in the folder or in its flex
    folders, or ``.distcp`` files without the ``.metadata`` a flex save writes last.

    Args:
        names: the folder's file names (None: listed here).

    Raises:
        CheckpointError: naming the file or folder, with "wait for the save to finish or use the previous
            checkpoint-N".
    """
    try:
        names = names if names is not None else {p.name for p in path.iterdir() if p.is_file()}
        folders = [("", names)] + [
            (f"{d}/", {p.name for p in (path / d).iterdir()}) for d in FLEX_FOLDERS if (path / d).is_dir()
        ]
    except OSError:  # an unreadable folder: the reader that lists it refuses it by name
        return
    for where, files in folders:
        tmp = sorted(n for n in files if TMP_RE.match(n))
        if tmp:
            raise CheckpointError(
                f"an unfinished save: {where}{tmp[0]} is a temporary file (a file still being written, or "
                "left by a save that was stopped)",
                path,
                UNFINISHED_FIX,
            )
        distcp = sorted(n for n in files if n.endswith(".distcp"))
        if distcp and not any(n.endswith(".metadata") for n in files):
            raise CheckpointError(
                f"an unfinished save: {where or './'} holds {len(distcp)} .distcp file(s) ({distcp[0]}, ...) "
                "but no .metadata (a save still being written or stopped, or a folder copied in part)",
                path,
                UNFINISHED_FIX,
            )
