"""Execute a plan: write the output checkpoint into a temporary folder beside ``--out``, then rename it
into place. The input is only read.

* weight files no tensor of the plan touches (and the other files) are copied by the kernel
  (``os.copy_file_range``), several at a time in threads while the touched files are rewritten, or, with
  ``link=True``, hard-linked;
* touched files are streamed by their format (:attr:`surgery.io.formats.FileFormat.write`, one signature
  for every container): unchanged tensors are copied by byte range, never decoded; only new data is in
  memory, made by its recipe when it is written (:class:`surgery.io.made.Made`, one memo per write), one
  tensor (or one alias group) at a time; every file is then read back by the same format's ``check``;
* shards left empty are removed and the rest renumbered; the index (``weight_map``, ``total_size``) is
  rewritten to match exactly what was written;
* config keys are set, every other file is copied unchanged, and ``tietool-report.json`` is added.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, Protocol

from ..io import stores, surface, tree
from ..io.checkpoint import Checkpoint
from ..io.configfile import apply_config_sets, read_config_file
from ..io.formats import Format, PickleMeta, Row, Rows, format_of
from ..io.made import Made, Memo
from ..io.readback import Planned, PlannedView, check_index_data, check_json_file
from ..io.safetensors_io import Source
from ..plan import recipes
from ..plan.plan import NEW_SHARD, FlexFolders, OutTensor, Plan, Reshard
from .copy import Copier, Reporting, copy_file
from .edits import json_bytes, write_edited
from .flex_edit import write_flex_edit
from .layout import Entry, KeepFilesLayout, ReshardLayout, entry_nbytes, keep_files, reshard
from .publish import JSON_STYLE, publish, write_json
from .remote import execute_remote
from .training_state import write_pdopt


class ReportDraft(Protocol):
    """The report handed to :func:`execute` (:class:`surgery.report.Draft`)."""

    def with_files(self, facts: dict) -> dict:
        """The complete report, given the written-file facts."""
        ...


def execute(
    plan: Plan,
    out: str | Path,
    link: bool = False,
    progress: Callable[[str, int], None] | None = None,
    report: ReportDraft | None = None,
    keep_training_state: bool = False,
    keep_folder_links: bool = False,
) -> dict:
    """Write the output checkpoint of ``plan`` to ``out`` atomically.

    Args:
        out: the output folder (must not exist, or be empty; checked once by the caller,
            :func:`surgery.run.run` through :func:`surgery.write.publish.check_output_path`).
        link: hard-link untouched weight files instead of copying them (a later in-place edit of a
            linked file would change both; tietool rewrites files).
        progress: called with (output file name, bytes) as tensor bytes are written: by the copy threads
            as they copy (a whole file's share of its tensor bytes, :func:`_scaled_advance`), and in rewritten
            files per tensor and per step within one (:class:`Reporting`); the calls add up to
            ``plan.output_bytes`` exactly. Must be thread-safe (rich's ``Progress.update`` is).
        report: the run's report (:class:`surgery.report.Draft`), made complete from the written-file
            facts (:meth:`ReportDraft.with_files`) and written as ``tietool-report.json`` inside the
            temporary folder, so a finished output always has it.
        keep_training_state: keep the training state files though the plan changes the model
            (:func:`surgery.io.surface.output_left_out`).
        keep_folder_links: a symbolic link to a folder in the input stays the same link in the output
            when the output holds every file below it unchanged (the in-place new version, which takes the
            input's place, so the link leads where it did); otherwise (and always for ``--out``) the output
            holds a real folder of its files (:func:`_kept_links`).

    The plan's layout decides the files: :class:`~surgery.plan.plan.KeepFiles` (an edit) here;
    :class:`~surgery.plan.plan.Reshard` (``convert``, ``merge``; nothing kept by file) by :func:`write_new`;
    :class:`~surgery.plan.plan.FlexFolders` (a Trainer flex checkpoint kept resumable) by
    :func:`surgery.write.flex_edit.write_flex_edit`.

    Returns:
        the report (or the facts when ``report`` is None).

    Raises:
        OutputError: the output cannot be written (disk full, permissions); nothing is left behind.
    """
    made = None if report is None else report.with_files
    if isinstance(plan.layout, Reshard):
        return write_new(plan, out, made, progress)
    if isinstance(plan.layout, FlexFolders):  # a Trainer flex checkpoint kept one (--keep-training-state)
        return publish(Path(out), lambda tmp: write_flex_edit(plan, tmp), made)
    if not stores.is_local(out):  # object storage: staged here, then published in order

        def staged(tmp: Path, copier: Any) -> dict:
            return _write_all(plan, tmp, False, progress, keep_training_state, copier)

        return execute_remote(plan, out, staged, progress, made)

    def local(tmp: Path) -> dict:
        return _write_all(plan, tmp, link, progress, keep_training_state, keep_folder_links=keep_folder_links)

    return publish(Path(out), local, made)


def _write_all(
    plan: Plan,
    tmp: Path,
    link: bool,
    progress,
    keep_training_state: bool = False,
    copier: Any = None,
    *,
    keep_folder_links: bool = False,
) -> dict:
    """Write every output file of ``plan`` into ``tmp``, read the weight files back, set the config keys.

    ``copier`` (default: a :class:`Copier` into ``tmp``) takes the whole-file copies; one that defers them
    (a remote output's, :mod:`surgery.write.remote`) leaves them out of ``tmp`` and of the read-back.

    Returns:
        the written-file facts (:func:`execute`).

    Raises:
        UsageError: the plan leaves no tensor (a bug).
        OutputError: a file does not read back as planned.
        OSError: a write fails.
    """
    ckpt = plan.ckpt
    left_out = surface.output_left_out(
        ckpt.path, ckpt.left_out, ckpt.training_state, plan.changed, keep_training_state
    )
    carried = [
        f for f in ckpt.other_files + [x.file for x in left_out if x.kept] if f not in plan.training_edit
    ]
    lay = keep_files(plan)
    total_size = sum(entry_nbytes(ckpt, e) for f in lay.kept for e in lay.entries[f])
    kept_links = _kept_links(plan, carried) if keep_folder_links else []
    files_report = _write_weight_files(plan, tmp, lay, carried, link, progress, copier, kept_links)
    files_report["folder_links"] = _folder_link_facts(ckpt.folder_links, kept_links)
    if ckpt.sharded and ckpt.index is not None and ckpt.index_name is not None:
        # one entry per tensor: made only now, not held through the weight writes nor the read-back
        weight_map = {e.name: lay.rename[f] for f in lay.kept for e in lay.entries[f]}
        _write_index(ckpt.index, tmp / ckpt.index_name, weight_map, total_size)
        del weight_map
    deferred = set() if copier is None else {lay.rename[f] for f in lay.kept if f not in lay.rewrite}
    _read_back(plan, tmp, {lay.rename[f]: (f, lay.entries[f]) for f in lay.kept}, lay.rewrite, deferred)
    _write_configs(plan, tmp)
    _write_tokenizer_files(plan, tmp, files_report)
    _write_training_state(plan, tmp, files_report)
    return {
        "files": files_report,
        "total_size": total_size,
        "weight_files": [lay.rename[f] for f in lay.kept],
        "rename": {f: r for f, r in lay.rename.items() if f != r},
        "left_out": [x.as_dict() for x in left_out],
    }


def _write_weight_files(
    plan: Plan,
    tmp: Path,
    lay: KeepFilesLayout,
    carried: list[str],
    link: bool,
    progress,
    copier: Any = None,
    kept_links: list[tree.FolderLink] | None = None,
) -> dict[str, Any]:
    """Write the weight files and the carried files (all but the configs) into ``tmp``: untouched files
    are copied in threads (or linked) while the touched ones are rewritten here.

    Returns:
        the output names by what was done to them (``copied``, ``linked``, ``rewritten``, ``written``)
        and the input files ``removed``.

    Raises:
        OSError: a copy or a rewrite failed; the copies still running are stopped first.
    """
    files_report: dict[str, list[str]] = {
        "copied": [],
        "linked": [],
        "rewritten": [],
        "written": [],
        "removed": [f for f in plan.ckpt.weight_files if f not in lay.kept],
    }
    ckpt = plan.ckpt
    memo = Memo(lambda r, data: recipes.make(r, ckpt, data))  # one for the whole write
    copier = Copier(progress) if copier is None else copier
    try:
        # untouched files first, into the pool; then the rewrites here while those copies run
        _start_copies(plan, tmp, lay, carried, link, progress, copier, files_report, kept_links or [])
        for f in lay.rewrite:
            _rewrite_reporting(plan, f, lay.entries[f], tmp / lay.rename[f], memo, progress)
            files_report["written" if f == NEW_SHARD else "rewritten"].append(lay.rename[f])
            # free new arrays no longer needed by later files
            later = lay.kept[lay.kept.index(f) + 1 :]
            needed = [e.new.recipe for g in later for e in lay.entries[g] if e.new is not None]
            memo.keep_only(needed, recipes.parts)
            copier.poll()
        copier.poll(block=True)
    finally:
        copier.close()
    return files_report


def _start_copies(
    plan: Plan,
    tmp: Path,
    lay: KeepFilesLayout,
    carried: list[str],
    link: bool,
    progress,
    copier: Copier,
    files_report: dict[str, Any],
    kept_links: list[tree.FolderLink],
) -> None:
    """Hard-link (``link``, where the file system can) or hand to ``copier`` the kept weight files that are
    not rewritten, then the carried files (less the configs :func:`_write_configs` writes), each by the one
    rule of :func:`surgery.io.tree.place_kept` (the files below a folder link of ``kept_links`` are that
    link, made once), recording each in ``files_report``."""
    ckpt = plan.ckpt
    for f in lay.kept:
        if f in lay.rewrite:
            continue
        src, dst = ckpt.path / f, tmp / lay.rename[f]
        tensor_bytes = sum(entry_nbytes(ckpt, e) for e in lay.entries[f])
        if tree.place_kept(src, dst, ckpt.path, (), link) is tree.Placed.LINKED:
            files_report["linked"].append(lay.rename[f])
            if progress:
                progress(lay.rename[f], tensor_bytes)
        else:
            copier.submit(src, dst, lay.rename[f], tensor_bytes)
            files_report["copied"].append(lay.rename[f])
    config_files = _config_files(plan) | _tokenizer_files(plan)
    for fl in kept_links:
        (tmp / fl.rel).parent.mkdir(parents=True, exist_ok=True)
        os.symlink(fl.target, tmp / fl.rel)
        files_report.setdefault("symlinked", []).append(fl.rel)
    below = {f for fl in kept_links for f in fl.files}
    carried_set = set(carried)
    for rel in carried:
        if rel in config_files or rel in below:
            continue
        src, d = ckpt.path / rel, tmp / rel
        d.parent.mkdir(parents=True, exist_ok=True)  # a subfolder: a folder of links (or copies) too
        placed = tree.place_kept(src, d, ckpt.path, carried_set, link)
        if placed is tree.Placed.COPY:
            copier.submit(src, d, None)
        files_report.setdefault(placed.value, []).append(rel)


def _config_files(plan: Plan) -> set[str]:
    """The files :func:`_write_configs` writes (never copied)."""
    return {"config.json", plan.ckpt.config_file} | {c[0] for c in plan.config_set}


def _tokenizer_files(plan: Plan) -> set[str]:
    """The tokenizer files the plan's edit writes or drops (never copied, linked or kept as a folder
    link)."""
    return set(plan.tokenizer.files) | set(plan.tokenizer.dropped) if plan.tokenizer is not None else set()


def _write_tokenizer_files(plan: Plan, tmp: Path, files_report: dict[str, Any]) -> None:
    """Write the new bytes of every tokenizer file the plan's edit changes (``files_report["edited"]``,
    present only for a plan with an edit), each read back; the other tokenizer files were carried as they
    are."""
    if plan.tokenizer is None:
        return
    files_report["edited"] = sorted(plan.tokenizer.files)
    local = stores.is_local(plan.ckpt.path)
    for rel, data in sorted(plan.tokenizer.files.items()):
        write_edited(tmp, rel, data, plan.ckpt.path / rel if local else None)  # the mode it replaces


def _write_training_state(plan: Plan, tmp: Path, files_report: dict[str, Any]) -> None:
    """Write each optimizer file the plan resizes (``--keep-training-state``), in place of the copy it would
    otherwise be; ``files_report["training_state_resized"]`` lists, per file, the accumulators resized."""
    if not plan.training_edit:
        return
    done = files_report["training_state_resized"] = {}
    for rel, edit in sorted(plan.training_edit.items()):
        dst = tmp / rel
        dst.parent.mkdir(parents=True, exist_ok=True)
        done[rel] = write_pdopt(plan.ckpt.path, edit, dst, tmp)
        shutil.copymode(plan.ckpt.path / rel, dst)


def _kept_links(plan: Plan, carried: list[str]) -> list[tree.FolderLink]:
    """The input's folder links an in-place new version keeps as links: those whose every file is carried
    unchanged (none is a config file the run writes, none is training state the run drops), outermost
    first (a link below a kept one is part of it)."""
    unchanged = set(carried) - _config_files(plan) - _tokenizer_files(plan)
    kept: list[tree.FolderLink] = []
    for fl in plan.ckpt.folder_links:
        if any(fl.rel.startswith(k.rel + "/") for k in kept):
            continue
        if all(f in unchanged for f in fl.files):
            kept.append(fl)
    return kept


def _folder_link_facts(links: list[tree.FolderLink], kept: list[tree.FolderLink]) -> list[dict]:
    """The report's ``files.folder_links``: each symbolic link to a folder in the input, and whether the
    output keeps it as the same link (``kept: true``) or holds a real folder of its files."""
    inside = [k.rel for k in kept]
    return [
        {**fl.as_dict(), "kept": fl in kept}
        for fl in links
        if not any(fl.rel.startswith(r + "/") for r in inside)
    ]


def _write_index(index: dict, path: Path, weight_map: dict[str, str], total_size: int) -> None:
    """Write the input's ``index`` to ``path`` with ``total_size`` and the ``weight_map`` (sorted by name)
    of the output."""
    write_json(path, _index_data(index, weight_map, total_size))


def _index_data(index: dict, weight_map: dict[str, str], total_size: int) -> dict:
    """The input's ``index`` with ``total_size`` and ``weight_map`` (sorted by name): what
    :func:`_write_index` writes and the read-back expects."""
    index = dict(index)
    meta = dict(index.get("metadata") or {})
    meta["total_size"] = total_size
    index["metadata"] = meta
    index["weight_map"] = {k: weight_map[k] for k in sorted(weight_map)}  # no tuple per entry
    return index


def _rewrite_reporting(plan: Plan, f: str, entries: list[Entry], dst: Path, memo: Memo, progress) -> None:
    """:func:`_rewrite` of output file ``dst`` (input file ``f``), telling ``progress(name, bytes)`` the
    bytes of each tensor as they are written, and at the end what the file's tensors count beyond that
    (aliases of one storage in a ``.pdparams`` are written once but counted per name, as
    ``Plan.output_bytes`` counts them), so that the file reports exactly its tensor bytes."""
    if progress is None:
        _rewrite(plan, f, entries, dst, memo)
        return
    name, sent = dst.name, 0

    def advance(n: int) -> None:
        nonlocal sent
        sent += n
        progress(name, n)

    _rewrite(plan, f, entries, dst, memo, advance)
    rest = sum(entry_nbytes(plan.ckpt, e) for e in entries) - sent
    if rest:
        progress(name, rest)


def _rewrite(plan: Plan, f: str, entries: list[Entry], dst: Path, memo: Memo, advance=None) -> None:
    """Write output file ``dst`` with ``entries`` (input file ``f``, or ``NEW_SHARD``) by the checkpoint's
    format (:attr:`~surgery.io.formats.FileFormat.write`): unchanged tensors by byte range from the
    input, new ones made by their recipe when written (:class:`~surgery.io.made.Made`, through ``memo``);
    ``advance(bytes)`` (if given) is told the tensor bytes as they are written (:class:`Reporting`).

    Raises:
        OSError: the write fails.
    """
    ckpt = plan.ckpt
    fmt = ckpt.fmt

    def row(e: Entry) -> Row:
        nt = e.new
        src = ckpt.source(e.name) if nt is None else Made(nt.recipe, nt.shape, nt.nbytes, memo)
        src = src if advance is None else Reporting(src, advance)
        return Row(e.name, fmt.file_dtype(e.dtype), e.shape, src, e.storage, e.fortran)

    fmt.write(dst, Rows(entries, row), _file_meta(plan, f, entries, rewritten=True))


def _file_meta(plan: Plan, f: str, entries: Sequence[Entry], rewritten: bool) -> Any:
    """What output file ``f`` (an input file or ``NEW_SHARD``) holds besides its tensors, as its format
    takes it: a safetensors ``__metadata__`` (:func:`_st_metadata`), or a ``.pdparams``'s extras and numpy
    module (:class:`~surgery.io.formats.PickleMeta`): a rewritten file's ``StructuredToParameterName@@``
    loses the dropped names and names each added tensor of ``entries`` it lacks."""
    ckpt = plan.ckpt
    if ckpt.fmt.has_metadata:
        meta = _st_metadata(plan, f, rewritten)
        stored = {e.name for e in entries}
        # a ``{dropped: kept}`` record never names a tensor its own file stores (untie's new head)
        kept = {k: v for k, v in (meta or {}).items() if k not in stored}
        return kept or None
    extras = dict(ckpt.extras.get(f) or {})
    s2p = extras.get("StructuredToParameterName@@")
    if rewritten and isinstance(s2p, dict):
        extras["StructuredToParameterName@@"] = {k: v for k, v in s2p.items() if k not in plan.drop}
        names = {e.name for e in entries}
        for nt in plan.add:
            if nt.name in names and nt.name not in s2p:
                extras["StructuredToParameterName@@"][nt.name] = nt.name
    return PickleMeta(extras, ckpt.np_module.get(f, "numpy.core.multiarray"))


def _st_metadata(plan: Plan, f: str, rewritten: bool) -> dict | None:
    """The ``__metadata__`` of output file ``f``: the input's, and in a rewritten file each dropped name
    recorded as ``{dropped: kept}``, as safetensors' own ``save_model`` does for shared tensors. A new
    shard carries what every input shard agrees on (``{"format": "pt"}`` in files PaddleFormers and
    ``save_pretrained`` write), so that it reads like its siblings."""
    ckpt = plan.ckpt
    if f == NEW_SHARD:
        metas = [dict(ckpt.st_metadata.get(g) or {}) for g in ckpt.weight_files]
        meta = {k: v for k, v in metas[0].items() if all(m.get(k) == v for m in metas)} if metas else {}
    else:
        meta = dict(ckpt.st_metadata.get(f) or {})
    if rewritten:
        meta.update(plan.metadata)
        for k in plan.metadata_drop:
            meta.pop(k, None)
    return meta or None


def _read_back(
    plan: Plan,
    tmp: Path,
    out_files: dict[str, tuple[str, list]],
    rewritten: list[str],
    deferred: frozenset[str] | set[str] = frozenset(),
) -> None:
    """Check every output weight file (and the index) against what was planned; see :mod:`.readback`.

    ``out_files`` maps each output file name to (its input file or ``NEW_SHARD``, its entries); the files
    in ``deferred`` are not in ``tmp`` (copied later, whole, by a remote output) and only the index is
    checked against them.

    Raises:
        OutputError: a file does not read back as planned.
    """
    ckpt = plan.ckpt
    shards: dict[str, Sequence[Planned]] = {}
    for out_name, (f, entries) in out_files.items():
        planned = PlannedView(
            entries, lambda e: Planned(e.name, e.dtype, tuple(e.shape), entry_nbytes(ckpt, e))
        )
        shards[out_name] = planned
        if out_name in deferred:
            continue
        ckpt.fmt.check(tmp / out_name, planned, _file_meta(plan, f, entries, rewritten=f in rewritten))
    if ckpt.sharded and ckpt.index_name and ckpt.index is not None:
        # the index tietool wrote, made again from the planned shards: byte for byte what is on disk
        total = sum(p.nbytes for ps in shards.values() for p in ps)
        expected = dict(_index_data(ckpt.index, {}, total))
        expected["weight_map"] = _SortedMap(shards)
        check_json_file(tmp / ckpt.index_name, expected, JSON_STYLE)


class _SortedMap(dict):
    """The output ``weight_map`` (name → output file, sorted by name, as :func:`_index_data` makes it) for
    the JSON encoder to read entry by entry: the sorted names and, with more than one shard, a name → file
    dict; not the second dict of sorted pairs the index itself took. Only ``len`` and ``items`` (what
    ``json``'s Python encoder, the one ``indent`` selects, reads) are meaningful."""

    def __init__(self, shards: dict[str, Sequence[Planned]]) -> None:
        super().__init__()
        self._names = sorted(p.name for ps in shards.values() for p in ps)
        only = next(iter(shards)) if len(shards) == 1 else None
        self._file = {} if only is not None else {p.name: f for f, ps in shards.items() for p in ps}
        self._only = only

    def __len__(self) -> int:
        return len(self._names)

    def __bool__(self) -> bool:
        return bool(self._names)

    def items(self) -> Iterator[tuple[str, str]]:  # type: ignore[override]
        if self._only is not None:
            return ((n, self._only) for n in self._names)
        return ((n, self._file[n]) for n in self._names)


def _write_configs(plan: Plan, tmp: Path) -> None:
    """Write each config file the plan sets keys in (read back byte for byte); copy the others."""
    ckpt = plan.ckpt
    by_file: dict[str, list[tuple[str, Any]]] = {ckpt.config_file: []}
    for file, key, value in plan.config_set:
        if file == "config.json" and ckpt.config_file != "config.json":  # only model_config.json: its args
            file, key = ckpt.config_file, f"{ckpt.config_prefix}.{key}".lstrip(".")
        by_file.setdefault(file, []).append((key, value))
    for file, sets in by_file.items():
        src = plan.ckpt.path / file
        data = plan.ckpt.config if file == "config.json" else read_config_file(src)
        data = json.loads(json.dumps(data))
        if apply_config_sets(data, sets):
            write_edited(tmp, file, json_bytes(data), None)
        else:
            copy_file(src, tmp / file)


# ------------------------------------------------------------------ a new checkpoint (convert, merge)


def write_new(
    plan: Plan,
    out: str | Path,
    report: Callable[[dict], dict] | None = None,
    progress: Callable[[str, int], None] | None = None,
) -> dict:
    """Write the new checkpoint of ``plan`` (``convert``, ``merge``: its layout a
    :class:`~surgery.plan.plan.Reshard`) to ``out``, atomically: its tensors laid out
    in shards (:func:`surgery.write.layout.reshard`), each made by its recipe
    (:func:`surgery.plan.recipes.make`, one memo) when it is written, so that one tensor is in memory at a
    time; the index, ``config.json`` and the carried files; every weight file and the index read back with
    the reference readers (:mod:`surgery.io.readback`) before the folder is renamed into place.

    Args:
        out: the output folder (must not exist, or be empty). Checked by the caller against its inputs
            (:func:`surgery.write.publish.check_output_path`).
        report: given the written-file facts, returns the report written as ``tietool-report.json``.
        progress: called with (output file name, bytes) as tensor bytes are written.

    Returns:
        the report (or the facts: ``weight_files``, ``index``, ``total_size``, ``carried``).

    Raises:
        UsageError: no tensors or duplicate names.
        OutputError: the output cannot be written or does not read back; nothing is left behind.
    """
    new = plan.layout
    assert isinstance(new, Reshard), "internal: write_new writes a Reshard layout"
    lay = reshard(new.tensors, new.container, new.max_shard_size)
    return publish(Path(out), lambda tmp: _write_new_files(tmp, plan.source, new, lay, progress), report)


def _write_new_files(
    tmp: Path,
    source: Checkpoint | None,
    new: Reshard,
    lay: ReshardLayout,
    progress: Callable[[str, int], None] | None,
) -> dict:
    """Write the weight files, the index, config.json and the carried files into ``tmp``; read back."""
    fmt, carry = format_of(new.container), new.carry
    memo = Memo(
        lambda r, data: recipes.make(r, source, data), [t.recipe for ts in lay.files.values() for t in ts]
    )
    for fname, ts in lay.files.items():
        fmt.write(tmp / fname, Rows(ts, _new_row(fmt, memo, fname, progress)), _new_meta(fmt, new, ts))
    index = {"metadata": {"total_size": lay.total_size}, "weight_map": lay.weight_map}
    if lay.index is not None:
        write_json(tmp / lay.index, index)
    shards: dict[str, Sequence[Planned]] = {f: PlannedView(ts, _planned_new) for f, ts in lay.files.items()}
    for fname, planned in shards.items():
        fmt.check(tmp / fname, planned, _new_meta(fmt, new, lay.files[fname]))
    if lay.index is not None:
        # the file holds the index written (compared as encoded, never parsed into a second dict), and
        # that index names exactly the planned tensors
        check_json_file(tmp / lay.index, index, JSON_STYLE)
        check_index_data(tmp / lay.index, index, shards)
    write_edited(tmp, "config.json", json_bytes(new.config), None)
    for src, rel in carry:
        (tmp / rel).parent.mkdir(parents=True, exist_ok=True)
        copy_file(src, tmp / rel)
    return {
        "weight_files": list(lay.files),
        "index": lay.index,
        "total_size": lay.total_size,
        "carried": [rel for _, rel in carry],
    }


def _planned_new(t: OutTensor) -> Planned:
    return Planned(t.name, t.dtype, t.shape, t.nbytes)


def _new_row(
    fmt: Format, memo: Memo, fname: str, progress: Callable[[str, int], None] | None
) -> Callable[[OutTensor], Row]:
    """The :class:`~surgery.io.formats.Row` of a tensor of new file ``fname``: its bytes made by its
    recipe when written (:class:`~surgery.io.made.Made`, through the write's ``memo``), told to
    ``progress(fname, bytes)`` as they are written."""

    def row(t: OutTensor) -> Row:
        src: Source = Made(t.recipe, t.shape, t.nbytes, memo)
        if progress is not None:
            src = Reporting(src, lambda n: progress(fname, n))
        return Row(t.name, fmt.file_dtype(t.dtype), t.shape, src)

    return row


def _new_meta(fmt: Format, new: Reshard, ts: list[OutTensor]) -> Any:
    """What new file of ``ts`` holds besides its tensors: the layout's safetensors ``__metadata__``, or a
    ``.pdparams``'s extras (:func:`_file_extras`)."""
    if fmt.has_metadata:
        return new.st_metadata
    return PickleMeta(_file_extras(new.pdparams_extras, {t.name for t in ts}))


def _file_extras(extras: dict[str, Any] | None, names: set[str]) -> dict[str, Any]:
    """``extras`` for one ``.pdparams`` file: ``StructuredToParameterName@@`` keeps its own tensors."""
    if not extras:
        return {}
    out = dict(extras)
    s2p = out.get("StructuredToParameterName@@")
    if isinstance(s2p, dict):
        out["StructuredToParameterName@@"] = {k: v for k, v in s2p.items() if k in names}
    return out
