"""Byte-identity harness for refactors: run every command on every input, record what came out, compare.

    python bench/golden.py capture OUTDIR      # OUTDIR/manifest.json: one record per run
    python bench/golden.py compare BEFORE AFTER  # every differing run; exit 1 if any

``capture`` runs with the interpreter it is run with and whatever ``tietool`` that interpreter imports, so
``PYTHONPATH=/work/wt/NAME-pkg python bench/golden.py capture /tmp/after`` captures that worktree's code.
The inputs are this repository's (the folder above ``bench/``; ``--inputs ROOT`` takes another clone's):
``sample_checkpoints/*``, ``tests/data/fixtures/cases/*``, ``tests/data/cases/*/ckpt`` (with the case's own
command lines from its ``case.json``) and ``tests/data/tp_ranks/*/*`` (merge inputs). Each is copied once
into a temporary folder; in-place runs get a fresh copy of their own.

Every input gets the same matrix of command lines (:func:`matrix`): ``inspect`` (text, ``--json``,
``--no-values``), ``tie`` (``--out``, ``--json``, ``--dry-run``, ``--keep embedding|head``, ``--link``,
``--drop-aliases``), ``untie`` (``--layout auto|vocab-hidden|hidden-vocab``, ``--json``, ``--dry-run``),
``resize`` (sizes from the config's vocabulary size V: V+8 with ``--init mean|zeros|normal`` and a seed,
V+5 without ``--seed``, V-2 with and without ``--force``, ``--pad-to-multiple-of`` with and without
``--vocab``, ``--json``, ``--dry-run``), ``convert`` (``--to`` each of paddleformers, paddlenlp,
safetensors, pdparams; ``--max-shard-size 4096``; ``--json --dry-run``), ``merge`` (``--out``,
``--max-shard-size 4096``, ``--json --dry-run``), in place (tie, untie, resize with a backup, resize
``--no-backup``, resize with CKPT omitted run from inside the folder) and, after every write (``--out``
or in place, not ``--dry-run``; the cases' own command lines too), ``verify IN OUT`` (text; ``--json``
too for the writes marked ``verify``), whatever the write's outcome (so the set of runs does not depend
on the results). A refusal is as much an output as a success: every line runs on every input.
``python bench/golden.py verified CAPTURE`` lists the successful writes whose verify did not exit 0.

Runs go in-process through the real entry point, ``tietool.cli.app.main`` with ``sys.argv`` set (usage
errors then print tietool's one line, as the installed script does), stdout and stderr captured. For each
run the record holds: the exit code; stdout and stderr (normalised text); the input's tree after the run
(input_tree: it must not change); the output folder's tree (every file's relative name, size, mode,
sha256; symlinks by their target); for in-place runs the tree of the folder holding the checkpoint (the
checkpoint, its backup, anything left beside it).

What is normalised, and why (nothing else is; tensor bytes, safetensors headers, index JSON, config.json
and tietool-report.json keys and values are compared exactly):

1. The run's temporary folder (``/tmp/tietool-golden-XXXXXXXX``, a fixed length so rich's 200-column
   wrapping of a long path is the same in every capture) is written ``<TMP>``: in stdout, stderr, file
   names and the text of ``.json`` output files (``tietool-report.json`` names the input and output).
2. The process id in ``.NAME.tietool-tmp-<pid>``, ``.NAME.tietool-new-<pid>-<token>`` and
   ``.NAME.tietool-deleting-<pid>-<token>`` is written ``<PID>`` (all runs share the harness's pid).
3. An in-place run's token (``secrets.token_hex(6)``, in its staging names and the report's
   ``in_place.token``) is written ``<TOKEN>``: the token read from the output's report, replaced where
   it occurs, and any 12-hex-digit tail of a staging name.
4. The backup's time stamp ``NAME.tietool-backup-YYYYmmdd-HHMMSS`` is written ``NAME.tietool-backup-<TIME>``.
5. Not a text normalisation but a fixed source: ``resize`` without ``--seed`` draws its seed from
   ``secrets.randbits(31)`` (surgery/plan/resize.py ``resolve_seed``) and the new rows (``--init mean``
   samples N(mu, 1e-9 C)) depend on it. During every run ``secrets.randbits`` returns values of
   ``random.Random(RUN_ID)``, so the seed, printed and stored in the report, and the rows are compared
   exactly. (A refactor that binds ``randbits`` by ``from secrets import randbits`` escapes this: every
   seedless resize then differs, in the seed first.)

Not normalised but fixed before any run: the environment (``ENV_DROPPED``, ``ENV_SET``: tietool's debug
and test hooks and rich's colour switches removed, ``COLUMNS=80`` since Click wraps ``--help`` to the
terminal), stdout and stderr are not terminals (no progress bar, rich's width 200), and the current folder
of every run is an empty folder of the temporary one (a run with CKPT omitted runs inside its copy).

Not covered: ``verify --logits`` (paddle subprocesses: minutes, and the lead's logits tests cover it),
URLs (moto / HTTP servers: ``tests/**/test_remote*.py``), signals and the recovery of killed runs
(``tests/adversarial/test_inplace*.py``, the hostile harness).

Two captures of the same code compare with zero differences (the check that 1-5 are complete); run
``compare`` on two captures of bccd72e to see it.
"""

