"""A checkpoint folder: ``config.json``, weight files (one of four layouts), index, other files.

Opening a checkpoint reads headers only (safetensors headers, pickle structure); tensor data is loaded on
demand with :meth:`Checkpoint.load`. Every inconsistency that would make a write unsafe is raised here,
before anything is written; recoverable ones (a stale index entry, a tensor missing from the index) become
``warnings``.
"""

from __future__ import annotations

import errno
import os
import re
import stat
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..model.enums import Container
from ..model.errors import CheckpointError
from ..model.tensor import TensorInfo, require_array
from . import mistaken, regular, safetensors_io, store, stores, surface, tree
from .configfile import read_config
from .formats import FORMATS, PDPARAMS, SAFETENSORS, Format, other
from .regular import kind_of, load_json, require_regular
from .stores import Store

if TYPE_CHECKING:
    import numpy as np
else:
    from ..model.lazy import numpy as np

ST_SINGLE = SAFETENSORS.single
ST_INDEX = SAFETENSORS.index
PD_SINGLE = PDPARAMS.single
PD_INDEX = PDPARAMS.index
_WEIGHT_SUFFIXES = (".safetensors", ".pdparams", ".index.json")  # weight and index files of a folder
SHARD_RE = re.compile(r"^(model|model_state)-(\d+)-of-(\d+)\.(safetensors|pdparams)$")
CONFIG_FILES = ("config.json", "model_config.json")
REPORT_NAME = "tietool-report.json"


def _read_json(path: Path, what: str, limit: int = regular.JSON_LIMIT) -> Any:
    """A JSON file of the checkpoint, read strictly (:func:`surgery.io.regular.load_json`: a regular file,
    bounded size and depth, no huge integers or non-finite numbers, no repeated keys).

    Raises:
        CheckpointError: missing, not a regular file, unreadable or not valid JSON, naming ``what``.
    """
    return load_json(path, what, limit)


def _refuse_not_a_checkpoint(path: Path, names: set[str]) -> None:
    """A folder with neither a config file nor a weight file is not a checkpoint (``tietool inspect`` run
    in the wrong folder): say so, rather than that config.json is missing.

    Raises:
        CheckpointError: with the folder's absolute path.
    """
    if names & {"config.json", "model_config.json"}:
        return
    mistaken.refuse_adapter(path, names)
    mistaken.refuse_unfinished(path, names)
    if not any(n.endswith((".safetensors", ".pdparams", ".index.json")) for n in names):
        mistaken.refuse_foreign(path, names)
        refuse_output_dir(path)
        raise CheckpointError(
            "not a checkpoint folder (no config.json and no weight files in it)",
            path.resolve(),
            "name the checkpoint folder, or run the command inside it",
        )


def _refuse_flex(path: Path) -> None:
    """Refuse a flex checkpoint (``checkpoint-N/`` with ``model_state/``, or ``*.distcp`` + ``*.metadata``):
    every command but ``inspect`` and ``merge`` says to merge it first (exit 5, as for rank files).

    Raises:
        RefusedError: naming the folder that holds the ``.distcp`` files.
    """
    from .flex import find  # only local folders are looked at

    folder = find(path)
    if folder is not None:
        where = folder.state.relative_to(folder.root).as_posix()
        detail = (
            f"{where}/ holds the .distcp and .metadata files" if where != "." else ".distcp and .metadata"
        )
        trainer = folder.state.name == "model_state" and "optimizer_state" in folder.others
        raise surface.refuse(surface.Cause.FLEX, path, detail, None if trainer else surface.FLEX_MERGE_FIX)


def refuse_output_dir(path: Path) -> None:
    """Name the Trainer checkpoints of a folder that holds no weights of its own but ``checkpoint-N/``
    flex checkpoints (a Trainer's ``output_dir``), as ``merge`` does.

    Raises:
        CheckpointError: naming them and the last one to give instead.
    """
    from .flex import inside  # only local folders are looked at

    held = inside(Path(path)) if stores.is_local(path) else []
    if held:
        raise CheckpointError(
            f"a Trainer's output_dir, with no weights of its own but the flex checkpoints "
            f"{', '.join(p.name + '/' for p in held[:4])}{' ...' if len(held) > 4 else ''}",
            path,
            f"name one checkpoint-N/ folder instead, e.g. {held[-1]}",
        )


