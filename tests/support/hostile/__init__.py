"""The crafted-hostile corpus (issue 18): inputs an attacker or an unlucky user gives tietool, each with the
exit code every command must give.

Each submodule of this package (``reads``, ``safetensors``, ``pickles``, ``folders``, ...) defines
``CASES: list[Hostile]``; :func:`cases` collects them all, so a new kind of hostile input is a new entry in
one module and nothing else. ``tests/adversarial/test_hostile.py`` builds every case at test time (some are
large or are FIFOs, device links or deep nestings that cannot live in git) and runs it through each of its
commands in a worker child (``adversarial_support.CliWorker``: RLIMIT_AS 2 GB, an alarm per run), then checks:

* the exit code is one of the expected ones (never 70, never a signal, never a hang past ``timeout``);
* a refusal is exactly one ``tietool: error:`` line that names each of ``names`` and says a fix;
* the input is unchanged (type, size, mtime and content of every entry, FIFOs and links included), no
  ``--out`` and no temporary folder is left after a refusal;
* the worker's peak memory stays under ``max_rss`` (1 GiB: "no run over 1 GB on a small input").

Nothing here imports ``tietool``: the inputs are built with our own writers (``adversarial_support``).
"""

from __future__ import annotations

import dataclasses
import importlib
import pkgutil
from collections.abc import Callable, Mapping
from pathlib import Path

# the commands a case runs by default, as ``adversarial_support.command_argv`` spells them
READERS = ("inspect", "tie", "untie", "resize", "verify", "convert")

Codes = int | tuple[int, ...]


@dataclasses.dataclass(frozen=True)
class Hostile:
    """One hostile input.

    Attributes:
        name: unique, ``<kind>-<what>`` (``fifo-config``, ``st-dup-metadata``); the test id.
        kind: the defect class of issue 18 it belongs to (``fifo``, ``json``, ``safetensors``, ``pickle``,
            ``folder``, ...), so a report can say "every kind".
        build: ``build(dest)`` creates the input under the folder ``dest`` (which exists and is empty) and
            returns the CKPT argument (usually ``dest / "ckpt"``).
        expect: the exit code(s) every command must give, or ``{command: code(s)}`` (commands not in the
            mapping use ``expect["*"]``). ``0`` is allowed only where listed.
        commands: which commands to run (``READERS`` by default; ``merge`` for rank files).
        names: strings the error line must contain (the file concerned, the rule broken).
        timeout: seconds a run may take (issue 18: "no hang over 10 s").
        extra: extra arguments per command (``{"resize": ("--vocab", "256")}``).
        out: ``out(path)`` prepares the ``--out`` path the harness passes before each run (makes it a
            symbolic link, a dangling one, ...); None: ``--out`` does not exist.
        base: ``verify``'s first folder, beside the checkpoint (a name in the case's folder); None: the
            checkpoint itself. A verify exit 7 (differences not explained) is judged by its stdout naming
            ``names`` and one ``tietool: verify:`` line on stderr.
        max_rss: the peak memory (bytes) a run may reach; None: the corpus' limit (``MAX_RSS`` of
            ``test_hostile.py``, 1 GiB). A case of many tensors sets a bound in proportion to its count.
    """

    name: str
    kind: str
    build: Callable[[Path], Path]
    expect: Codes | Mapping[str, Codes]
    commands: tuple[str, ...] = READERS
    names: tuple[str, ...] = ()
    timeout: float = 10.0
    extra: Mapping[str, tuple[str, ...]] = dataclasses.field(default_factory=dict)
    out: Callable[[Path], None] | None = None
    base: str | None = None
    max_rss: int | None = None

    def codes(self, command: str) -> set[int]:
        """The exit codes allowed for ``command``."""
        e = self.expect
        if isinstance(e, Mapping):
            e = e[command] if command in e else e["*"]
        return {e} if isinstance(e, int) else set(e)


def cases() -> list[Hostile]:
    """Every case of every submodule, sorted by name; duplicate names are an error."""
    found: dict[str, Hostile] = {}
    for m in sorted(pkgutil.iter_modules(__path__), key=lambda m: m.name):
        mod = importlib.import_module(f"{__name__}.{m.name}")
        for c in getattr(mod, "CASES", []):
            if c.name in found:
                raise ValueError(f"hostile case {c.name} is defined twice ({m.name})")
            found[c.name] = c
    return [found[n] for n in sorted(found)]