from __future__ import annotations

import argparse
import contextlib
import difflib
import hashlib
import io
import json
import os
import random
import re
import secrets
import shutil
import stat
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
SHARD = "4096"  # a --max-shard-size that shards the tiny inputs
#: environment that would change the output, not the code under test: tietool's debug and test hooks, rich's
#: colour switches; Click wraps --help and usage text to the terminal's width, so it is fixed at 80 columns
ENV_DROPPED = (
    "TIETOOL_DEBUG",
    "TIETOOL_INPLACE_PAUSE_AT",
    "FORCE_COLOR",
    "NO_COLOR",
    "TTY_COMPATIBLE",
    "TTY_INTERACTIVE",
)
ENV_SET = {"COLUMNS": "80", "LINES": "25"}
LOADERS = ("paddleformers", "paddlenlp-2.8", "paddlenlp-3", "hf")  # tietool's --loader values

# ------------------------------------------------------------------ inputs


@dataclass
class Input:
    """One input checkpoint: its id (``group:name``), its source folder, its case (for case inputs)."""

    id: str
    src: Path
    case: Path | None = None  # the case folder (ckpt/, ckpt_NAME/, case.json)


def inputs(root: Path) -> list[Input]:
    """Every input folder under ``root``, in a stable order."""
    found: list[Input] = []
    found += [
        Input(f"sample:{p.name}", p) for p in sorted((root / "sample_checkpoints").iterdir()) if p.is_dir()
    ]
    fixtures = root / "tests/data/fixtures/cases"
    found += [Input(f"fixture:{p.name}", p) for p in sorted(fixtures.iterdir()) if p.is_dir()]
    cases = root / "tests/data/cases"
    found += [
        Input(f"case:{p.name}", p / "ckpt", p) for p in sorted(cases.iterdir()) if (p / "case.json").is_file()
    ]
    tp = root / "tests/data/tp_ranks"
    found += [
        Input(f"tp:{v.name}/{p.name}", p)
        for v in sorted(tp.iterdir())
        if v.is_dir()
        for p in sorted(v.iterdir())
        if p.is_dir()
    ]
    return found


def vocab_of(folder: Path) -> int | None:
    """The vocabulary size the config names: ``padded_vocab_size`` or ``vocab_size``, top level first, then
    nested objects breadth first (``text_config``, ``thinker_config.text_config``, ...); None if none."""
    try:
        queue = [json.loads((folder / "config.json").read_text())]
    except (OSError, ValueError):
        return None
    while queue:
        d = queue.pop(0)
        for key in ("padded_vocab_size", "vocab_size"):
            if isinstance(d.get(key), int) and d[key] > 2:
                return int(d[key])
        queue += [v for v in d.values() if isinstance(v, dict)]
    return None


# ------------------------------------------------------------------ the runs


@dataclass
class Run:
    """One command line. ``argv`` may hold ``{in}``, ``{out}``, ``{prev_out}``, ``{ckpt_NAME}``; ``inplace``
    runs get a fresh copy of the input as ``{in}``; ``cwd_in`` runs from inside it."""

    id: str
    argv: list[str]
    inplace: bool = False
    cwd_in: bool = False
    verify: bool = False  # add verify IN OUT (text and --json) after it
    extra: dict[str, str] = field(default_factory=dict)