def has_whole(names: set[str]) -> bool:
    """Whole-model weights under a name save_pretrained writes (single file, index, or shards)."""
    return bool({ST_SINGLE, ST_INDEX, PD_SINGLE, PD_INDEX} & names) or any(SHARD_RE.match(n) for n in names)


_has_whole = has_whole


def _left_out(path: Path, names: set[str], fmt: Format, taken: set[str | None]) -> list[surface.LeftOut]:
    """Weight files beside the checkpoint that are not part of it: its own format's single file or shards
    the index does not list, weights of the other format or library, rank files beside whole weights."""
    out = []
    other_ext = other(fmt).ext
    own = {fmt.single, fmt.index}
    for n in sorted(names - {x for x in taken if x}):
        if surface.TRAINING_STATE.match(n) or surface.ADAPTER_WEIGHTS_RE.match(n):
            continue
        if surface.LOADER_CACHE.match(n):
            reason = surface.LeftOutReason.LOADER_CACHE
        elif surface.RANK_RE.search(n) and n.endswith(surface.WEIGHT_EXT + (".json",)):
            reason = surface.LeftOutReason.RANK_FILE
        elif n in own or (SHARD_RE.match(n) and not n.endswith(other_ext)):
            reason = surface.LeftOutReason.NOT_IN_INDEX
        elif (
            n.endswith(other_ext)
            or n in {ST_INDEX, PD_INDEX}
            or SHARD_RE.match(n)
            or surface.OTHER_WEIGHTS_RE.match(n)
        ):
            reason = surface.LeftOutReason.OTHER_FORMAT
        else:
            continue
        out.append(surface.LeftOut(n, reason, (path / n).stat().st_size))
    return out


def _file_names(st: Store) -> set[str]:
    """Names of the files directly in checkpoint folder ``st.root`` (remote: one listing request, whose
    result fsspec caches for the ``is_file``/``stat`` calls that follow).

    Raises:
        CheckpointError: no such folder, or the root is a file.
    """
    path = st.root
    if not st.on_disk:
        try:
            files = st.list()  # None: path is a file
        except FileNotFoundError:
            raise mistaken.no_such_folder(path) from None
        names = None if files is None else set(files)
    else:
        names = _local_names(path)
    if names is None:
        raise CheckpointError(
            "is a file, expected a checkpoint folder",
            path,
            "pass the folder that holds config.json and the weights",
        )
    return names


def _local_names(path: Path) -> set[str] | None:
    """The regular files directly in local folder ``path`` (None: ``path`` is a file).

    Raises:
        CheckpointError: no such folder; the folder cannot be listed (permission); an entry is a FIFO,
            socket or device (or a link to one, ``/dev/zero``): tietool reads or copies every file of the
            folder, and such a file would block the read or the copy or never end.
    """
    try:
        if not path.is_dir():
            if not path.exists():
                raise mistaken.no_such_folder(path)
            return None
        names = set()
        for p in path.iterdir():
            try:
                mode = p.stat().st_mode
            except OSError as e:  # a dangling link or a loop of links: neither read nor copied
                if e.errno in (errno.ENOENT, errno.ELOOP):
                    continue
                raise
            if stat.S_ISREG(mode):
                names.add(p.name)
            elif not stat.S_ISDIR(mode):
                raise special_file(p, mode)
        return names
    except OSError as e:
        raise unreadable_folder(path, e) from None


def unreadable_folder(folder: Path, e: OSError) -> CheckpointError:
    """The refusal of a checkpoint folder (or subfolder) that cannot be listed or whose entries cannot be
    looked at (no ``r`` or no ``x`` permission)."""
    where = f" ({Path(e.filename).name})" if e.filename and Path(e.filename) != folder else ""
    return CheckpointError(
        f"the folder cannot be read: {e.strerror}{where}", folder, "make it readable (chmod -R u+rX)"
    )


def special_file(p: Path, mode: int) -> CheckpointError:
    """The refusal of a FIFO / socket / device (or a link to one) in a checkpoint folder."""
    return CheckpointError(
        f"{p.name} is {kind_of(mode)}, expected a regular file: tietool reads or copies every file of a "
        "checkpoint",
        p,
        "remove it from the checkpoint folder, or replace it with the real file",
    )


