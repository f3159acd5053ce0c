"""Typed results of the operations. Each is the JSON document the CLI prints with ``--json`` (a ``dict``,
so it serialises as is and older code indexing it keeps working) with typed accessors for the facts a
notebook or pipeline asks for first.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class Totals:
    """Parameters (elements) and bytes of a checkpoint's tensors, as stored."""

    parameters: int
    bytes: int


class Inspection(dict[str, Any]):
    """What :func:`tietool.inspect` found (``tietool inspect --json``).

    Counts are parameters (elements) and bytes as stored; ``vocab_rows`` is the input embedding's row count.
    """

    @property
    def path(self) -> Any:
        """The checkpoint: a ``Path``, or a remote path for a URL (:func:`store.as_path`)."""
        from .io import store  # not at import: ``tietool --help`` imports this module

        return store.as_path(self["path"])

    @property
    def embedding(self) -> str:
        """Name of the input embedding (``[vocab_size, hidden_size]``)."""
        return str(self["embedding"]["name"])

    @property
    def head(self) -> str | None:
        """Name of the LM head when the files hold one, else None."""
        h = self["head"]
        return str(h["name"]) if h.get("present") else None

    @property
    def head_layout(self) -> str | None:
        """``vocab-hidden``, ``hidden-vocab``, ``ambiguous`` (square), or None without a head."""
        return self["head"].get("layout") if self.head else None

    @property
    def tied_by_config(self) -> bool:
        return bool(self["tie"]["config"])

    @property
    def head_values(self) -> str:
        """Head vs embedding: ``exact``, ``transposed``, ``scaled``, ``different``, ``absent``, ``shared``,
        ``no_embedding`` or ``not compared``."""
        return str(self["tie"]["values"])

    @property
    def vocab_rows(self) -> int:
        return int(self["vocab"]["embedding_rows"])

    @property
    def hidden_size(self) -> int:
        return int(self["vocab"]["hidden_size"])

    @property
    def savings_bytes(self) -> int:
        """Bytes ``tie`` would save (0 when it would save nothing; ``savings.why_zero`` says why)."""
        return int(self["savings"]["bytes"])

    @property
    def problems(self) -> list[str]:
        return list(self["problems"])

    @property
    def exit_code(self) -> int:
        """The exit status ``tietool inspect`` ends with: 0, or 3 for a flex checkpoint whose ``.metadata``
        leaves elements of a tensor in no slice (``problems`` says which; ``merge`` refuses it so too)."""
        return int(self.get("exit_code", 0))


class Report(dict[str, Any]):
    """The report of every writing operation (:func:`tietool.tie`, ``untie``, ``resize``, ``convert``,
    ``merge``): the JSON also stored in the output as ``tietool-report.json`` (not for a dry run). Its keys
    differ per operation (as they always did, so readers of the file do not break); the accessors below are
    the fields every operation has, dry run included.

    ``before`` / ``after``: the totals where the JSON has none (``merge``: the rank files' tensors and the
    merged ones, :func:`surgery.report.merge_totals`); otherwise they are read from its ``before`` /
    ``after``.
    """

    def __init__(self, data: Any = (), *, before: Totals | None = None, after: Totals | None = None) -> None:
        super().__init__(data)
        self._before, self._after = before, after

    def _totals(self, key: str) -> Totals:
        given = self._before if key == "before" else self._after
        if given is not None:
            return given
        return Totals(int(self[key]["parameters"]), int(self[key]["bytes"]))

    @property
    def input(self) -> Any:
        """The input folder (a ``Path``, or a remote path for a URL)."""
        from .io import store

        return store.as_path(self["input"])

    @property
    def operation(self) -> str:
        return str(self["operation"])

    @property
    def dry_run(self) -> bool:
        return bool(self["dry_run"])

    @property
    def changed(self) -> bool:
        """The operation changed tensors or config (False: the output is a copy, or nothing was written)."""
        return bool(self["changed"])

    @property
    def output(self) -> Any:
        """The output folder (a ``Path``, or a remote path for a URL), or None."""
        from .io import store

        return store.as_path(self["output"]) if self.get("output") else None

    @property
    def parameters_before(self) -> int:
        return self._totals("before").parameters

    @property
    def parameters_after(self) -> int:
        return self._totals("after").parameters

    @property
    def bytes_before(self) -> int:
        return self._totals("before").bytes

    @property
    def bytes_after(self) -> int:
        return self._totals("after").bytes

    @property
    def backup(self) -> Path | None:
        """In place: where the previous version was kept (None: not in place, or no backup)."""
        ip = self.get("in_place") or {}
        return Path(ip["backup"]) if ip.get("backup") else None