def matrix(inp: Input) -> list[Run]:
    """The command lines every input gets (see the module docstring)."""
    i, o = "{in}", "{out}"
    runs = [
        Run("inspect/text", ["inspect", i]),
        Run("inspect/--json", ["inspect", i, "--json"]),
        Run("inspect/--no-values", ["inspect", i, "--no-values"]),
        Run("inspect/--no-values--json", ["inspect", i, "--no-values", "--json"]),
        Run("tie/--out", ["tie", i, "--out", o], verify=True),
        Run("tie/--json", ["tie", i, "--out", o, "--json"]),
        Run("tie/--dry-run", ["tie", i, "--out", o, "--dry-run"]),
        Run("tie/--dry-run--json", ["tie", i, "--dry-run", "--json"]),
        Run("tie/--keep-embedding", ["tie", i, "--out", o, "--keep", "embedding"], verify=True),
        Run("tie/--keep-head", ["tie", i, "--out", o, "--keep", "head"], verify=True),
        Run("tie/--drop-aliases", ["tie", i, "--out", o, "--drop-aliases"]),
        Run("tie/--link", ["tie", i, "--out", o, "--link"]),
        Run("untie/--out", ["untie", i, "--out", o], verify=True),
        Run("untie/--json", ["untie", i, "--out", o, "--json"]),
        Run("untie/--dry-run", ["untie", i, "--out", o, "--dry-run"]),
        Run("untie/--dry-run--json", ["untie", i, "--dry-run", "--json"]),
        Run("untie/--layout-vocab-hidden", ["untie", i, "--out", o, "--layout", "vocab-hidden"], verify=True),
        Run("untie/--layout-hidden-vocab", ["untie", i, "--out", o, "--layout", "hidden-vocab"], verify=True),
    ]
    for loader in LOADERS:
        runs += [
            Run(f"inspect/--loader-{loader}--json", ["inspect", i, "--loader", loader, "--json"]),
            Run(f"tie/--loader-{loader}", ["tie", i, "--out", o, "--loader", loader]),
            Run(f"untie/--loader-{loader}", ["untie", i, "--out", o, "--loader", loader]),
        ]
    V = vocab_of(inp.src)
    if V is not None:
        up, r = str(V + 8), ["resize", i, "--out", o]
        runs += [
            Run(f"resize/up{up}-mean", [*r, "--vocab", up, "--seed", "0"], verify=True),
            Run(f"resize/up{up}-zeros", [*r, "--vocab", up, "--init", "zeros"], verify=True),
            Run(f"resize/up{up}-normal", [*r, "--vocab", up, "--init", "normal", "--seed", "7"], verify=True),
            Run(f"resize/up{V + 5}-noseed", [*r, "--vocab", str(V + 5)], verify=True),
            Run(f"resize/up{up}--json", [*r, "--vocab", up, "--seed", "0", "--json"]),
            Run(f"resize/up{up}--dry-run", [*r, "--vocab", up, "--seed", "0", "--dry-run"]),
            Run(
                f"resize/up{up}--dry-run--json",
                ["resize", i, "--vocab", up, "--seed", "0", "--dry-run", "--json"],
            ),
            Run(
                f"resize/up{V + 3}-pad8",
                [*r, "--vocab", str(V + 3), "--pad-to-multiple-of", "8", "--seed", "0"],
                verify=True,
            ),
            Run(f"resize/down{V - 2}", [*r, "--vocab", str(V - 2)]),
            Run(f"resize/down{V - 2}--force", [*r, "--vocab", str(V - 2), "--force"], verify=True),
            Run(f"resize/up{up}--link", [*r, "--vocab", up, "--init", "zeros", "--link"]),
            Run(
                f"resize/up{up}--keep-training-state",
                [*r, "--vocab", up, "--init", "zeros", "--keep-training-state"],
            ),
        ]
    runs += [
        Run(
            "resize/pad16",
            ["resize", i, "--out", o, "--pad-to-multiple-of", "16", "--seed", "0"],
            verify=True,
        )
    ]
    for to in ("paddleformers", "paddlenlp", "safetensors", "pdparams"):
        runs.append(Run(f"convert/--to-{to}", ["convert", i, "--to", to, "--out", o], verify=True))
    runs += [
        Run(
            "convert/--to-safetensors-shard",
            ["convert", i, "--to", "safetensors", "--out", o, "--max-shard-size", SHARD],
        ),
        Run(
            "convert/--to-pdparams-shard",
            ["convert", i, "--to", "pdparams", "--out", o, "--max-shard-size", SHARD],
        ),
        Run(
            "convert/--to-paddleformers--json", ["convert", i, "--to", "paddleformers", "--out", o, "--json"]
        ),
        Run(
            "convert/--to-safetensors--dry-run--json",
            ["convert", i, "--to", "safetensors", "--out", o, "--dry-run", "--json"],
        ),
        Run("merge/--out", ["merge", i, "--out", o], verify=True),
        Run("merge/--shard", ["merge", i, "--out", o, "--max-shard-size", SHARD]),
        Run("merge/--json", ["merge", i, "--out", o, "--json"]),
        Run("merge/--dry-run", ["merge", i, "--out", o, "--dry-run"]),
        Run("merge/--dry-run--json", ["merge", i, "--out", o, "--dry-run", "--json"]),
        Run("convert/--to-paddlenlp--dry-run", ["convert", i, "--to", "paddlenlp", "--out", o, "--dry-run"]),
        Run("inplace/tie", ["tie", i], inplace=True, verify=True),
        Run("inplace/untie--json", ["untie", i, "--json"], inplace=True),
    ]
    if V is not None:
        runs += [
            Run(
                "inplace/resize",
                ["resize", i, "--vocab", str(V + 8), "--seed", "0"],
                inplace=True,
                verify=True,
            ),
            Run(
                "inplace/resize--no-backup",
                ["resize", i, "--vocab", str(V + 8), "--init", "zeros", "--no-backup"],
                inplace=True,
            ),
            Run(
                "inplace/resize-cwd",
                ["resize", "--vocab", str(V + 8), "--init", "zeros"],
                inplace=True,
                cwd_in=True,
            ),
            Run("inplace/resize--dry-run", ["resize", i, "--vocab", str(V + 8), "--dry-run"], inplace=True),
        ]
    return runs