MAX_RANK = 32
"""The most axes a tensor may have: numpy 1.x arrays hold at most 32 (``NPY_MAXDIMS``), paddle tensors 9; a
rank above it cannot be loaded by any reader of a Paddle checkpoint."""


def _check_ranks(path: Path, tensors: dict[str, TensorInfo]) -> None:
    """Every tensor has at most :data:`MAX_RANK` axes.

    Raises:
        CheckpointError: naming the first tensor with more, its file and its shape.
    """
    for t in tensors.values():
        if len(t.shape) > MAX_RANK:
            raise CheckpointError(
                f"tensor {t.name} has {len(t.shape)} axes; numpy holds at most "
                f"{MAX_RANK} and paddle 9, so no loader can read it",
                path / t.file,
                "the file is damaged or was not written by paddle: re-export the checkpoint",
            )


def _unlisted_weights(names: set[str], fmt: Format, shards: list[str], listed: list[str]) -> list[str]:
    """Weight files of the checkpoint's format that its index does not list: shards, and the single file
    (``model.safetensors`` / ``model_state.pdparams``) a renamed shard often becomes."""
    single = fmt.single
    return [f for f in shards + ([single] if single in names else []) if f not in listed]


NAME_MAX = 255  # bytes of one file name (Linux, macOS; the longest name any file system here allows)


def check_index(index: Any, path: Any, name: str) -> dict[str, str]:
    """The weight_map of a parsed index, every entry checked: an object of tensor name → shard file name,
    each a plain file name in the folder (no ``/``, ``\\``, leading ``.``, NUL; at most 255 bytes), and
    ``metadata`` (optional) an object whose ``total_size`` (optional) is an integer ≥ 0. As
    ``save_pretrained`` writes it (PaddleFormers 1.2 ``shard_checkpoint``; transformers the same).

    Raises:
        CheckpointError: naming the index file and the entry that breaks the rule.
    """
    wm = index.get("weight_map") if isinstance(index, dict) else None
    if not isinstance(wm, dict):
        raise CheckpointError("index has no weight_map of name → shard file", path, "regenerate the index")
    for tensor, f in wm.items():
        problem = _shard_name_problem(f)
        if problem:
            raise CheckpointError(
                f"index weight_map entry {_short(tensor)!r} is {problem}, expected a shard file name in the "
                "folder",
                path,
                "regenerate the index",
            )
    meta = index.get("metadata", {})
    if meta is not None and not isinstance(meta, dict):
        raise CheckpointError("index metadata is not a JSON object", path, "regenerate the index")
    total = (meta or {}).get("total_size")
    if total is not None and (isinstance(total, bool) or not isinstance(total, int) or total < 0):
        raise CheckpointError(
            f"index metadata.total_size is {_short(repr(total))}, expected a byte count (an integer ≥ 0)",
            path,
            "regenerate the index",
        )
    return wm


def _short(s: str, n: int = 60) -> str:
    return s if len(s) <= n else s[: n - 3] + "..."


def _shard_name_problem(f: Any) -> str | None:
    """Why ``f`` cannot be a shard file name in the folder (None: it can)."""
    if not isinstance(f, str):
        return f"{type(f).__name__ if f is not None else 'null'}, not a string"
    if not f:
        return "an empty name"
    if "/" in f or "\\" in f or f.startswith("."):
        return f"{_short(f)!r}, outside the folder"
    if "\0" in f:
        return "a name with a NUL character"
    if len(f.encode("utf-8", "surrogatepass")) > NAME_MAX:
        return f"a name of {len(f.encode('utf-8', 'surrogatepass')):,} bytes (longer than a file name can be)"
    return None