def global_runs(all_inputs: list[Input]) -> list[Run]:
    """Runs of no one input: several folders in one ``inspect``, the usage errors of ``main`` (one line,
    exit 2), ``--help`` of every command and ``--version``. ``{in}`` is the first fixture; ``{many}`` the
    first eight inputs, ``{missing}`` a folder that does not exist."""
    i, o = "{in}", "{out}"
    runs = [
        Run("inspect/many", ["inspect", "{many}"]),
        Run("inspect/many--json", ["inspect", "{many}", "--json"]),
        Run("inspect/missing", ["inspect", "{missing}"]),
        Run("inspect/missing--json", ["inspect", "{missing}", "--json"]),
        Run("usage/version", ["--version"]),
        Run("usage/no-args", []),
        Run("usage/unknown-command", ["frobnicate"]),
        Run("usage/resize-no-vocab", ["resize", i, "--out", o]),
        Run("usage/resize-vocab-0", ["resize", i, "--vocab", "0", "--out", o]),
        Run("usage/resize-vocab-0--json", ["resize", i, "--vocab", "0", "--out", o, "--json"]),
        Run("usage/resize-vocab-text", ["resize", i, "--vocab", "many", "--out", o]),
        Run("usage/resize-seed-negative", ["resize", i, "--vocab", "200", "--seed", "-1", "--out", o]),
        Run("usage/resize-init-bad", ["resize", i, "--vocab", "200", "--init", "ones", "--out", o]),
        Run("usage/tie-keep-bad", ["tie", i, "--keep", "both", "--out", o]),
        Run("usage/untie-layout-bad", ["untie", i, "--layout", "square", "--out", o]),
        Run("usage/tie-loader-bad", ["tie", i, "--loader", "torch", "--out", o]),
        Run("usage/convert-no-to", ["convert", i, "--out", o]),
        Run("usage/convert-to-bad", ["convert", i, "--to", "gguf", "--out", o]),
        Run("usage/convert-no-out", ["convert", i, "--to", "safetensors"]),
        Run(
            "usage/convert-shard-bad",
            ["convert", i, "--to", "safetensors", "--out", o, "--max-shard-size", "big"],
        ),
        Run("usage/merge-no-out", ["merge", i]),
        Run("usage/verify-one-arg", ["verify", i]),
        Run("usage/out-inside-input", ["tie", i, "--out", i + "/sub"]),
        Run("usage/unknown-option", ["inspect", i, "--frobnicate"]),
    ]
    runs += [
        Run(f"usage/help-{c}", [c, "--help"])
        for c in ("inspect", "tie", "untie", "resize", "verify", "convert", "merge")
    ]
    return runs + [Run("usage/help", ["--help"])]