def _check_listed(
    path: Path, index_name: str, wm: dict[str, str], listed: list[str], unlisted: list[str]
) -> None:
    """Every shard the index lists is a file in the folder.

    Raises:
        CheckpointError: a shard outside the folder; a listed shard missing, naming the unlisted weight file
            that holds the tensors the index maps to it when there is one (a renamed shard: d09).
    """
    for f in listed:
        if (path / f).is_file():
            continue
        if not store.is_remote(path) and os.path.lexists(path / f):
            regular.open_regular(path / f, f).close()  # a FIFO, device or folder: refused by what it is
        mapped = [n for n, g in wm.items() if g == f]
        for holder in unlisted:
            held = set(_names_in(path / holder, holder))
            if held & set(mapped):
                raise _renamed_shard(path, index_name, f, holder, mapped, set(wm) <= held)
        raise CheckpointError(
            f"index names shard {f}, which is not in the folder",
            path / index_name,
            f"restore {f} or regenerate the index",
        )


def _names_in(p: Path, rel: str) -> list[str]:
    """The tensor names in weight file ``p`` (headers only; [] for a file that cannot be read)."""
    try:
        fmt = SAFETENSORS if rel.endswith(SAFETENSORS.ext) else PDPARAMS
        return [t.name for t in fmt.read_header(p, rel).tensors]
    except CheckpointError:
        return []


def _renamed_shard(
    path: Path, index_name: str, missing: str, holder: str, mapped: list[str], holds_all: bool
) -> CheckpointError:
    """The refusal of a stale index whose missing shard's tensors are in ``holder``, which it does not list
    (loaders disagree on such a folder: transformers reads a lone model.safetensors, PaddleX the index)."""
    fix = (
        f"if {holder} is {missing} renamed, delete the stale index {index_name} ({holder} holds every "
        f"tensor it lists; a single file needs no index) or rename {holder} back to {missing}"
        if holds_all
        else f"if {holder} is {missing} renamed, rename it back to {missing}; else restore {missing}"
    )
    return CheckpointError(
        f"index names shard {missing}, which is not in the folder, for {len(mapped)} tensors (e.g. "
        f"{mapped[0]}); {holder}, which the index does not list, holds them: the index is stale",
        path / index_name,
        fix,
    )


def array_rows(a: Any, chunk_rows: int, start: int = 0, stop: int | None = None) -> Iterator[Any]:
    """Rows ``start:stop`` of the loaded array ``a`` in chunks of ``chunk_rows`` (views, no copy); a 0-d
    array is yielded whole."""
    if a.ndim == 0:
        yield a
        return
    stop = a.shape[0] if stop is None else stop
    for s in range(start, stop, chunk_rows):
        yield a[s : min(s + chunk_rows, stop)]


@dataclass
class Checkpoint:
    """A checkpoint folder, headers only.

    Attributes:
        path: the folder.
        config: parsed config.json.
        format: the container of the weights (:class:`~surgery.model.enums.Container`, a ``str`` enum:
            ``"safetensors"`` or ``"pdparams"``); :attr:`fmt` is its :class:`~surgery.io.formats.Format`.
        sharded: an index file lists the shards.
        index_name: ``model.safetensors.index.json`` / ``model_state.pdparams.index.json`` or None.
        index: the parsed index (``{"metadata": {...}, "weight_map": {...}}``) or None.
        weight_files: weight file names in shard order.
        tensors: name → :class:`TensorInfo`, in file order.
        extras: per pdparams file, its non-tensor entries (``StructuredToParameterName@@``).
        np_module: per pdparams file, the numpy module its arrays were pickled with.
        st_metadata: per safetensors file, its ``__metadata__``.
        other_files: every other file (relative paths), carried to the output unchanged.
        warnings: recoverable problems found while reading (tensors missing from the index, ...).
        missing_entries: index entries (name → shard) that no shard holds; :meth:`check_index_complete`
            refuses them, except a tied checkpoint's stale head entry.
        left_out: files in the folder that are not part of the checkpoint (weights the index does not
            list, of the other format, rank files beside whole weights); never copied to an output.
        training_state: optimizer / master-weight / scheduler / trainer-state / rng files (relative
            paths); a write that changes the model drops them unless asked to keep them.
        folder_links: the symbolic links to folders below the folder (followed: their files are in
            ``other_files``); the in-place new version keeps them as links (:mod:`surgery.io.tree`).
        store: the :class:`surgery.io.stores.Store` the folder is in (``path`` is its root); what differs
            between a local folder and object storage is asked of it, not of the path.
        config_file: ``config.json``, or ``model_config.json`` in a folder that has only that (PaddleNLP
            2.x); ``config_prefix`` is where its model arguments sit in it (``init_args.0``) or "".
        config_dir: the folder config.json was read from when it is not ``path`` (a Trainer flex
            ``checkpoint-N/``'s folder above, :func:`surgery.plan.merge_flex.flex_view`), else None.
    """

    path: Path
    config: dict
    format: Container
    sharded: bool
    index_name: str | None
    index: dict | None
    weight_files: list[str]
    tensors: dict[str, TensorInfo]
    extras: dict[str, dict] = field(default_factory=dict)
    np_module: dict[str, str] = field(default_factory=dict)
    st_metadata: dict[str, dict | None] = field(default_factory=dict)
    other_files: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    missing_entries: dict[str, str] = field(default_factory=dict)
    left_out: list[surface.LeftOut] = field(default_factory=list)
    training_state: list[str] = field(default_factory=list)
    config_file: str = "config.json"
    config_prefix: str = ""
    # one Path per weight file for source(): a header of millions of tensors made a Path per tensor
    _file_paths: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)
    folder_links: list[tree.FolderLink] = field(default_factory=list)
    config_dir: Path | None = None
    # where the files are (:mod:`surgery.io.store`): weight files and other files are names relative to it
    store: Store = field(default=None, repr=False, compare=False)  # type: ignore[assignment]

    def __post_init__(self) -> None:
        if self.store is None:  # made by hand (tests): the store of its path
            self.store = stores.store_for(self.path)

    # ------------------------------------------------------------------ opening
    @classmethod
    def open(cls, path: str | Path, *, for_edit: bool = True) -> Checkpoint:
        """Read a checkpoint folder's config, index and weight headers.

        ``path`` may be a URL (``s3://bucket/prefix``, ``hf://org/model``): see :mod:`surgery.io.store`; the
        config, the index and each weight file's header are then read with range requests. ``for_edit``
        False opens a checkpoint only to read its tensors as stored (``diff``): a quantized embedding/head
        and adapter-wrapped names (:func:`surgery.io.surface.refuse_tensors`), which no edit of the
        vocabulary tables can take, are then not refused.

        Raises:
            CheckpointError: missing folder/config/weights, an index naming a missing shard or a tensor a
                shard lacks, a tensor in two shards, corrupt headers or pickles; a failed request to a
                remote store (naming the object).
            UnsafePickleError: a ``.pdparams`` with a global outside the allow-list.
        """
        st = stores.store_for(path)
        if st.on_disk:
            return cls._open(st.root, st, for_edit)
        with (
            st.map_errors()
        ):  # botocore / aiohttp / fsspec / huggingface_hub errors: one line naming the object
            return cls._open(st.root, st, for_edit)

    @classmethod
    def _open(cls, path: Any, st: Store, for_edit: bool = True) -> Checkpoint:
        """:meth:`open` of a ``Path`` or a remote ``UPath`` (the root of store ``st``)."""
        names = _file_names(st)
        if st.on_disk and not _has_whole(names):
            _refuse_flex(path)
        _refuse_not_a_checkpoint(path, names)
        config, config_file, prefix = read_config(path)
        surface.refuse_folder(path, names, config, has_whole=_has_whole(names))
        fmt, index_name, files = cls._find_weights(path, names)
        warnings: list[str] = []
        index = None
        if index_name:
            index = _read_json(path / index_name, index_name, regular.INDEX_LIMIT)
            wm = check_index(index, path / index_name, index_name)
            listed = sorted(set(wm.values()), key=lambda n: (SHARD_RE.match(n) is None, n))
            _check_listed(path, index_name, wm, listed, _unlisted_weights(names, FORMATS[fmt], files, listed))
            unlisted = [f for f in files if f not in listed]
            files = listed
        else:
            unlisted = []
        ckpt = cls(path, config, fmt, index_name is not None, index_name, index, files, {}, warnings=warnings)
        ckpt.store = st
        ckpt.config_file, ckpt.config_prefix = config_file, prefix
        ckpt._read_headers()
        _check_ranks(path, ckpt.tensors)
        if for_edit:
            surface.refuse_tensors(path, config, ckpt.tensors)
        ckpt._check_unlisted_shards(unlisted)
        taken = set(ckpt.weight_files) | {index_name} | set(unlisted)
        ckpt.left_out += _left_out(path, names, ckpt.fmt, taken)
        ckpt.other_files = ckpt._list_other_files()
        return ckpt

    @staticmethod
    def _find_weights(path: Path, names: set[str]) -> tuple[Container, str | None, list[str]]:
        names = {n for n in names if not surface.TRAINING_STATE.match(n)}
        st_shards = sorted(n for n in names if SHARD_RE.match(n) and n.endswith(".safetensors"))
        pd_shards = sorted(n for n in names if SHARD_RE.match(n) and n.endswith(".pdparams"))
        for fmt, shards in ((SAFETENSORS, st_shards), (PDPARAMS, pd_shards)):
            if fmt.index in names:
                return fmt.container, fmt.index, shards
            if fmt.single in names:
                return fmt.container, None, [fmt.single]
        if st_shards or pd_shards:
            idx = ST_INDEX if st_shards else PD_INDEX
            mistaken.refuse_unfinished(path, names)
            raise CheckpointError(
                f"shard files are present but {idx} is missing: an unfinished save (save_pretrained writes "
                "the index after the shards) or a lost index",
                path,
                f"{mistaken.UNFINISHED_FIX}; if the save had finished, restore {idx} (it maps tensor names "
                "to shards)",
            )
        others = sorted(n for n in names if n.endswith(surface.WEIGHT_EXT))
        hint = (
            f" (found {', '.join(others)}, which PaddleNLP/PaddleFormers do not load as a model)"
            if others
            else ""
        )
        refuse_state_only(path)
        mistaken.refuse_foreign(path, names)
        refuse_output_dir(path)
        raise CheckpointError(
            f"no whole-model weights found{hint}",
            path,
            f"tietool reads {ST_SINGLE}, {PD_SINGLE}, or shards with {ST_INDEX} / {PD_INDEX}, as "
            "save_pretrained writes them; save the model with save_pretrained",
        )

    def _read_headers(self) -> None:
        where: dict[str, str] = {}
        blobs: dict[str, tuple[int, int, bytes]] = {}
        if self.fmt is SAFETENSORS and not self.store.on_disk:  # every header in two round trips
            blobs = safetensors_io.fetch_headers([self.path / f for f in self.weight_files])
        for f in self.weight_files:
            p = self.path / f
            header = self.fmt.read_header(p, f, blobs.get(str(p)))
            if self.fmt.has_metadata:
                self.st_metadata[f] = header.metadata
            else:
                self.extras[f] = header.extras or {}
                self.np_module[f] = header.np_module or ""
            for t in header.tensors:
                if t.name in where:
                    raise CheckpointError(
                        f"tensor {t.name!r} is stored in both {where[t.name]} and {f}",
                        self.path,
                        "remove the duplicate and regenerate the index",
                    )
                where[t.name] = f
                self.tensors[t.name] = t
        if self.index is not None:
            index_name, wm = self._index()
            for name, f in wm.items():
                if name not in where:
                    self.missing_entries[name] = f
                elif where[name] != f:
                    raise CheckpointError(
                        f"index maps {name!r} to {f} but it is stored in {where[name]}",
                        self.path / index_name,
                        "regenerate the index",
                    )
            for name, f in where.items():
                if name not in wm:
                    self.warnings.append(
                        f"tensor {name} is in {f} but not in the index; it is kept and listed"
                    )
            del where, wm  # one entry per tensor: freed before the weight_map is made again
            self._share_index_strings()

    def _share_index_strings(self) -> None:
        """Rebuild the index's ``weight_map`` (same entries, same order) on the name and file strings the
        headers hold (``TensorInfo.name``, the shard names of ``weight_files``), so that a checkpoint of
        millions of tensors keeps each name once, not twice (~140 bytes an entry: 220 MB for 1.6 M)."""
        assert self.index is not None  # only called with an index
        wm = self.index["weight_map"]
        shared: dict[str, str] = {}
        for name, f in wm.items():
            t = self.tensors.get(name)
            shared[t.name if t is not None else name] = t.file if t is not None else f
        self.index["weight_map"] = shared

    def check_index_complete(self, tied_head: str | None) -> None:
        """An index entry no shard holds means a missing tensor: the checkpoint is incomplete. The one
        exception is ``tied_head``, the LM head of a checkpoint that is tied and has no head in its files
        (an entry left over from an earlier tie): it is dropped from the output index with a warning.

        Args:
            tied_head: the head's name when the detection found the checkpoint tied with no head stored,
                else None.

        Raises:
            CheckpointError: naming the index, the first missing tensor and the shard it names.
        """
        missing = {n: f for n, f in self.missing_entries.items() if n != tied_head}
        if missing:
            name, f = next(iter(missing.items()))
            more = f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""
            raise CheckpointError(
                f"index maps {name} to {f}, but {f} holds no such tensor{more}: the checkpoint is incomplete",
                self.path / (self.index_name or ""),
                f"copy the complete {f} from where the checkpoint came from (or re-export it); if {name} was "
                "removed on purpose, remove its entry from the index",
            )
        if tied_head in self.missing_entries:
            msg = (
                f"index entry {tied_head} → {self.missing_entries[tied_head]} is stale: the checkpoint is "
                "tied and no shard holds the head; it is left out of the output index"
            )
            if msg not in self.warnings:
                self.warnings.append(msg)

    def _check_unlisted_shards(self, unlisted: list[str]) -> None:
        """Shard files the index does not name are not part of the checkpoint; but an index entry that points
        to the wrong shard while an unlisted one holds the tensor is an error, not a stale entry."""
        for f in unlisted:
            p = self.path / f
            try:
                names = [t.name for t in self.fmt.read_header(p, f).tensors]
            except CheckpointError:
                names = []
            index_name, wm = self._index()
            moved = [n for n in names if n in wm and n not in self.tensors]
            if moved:
                raise CheckpointError(
                    f"index maps {moved[0]} to {wm[moved[0]]}, but it is stored in {f}, which the index does "
                    "not name",
                    self.path / index_name,
                    "regenerate the index",
                )
            self.left_out.append(surface.LeftOut(f, surface.LeftOutReason.NOT_IN_INDEX, p.stat().st_size))

    def _index(self) -> tuple[str, dict[str, str]]:
        """The index file name and its weight_map (name → shard file), for a checkpoint with an index."""
        if self.index_name is None or self.index is None:
            raise CheckpointError("no index file", self.path, "only a sharded checkpoint has an index")
        return self.index_name, self.index["weight_map"]

    def _list_other_files(self) -> list[str]:
        """Files an output carries unchanged; training state is listed apart (``training_state``). Locally,
        symbolic links to files and folders are followed (:func:`surgery.io.tree.walk`, which refuses dangling
        links, loops, special files and unreadable subfolders by name; the folder links are kept in
        ``folder_links``).

        Raises:
            CheckpointError: as :func:`surgery.io.tree.walk`; a file that cannot be read (permission): refused
                by name now, before any output is written, rather than failing the copy half-way
                (:func:`surgery.io.regular.require_regular`).
        """
        skip = set(self.weight_files) | {self.index_name, REPORT_NAME} | {x.file for x in self.left_out}
        local = self.store.on_disk
        if not local:  # object storage has no links
            rels = [p.relative_to(self.path).as_posix() for p in sorted(self.path.rglob("*")) if p.is_file()]
        else:
            rels, self.folder_links = tree.walk(self.path)
        out = []
        for rel in rels:
            if rel in skip:
                continue
            if local:
                require_regular(self.path / rel, rel)
            if surface.TRAINING_STATE.match(rel.rsplit("/", 1)[-1]) or surface.TRAINER_FLEX_STATE.match(rel):
                self.training_state.append(rel)
            else:
                out.append(rel)
        return out

    # ------------------------------------------------------------------ facts
    @property
    def local(self) -> bool:
        """The folder is in this machine's file system (its store is ``on_disk``): numpy can map its files,
        a library can open them."""
        return bool(self.store.on_disk)

    @property
    def fmt(self) -> Format:
        """The :class:`~surgery.io.formats.Format` of the container (file names, readers, writer)."""
        return FORMATS[self.format]

    @property
    def bf16_as_u16(self) -> bool:
        """U16 / uint16 tensors hold bfloat16 bits (Paddle stores bf16 that way).

        True for every ``.pdparams`` (numpy has no bf16; paddle pickles bf16 as uint16) and for safetensors
        whose config says ``bfloat16`` (``torch_dtype``/``dtype``, also in ``text_config``).
        """
        if self.fmt.bf16_bits:
            return True
        cfgs = [self.config, self.config.get("text_config") or {}]
        return any(
            str(c.get(k, "")).endswith("bfloat16")
            for c in cfgs
            if isinstance(c, dict)
            for k in ("torch_dtype", "dtype")
        )

    def logical_dtype(self, t: TensorInfo) -> str:
        """What the values mean: ``float32``, ``float16``, ``bfloat16`` (also for bf16 stored as U16)."""
        lg = t.st_dtype.logical
        return "bfloat16" if lg == "uint16" and self.bf16_as_u16 else lg

    def load(self, name: str) -> np.ndarray:
        """Raw stored array of tensor ``name`` (bf16 as ``uint16`` bits), reading only its bytes."""
        t = self.tensors[name]
        return self.fmt.read_array(self.path / t.file, t)

    def iter_rows(self, name: str, chunk_rows: int, start: int = 0, stop: int | None = None):
        """Yield rows ``start:stop`` of tensor ``name`` in chunks of ``chunk_rows`` rows (stored dtype), read
        into one reused buffer: memory stays at one chunk however large the tensor (no page-cache mapping
        kept resident). Each chunk is valid until the next one is requested.

        Raises:
            RefusedError: a packed sub-byte dtype (``F4``, ``F6_*``): no array holds its elements.
        """
        t = self.tensors[name]
        require_array(t, self.path / t.file)
        if t.fortran or t.inline is not None or t.pieces is not None or t.nbytes == 0 or len(t.shape) < 1:
            yield from array_rows(self.load(name), chunk_rows, start, stop)
            return
        rows = t.shape[0]
        stop = rows if stop is None else stop
        row_bytes = t.nbytes // rows
        dt = self.fmt.row_dtype(t)
        buf = bytearray(row_bytes * max(1, min(chunk_rows, stop - start)))
        with self.store.open_read(t.file, block_size=None) as f:  # remote: one request per chunk
            f.seek(t.offset + start * row_bytes)
            for s in range(start, stop, chunk_rows):
                n = min(chunk_rows, stop - s) * row_bytes
                view = memoryview(buf)[:n]
                if f.readinto(view) != n:
                    raise CheckpointError(
                        f"tensor {name!r} is truncated",
                        self.path / t.file,
                        "re-download or re-export the file",
                    )
                yield np.frombuffer(view, dtype=dt).reshape((n // row_bytes,) + tuple(t.shape[1:]))

    def source(self, name: str) -> safetensors_io.Source:
        """Where the stored bytes of ``name`` are, for a byte-range copy."""
        t = self.tensors[name]
        p = self._file_paths.get(t.file)
        if p is None:
            p = self._file_paths[t.file] = self.path / t.file
        return self.fmt.source(p, t)

    @property
    def total_bytes(self) -> int:
        return sum(t.nbytes for t in self.tensors.values())

    @property
    def total_parameters(self) -> int:
        return sum(t.numel for t in self.tensors.values())


def refuse_state_only(path: Path) -> None:
    """Raise CheckpointError when ``path`` holds a Trainer checkpoint's training-state folders
    (``optimizer_state/``, ``master_weight/``) but no weights: a flex ``checkpoint-N/`` whose
    ``model_state/`` is missing (named, with the fix), not a folder of unknown weights; or a save still
    being written (:func:`surgery.io.mistaken.refuse_unfinished`)."""
    mistaken.refuse_unfinished(path)
    state = [n for n in ("master_weight", "optimizer_state") if (path / n).is_dir()]
    if state and not (path / "model_state").exists():
        raise CheckpointError(
            f"a Trainer checkpoint-N/ with {' and '.join(n + '/' for n in state)} but no model_state/ "
            "(the weights of the flex checkpoint)",
            path,
            "copy the model_state/ folder the training run saved beside it (its <id>.metadata and every "
            "<rank>_<id>.distcp)",
        )