def case_runs(inp: Input) -> list[Run]:
    """The case's own command lines (``case.json``), ``{ckpt}`` being the input, in order."""
    assert inp.case is not None
    spec = json.loads((inp.case / "case.json").read_text())
    runs = []
    for k, cmd in enumerate(spec["commands"]):
        argv = [str(a).replace("{ckpt}", "{in}") for a in cmd["argv"]]
        runs.append(Run(f"case/{k:02d}-{argv[0]}", argv))
    return runs


# ------------------------------------------------------------------ running one command


def run_cli(argv: list[str], cwd: Path, seed_source: random.Random) -> tuple[object, str, str]:
    """``tietool ARGV`` in this process through ``tietool.cli.app.main``; returns (exit, stdout, stderr).
    ``exit`` is the exit code, or ``"raised TYPE: message"`` when an exception escaped ``main``."""
    from tietool.cli import app as cliapp

    out, err = io.StringIO(), io.StringIO()
    old_argv, old_cwd, old_pwd = sys.argv, os.getcwd(), os.environ.get("PWD")
    old_randbits = secrets.randbits
    sys.argv = ["tietool", *argv]
    os.chdir(cwd)
    os.environ["PWD"] = str(cwd)
    secrets.randbits = seed_source.getrandbits  # type: ignore[assignment]  # normalisation 5
    code: object = 0
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                cliapp.main()
            except SystemExit as e:
                code = e.code if isinstance(e.code, int) else (0 if e.code is None else str(e.code))
            except BaseException as e:  # noqa: BLE001 - recorded, not hidden
                code = f"raised {type(e).__name__}: {e}"
    finally:
        secrets.randbits = old_randbits
        sys.argv = old_argv
        os.chdir(old_cwd)
        if old_pwd is None:
            os.environ.pop("PWD", None)
        else:
            os.environ["PWD"] = old_pwd
        cliapp._signal_received, cliapp._announced = None, False
    return code, out.getvalue(), err.getvalue()


class Normaliser:
    """The text normalisations 1-4 of the module docstring."""

    def __init__(self, tmp: Path) -> None:
        self.roots = sorted({str(tmp), os.path.realpath(tmp)}, key=len, reverse=True)
        self.tokens: list[str] = []

    _PID = re.compile(r"(tietool-(?:tmp|new|deleting)-)\d+")
    _TOKEN = re.compile(r"(tietool-(?:new|deleting)-<PID>-)[0-9a-f]{12}")
    _STAMP = re.compile(r"(tietool-backup-)\d{8}-\d{6}")

    def text(self, s: str) -> str:
        for root in self.roots:
            s = s.replace(root, "<TMP>")
        for tok in self.tokens:
            s = s.replace(tok, "<TOKEN>")
        s = self._PID.sub(r"\1<PID>", s)
        s = self._TOKEN.sub(r"\1<TOKEN>", s)
        return self._STAMP.sub(r"\1<TIME>", s)


def tree(
    folder: Path, norm: Normaliser, links: bool = True, reports: dict[str, str] | None = None
) -> dict[str, list] | None:
    """Every file below ``folder``: normalised relative name -> [size, mode, sha256] (a symlink: ["link",
    target]; a folder: ["dir", mode]). ``.json`` files are hashed after the text normalisation, and their
    record says when it changed them; with ``links``, a file with other hard links says "hard-linked"
    (``--link`` and in place share the untouched files' inodes; an input's link count grows with every
    ``--link`` run, so input trees leave it out). The size of a ``.json`` file is that of its normalised
    text. ``reports`` collects the normalised text of every ``tietool-report.json`` (a few KiB each), so
    that ``compare`` can say which key changed. None when ``folder`` does not exist."""
    if not os.path.lexists(folder):
        return None
    files: dict[str, list] = {}
    for dirpath, dirnames, filenames in os.walk(folder):
        dirnames.sort()
        for name in sorted(dirnames) + sorted(filenames):
            p = Path(dirpath) / name
            rel = norm.text(str(p.relative_to(folder)))
            st = os.lstat(p)
            if stat.S_ISLNK(st.st_mode):
                files[rel] = ["link", norm.text(os.readlink(p))]
            elif stat.S_ISDIR(st.st_mode):
                files[rel] = ["dir", oct(st.st_mode & 0o777)]
            else:
                data = p.read_bytes()
                mode = oct(st.st_mode & 0o777)
                if name.endswith(".json"):
                    text = norm.text(data.decode("utf-8", "surrogateescape"))
                    fixed = text.encode("utf-8", "surrogateescape")
                    rec = [len(fixed), mode, hashlib.sha256(fixed).hexdigest()]
                    rec += ["normalised"] if fixed != data else []
                    if reports is not None and name == "tietool-report.json":
                        reports[rel] = text
                else:
                    rec = [len(data), mode, hashlib.sha256(data).hexdigest()]
                if links and st.st_nlink > 1:
                    rec.append("hard-linked")
                files[rel] = rec
    return files


def report_token(folder: Path) -> str | None:
    """An in-place output's token (its report's ``in_place.token``), for normalisation 3."""
    try:
        rep = json.loads((folder / "tietool-report.json").read_text())
        tok = rep.get("in_place", {}).get("token")
        return tok if isinstance(tok, str) and tok else None
    except (OSError, ValueError, AttributeError):
        return None


# ------------------------------------------------------------------ capture


class Capture:
    """Runs every input's runs and collects the records."""

    def __init__(self, root: Path, tmp: Path) -> None:
        self.root, self.tmp = root, tmp
        self.norm = Normaliser(tmp)
        self.records: dict[str, dict] = {}
        self.work = tmp / "cwd"
        self.work.mkdir()

    def one_input(self, inp: Input) -> None:
        slug = re.sub(r"[^A-Za-z0-9_.-]", "_", inp.id)
        base = self.tmp / "in" / slug
        shutil.copytree(inp.case if inp.case else inp.src, base, symlinks=True)
        src = base / "ckpt" if inp.case else base
        extra = {f"{{{p.name}}}": str(p) for p in base.glob("ckpt_*")} if inp.case else {}
        runs = matrix(inp) + (case_runs(inp) if inp.case else [])
        prev = ""
        for run in runs:
            rid = f"{run.id.split('/')[0]}/{inp.id}/{'/'.join(run.id.split('/')[1:])}"
            run_slug = re.sub(r"[^A-Za-z0-9_.-]", "_", run.id)
            out = self.tmp / "out" / slug / run_slug
            out.parent.mkdir(parents=True, exist_ok=True)
            folder = src
            if run.inplace:
                holder = self.tmp / "inplace" / slug / run_slug
                holder.mkdir(parents=True)
                folder = holder / src.name
                shutil.copytree(inp.src, folder, symlinks=True)
            subst = {"{in}": str(folder), "{out}": str(out), "{prev_out}": prev, **extra}
            argv = [_subst(a, subst) for a in run.argv]
            self.record(rid, argv, folder, out, run)
            if "--out" in argv:
                prev = str(out)
            if run.verify or writes(argv, run.inplace):  # the other writes: verify's text form only
                forms = (("", []), ("--json", ["--json"])) if run.verify else (("", []),)
                for suffix, more in forms:
                    vid = f"verify/{inp.id}/{'/'.join(run.id.split('/'))}{suffix}"
                    vid += "" if run.verify else " (after)"  # not to be taken for another write's --json
                    target = folder if run.inplace else out
                    self.record(vid, ["verify", str(src), str(target), *more], src, None, Run(vid, []))
                    self.records[vid]["of"] = rid

    def global_input(self, every: list[Input]) -> None:
        """:func:`global_runs`, on a copy of the first fixture (``{in}``) and of the first eight inputs."""
        base = self.tmp / "in" / "global"
        base.mkdir(parents=True)
        many = []
        for k, inp in enumerate(every[:8]):
            many.append(base / f"{k}-{inp.src.name}")
            shutil.copytree(inp.src, many[-1], symlinks=True)
        first = next(x for x in every if x.id.startswith("fixture:"))
        src = base / first.src.name
        shutil.copytree(first.src, src, symlinks=True)
        for run in global_runs(every):
            out = self.tmp / "out" / "global" / re.sub(r"[^A-Za-z0-9_.-]", "_", run.id)
            out.parent.mkdir(parents=True, exist_ok=True)
            argv: list[str] = []
            for a in run.argv:
                if a == "{many}":
                    argv += [str(p) for p in many]
                else:
                    argv.append(
                        _subst(a, {"{in}": str(src), "{out}": str(out), "{missing}": str(base / "nowhere")})
                    )
            rid = f"{run.id.split('/')[0]}/global/{'/'.join(run.id.split('/')[1:])}"
            self.record(rid, argv, src, out, run)

    def record(self, rid: str, argv: list[str], folder: Path, out: Path | None, run: Run) -> None:
        cwd = folder if run.cwd_in else self.work
        code, stdout, stderr = run_cli(argv, cwd, random.Random(rid))
        norm = self.norm
        tok = report_token(folder) if run.inplace else None
        norm.tokens = [tok] if tok else []
        reports: dict[str, str] = {}
        rec: dict = {
            "argv": [norm.text(a) for a in argv],
            "exit": code,
            "stdout": norm.text(stdout),
            "stderr": norm.text(stderr),
        }
        if run.inplace:
            rec["inplace_tree"] = tree(folder.parent, norm, reports=reports)
        else:
            rec["input_tree"] = tree(folder, norm, links=False)
            if out is not None and "--out" in argv:
                rec["output_tree"] = tree(out, norm, reports=reports)
        if reports:
            rec["reports"] = reports
        norm.tokens = []
        assert rid not in self.records, f"duplicate run id {rid}"
        self.records[rid] = rec


WRITES = ("tie", "untie", "resize", "add-tokens", "convert", "merge")


def writes(argv: list[str], inplace: bool) -> bool:
    """The command line writes a checkpoint (``--out``, or in place), so ``verify IN OUT`` follows it."""
    return bool(argv) and argv[0] in WRITES and "--dry-run" not in argv and ("--out" in argv or inplace)


def _subst(arg: str, values: dict[str, str]) -> str:
    for k, v in values.items():
        arg = arg.replace(k, v)
    return arg


def capture(outdir: Path, root: Path, only: str | None) -> int:
    """Run everything; write ``outdir/manifest.json``."""
    import tietool

    outdir.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    for var in ENV_DROPPED:
        os.environ.pop(var, None)
    os.environ.update(ENV_SET)
    tmp = Path(tempfile.mkdtemp(prefix="tietool-golden-", dir="/tmp"))
    cap = Capture(root, tmp)
    try:
        every = inputs(root)
        if not only or "global" in only:
            cap.global_input(every)
        for inp in every:
            if only and only not in inp.id:
                continue
            t = time.monotonic()
            cap.one_input(inp)
            print(f"{inp.id}: {time.monotonic() - t:.1f} s ({len(cap.records)} runs so far)", file=sys.stderr)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    wall = time.monotonic() - t0
    meta = {
        "tietool": os.path.dirname(tietool.__file__),
        "python": sys.version.split()[0],
        "inputs": str(root),
        "runs": len(cap.records),
        "wall_s": round(wall, 1),
    }
    doc = {"meta": meta, "runs": cap.records}
    (outdir / "manifest.json").write_text(
        encoding="utf-8", data=json.dumps(doc, indent=0, ensure_ascii=False) + "\n"
    )
    print(f"{len(cap.records)} runs in {wall:.0f} s -> {outdir / 'manifest.json'}", file=sys.stderr)
    return 0


# ------------------------------------------------------------------ compare


def _text_diff(a: str, b: str) -> str:
    """The first differing line of two texts, as ``-before`` / ``+after``."""
    lines = [
        line
        for line in difflib.unified_diff(a.splitlines(), b.splitlines(), lineterm="", n=0)
        if line[:1] in "-+" and not line.startswith(("---", "+++"))
    ]
    shown = lines[:4]
    more = f" (+{len(lines) - 4} more lines)" if len(lines) > 4 else ""
    return "; ".join(x[:160] for x in shown) + more


def _paths(a: object, b: object, at: str = "") -> Iterator[str]:
    """The key paths where two parsed JSON values differ (``in_place.backup``, ``files.copied``)."""
    if isinstance(a, dict) and isinstance(b, dict):
        for k in list(a) + [k for k in b if k not in a]:
            if k not in b or k not in a:
                yield f"{at}{k} only {'before' if k in a else 'after'}"
            else:
                yield from _paths(a[k], b[k], f"{at}{k}.")
    elif a != b:
        yield f"{at.rstrip('.')}: {json.dumps(a)[:80]} -> {json.dumps(b)[:80]}"


def _json_diff(a: str, b: str) -> str:
    """The keys and values in which two JSON texts differ, or that only their formatting (or key order)
    does; a plain text diff when either does not parse."""
    try:
        ja, jb = json.loads(a), json.loads(b)
    except ValueError:
        return _text_diff(a, b)
    paths = list(_paths(ja, jb))
    if not paths:
        same_order = json.dumps(ja) == json.dumps(jb)
        return "same keys and values; " + ("formatting differs" if same_order else "key order differs")
    more = f" (+{len(paths) - 6} more)" if len(paths) > 6 else ""
    return "; ".join(paths[:6]) + more


def _tree_diff(a: dict | None, b: dict | None) -> Iterator[str]:
    if a is None or b is None:
        if (a is None) != (b is None):
            state = {True: "missing", False: "present"}
            yield f"folder {state[a is None]} before, {state[b is None]} after"
        return
    for name in sorted(set(a) | set(b)):
        if name not in b:
            yield f"file {name} only before"
        elif name not in a:
            yield f"file {name} only after"
        elif a[name] != b[name]:
            yield f"file {name}: {a[name]} -> {b[name]}"


def differences(ra: dict, rb: dict) -> Iterator[str]:
    """What differs between two records of one run."""
    if ra["exit"] != rb["exit"]:
        yield f"exit {ra['exit']} -> {rb['exit']}"
    for key in ("stdout", "stderr"):
        if ra[key] != rb[key]:
            yield f"{key}: {_text_diff(ra[key], rb[key])}"
    for key in ("input_tree", "output_tree", "inplace_tree"):
        if ra.get(key) != rb.get(key):
            yield from (f"{key}: {d}" for d in _tree_diff(ra.get(key), rb.get(key)))
    a, b = ra.get("reports", {}), rb.get("reports", {})
    for name in sorted(set(a) & set(b)):
        if a[name] != b[name]:
            yield f"report {name}: {_json_diff(a[name], b[name])}"


def compare(before: Path, after: Path) -> int:
    """Print every run that differs (or exists on one side only); 1 if any, else 0."""
    a = json.loads((before / "manifest.json").read_text(encoding="utf-8"))["runs"]
    b = json.loads((after / "manifest.json").read_text(encoding="utf-8"))["runs"]
    ids = list(a) + [k for k in b if k not in a]
    bad = 0
    for rid in ids:
        if rid not in b or rid not in a:
            print(f"{rid}: only {'before' if rid in a else 'after'}")
            bad += 1
            continue
        diffs = list(differences(a[rid], b[rid]))
        if diffs:
            bad += 1
            print(f"{rid}:")
            for d in diffs:
                print(f"    {d}")
    print(f"{bad} of {len(ids)} runs differ", file=sys.stderr)
    return 1 if bad else 0


def verified(capture_dir: Path) -> int:
    """Every write of a capture that succeeded (exit 0) whose ``verify IN OUT`` did not exit 0, with the
    differences verify names; 1 if any (the promise: every write tietool makes, verify explains)."""
    runs = json.loads((capture_dir / "manifest.json").read_text(encoding="utf-8"))["runs"]
    bad = total = 0
    for vid, rec in runs.items():
        of = rec.get("of")
        if not of or vid.endswith("--json") or runs.get(of, {}).get("exit") != 0:
            continue
        total += 1
        if rec["exit"] == 0:
            continue
        bad += 1
        why = [ln for ln in rec["stdout"].splitlines() if ln.startswith("unexplained:")]
        why = why or rec["stderr"].splitlines()[:1]
        print(f"{of}: verify exit {rec['exit']}")
        for line in why[:6]:
            print(f"    {line[:300]}")
        if len(why) > 6:
            print(f"    (+{len(why) - 6} more)")
    print(f"{bad} of {total} successful writes not verified (exit != 0)", file=sys.stderr)
    return 1 if bad else 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    c = sub.add_parser("capture", help="run everything, write OUTDIR/manifest.json")
    c.add_argument("outdir", type=Path)
    c.add_argument(
        "--inputs", type=Path, default=REPO, help="the clone whose inputs to use (default: this one)"
    )
    c.add_argument("--only", help="only inputs whose id contains this (for trying the harness)")
    d = sub.add_parser("compare", help="compare two captures; exit 1 on any difference")
    d.add_argument("before", type=Path)
    d.add_argument("after", type=Path)
    v = sub.add_parser(
        "verified", help="writes of a capture whose verify IN OUT did not exit 0; exit 1 if any"
    )
    v.add_argument("capture", type=Path)
    args = ap.parse_args()
    if args.cmd == "verified":
        return verified(args.capture)
    if args.cmd == "capture":
        return capture(args.outdir, args.inputs.resolve(), args.only)
    try:
        return compare(args.before, args.after)
    except BrokenPipeError:  # | head: the reader went away
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1


if __name__ == "__main__":
    sys.exit(main())
