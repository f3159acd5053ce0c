"""``verify --logits``: both checkpoints run on the same token ids, each in a subprocess of the library meant
to read it, their logits compared; or why they could not be (:class:`NotCompared`).

The input runs in PaddleFormers (:mod:`surgery.logits_worker`), or in PaddleNLP 2.8.1 when it is a PaddleNLP
checkpoint (:mod:`surgery.pnlp_logits_worker` under ``$PNLP_PYTHON``). The output runs in the library its own
layout names (PaddleNLP for a PaddleNLP checkpoint, PaddleFormers otherwise), or in the one asked for
(:data:`LIBRARIES`): ``hf`` runs an HF-layout safetensors output in HF transformers on CPU torch
(:mod:`surgery.hf_logits_worker` under ``$HF_PYTHON``), for a model type whose ``hf`` loader facts the
architecture table proves (:func:`surgery.arch.proven_loaders`)."""

from __future__ import annotations

import json
import os
from enum import Enum
from pathlib import Path

import numpy as np

from ..inspect.detect import detect
from ..io.checkpoint import Checkpoint
from ..io.vocabkeys import walk
from ..model.errors import Opt, UsageError
from ..model.extras import install_extra

PNLP_ENV = "PNLP_PYTHON"
"""The environment variable naming the Python of a PaddleNLP 2.8.1 venv (paddle 2.6.2: it cannot share
tietool's), which runs a PaddleNLP input's logits."""


HF_ENV = "HF_PYTHON"
"""The environment variable naming the Python of a venv with HF transformers and CPU torch (PaddleFormers
switches torch off in transformers: they cannot share tietool's), which runs an output in transformers. Unset,
the venv ``tests/tools/hf_venv.sh`` builds is used when it exists (``$HF_VENV``, default
``~/.cache/tietool/hf-venv``)."""

LIBRARIES = ("paddleformers", "paddlenlp", "hf")
"""The libraries ``verify`` can run an output in (``logits_with``)."""

_NAMES = {"paddleformers": "PaddleFormers", "paddlenlp": "PaddleNLP 2.8.1", "hf": "HF transformers"}

TOLERANCE = 1e-5
"""The largest |difference| of two logits that agree, both run by one library (or Paddle's two)."""

HF_TOLERANCE = 2e-5
"""Across torch and Paddle: they sum the same float32 products in another order (the logits of the test
models, |x| < 2, agree to ~1e-6; a wrong head or row order moves them by > 1e-2)."""


class NotCompared(str, Enum):
    """Why ``verify`` could not compare the logits (``res.logits["cause"]``; exit
    :attr:`ExitCode.NOT_COMPARED`)."""

    NO_PADDLE = "no_paddle"  # paddlepaddle or PaddleFormers is not installed
    REMOTE = "remote"  # a checkpoint is in object storage; PaddleFormers loads local folders
    PADDLENLP = "paddlenlp"  # a PaddleNLP checkpoint: PaddleFormers cannot load its names
    NO_CLASS = "no_class"  # PaddleFormers has no language-model class for the config
    INPUT_FAILED = "input_failed"  # the input does not load or run under PaddleFormers (on this machine)
    TIMEOUT = "timeout"  # the PaddleFormers subprocess ran out of time
    CRASHED = "crashed"  # the PaddleFormers subprocess died without a verdict
    NO_HF = "no_hf"  # HF transformers asked for, and no Python with transformers and torch named or found
    HF_UNPROVEN = "hf_unproven"  # not an HF-layout safetensors output transformers is proven to load


def _not_compared(cause: NotCompared, why: str, fix: str, **extra) -> dict:
    """``res.logits`` when nothing was compared: ``ok`` None, the cause, and one line naming cause and fix."""
    return {
        "ok": None,
        "compared": False,
        "cause": cause.value,
        "error": f"logits not compared: {why}; {fix}",
        **extra,
    }


def logits_check(a_path, b_path, timeout: float = 600, logits_with: str | None = None) -> dict:
    """Logits of both checkpoints on CPU, on a fixed batch of ids valid in both and not a special token the
    config names (a vision-language model's image id would ask for pixels), each run by the library meant to
    read it (module docstring): the input by PaddleFormers (PaddleNLP 2.8.1 for a PaddleNLP checkpoint), the
    output by ``logits_with`` (one of :data:`LIBRARIES`; None: PaddleNLP for a PaddleNLP output, else
    PaddleFormers). Both in PaddleFormers: one subprocess (:mod:`surgery.logits_worker`: the model class
    comes from the input's config through PaddleFormers' own registries, and both are run with it).

    Returns:
        compared: ``{"ok": max |difference| <= tolerance, "compared": True, "max_abs_diff", "tolerance",
        "token_ids_below", "model_class", "class_from", "libraries" (across libraries), "error": None}``
        (tolerance :data:`TOLERANCE`, :data:`HF_TOLERANCE` across torch and Paddle); when the input runs but
        the output does not load (or loads without every weight), ``ok`` False and ``output_error`` says why:
        the output is broken. Not compared: ``{"ok": None, "compared": False, "cause": NotCompared value,
        "error": one line naming the cause and the fix}`` (a library or its Python missing, a URL, no class,
        an output transformers is not proven to load, the input does not run, timeout).

    Raises:
        UsageError: ``logits_with`` is not one of :data:`LIBRARIES`.
    """
    from ..io import stores

    if logits_with is not None and logits_with not in LIBRARIES:
        raise UsageError(
            f"cannot run logits with {logits_with!r}",
            fix=f"use {Opt('logits_with', LIBRARIES[0])} or one of {', '.join(LIBRARIES)}",
        )
    remote = [str(p) for p in (a_path, b_path) if not stores.is_local(p)]
    if remote:
        return _not_compared(
            NotCompared.REMOTE,
            f"{remote[0]} is in object storage and the libraries load local folders",
            f"download both checkpoints and verify the local copies with {Opt('logits', True)}",
        )
    A, B = Checkpoint.open(a_path), Checkpoint.open(b_path)
    da, db = detect(A, compare_values=False), detect(B, compare_values=False)
    v = min(da.vocab_rows, db.vocab_rows)
    libs = (
        "paddlenlp" if da.loader.name.startswith("paddlenlp") else "paddleformers",
        logits_with or ("paddlenlp" if db.loader.name.startswith("paddlenlp") else "paddleformers"),
    )
    unproven = _hf_unproven(B, b_path) if libs[1] == "hf" else None
    if unproven is not None:
        return unproven
    pythons: dict[str, str] = {}
    for side, (lib, path) in enumerate(zip(libs, (a_path, b_path), strict=True)):
        missing = _missing(lib, path, side, pythons)
        if missing is not None:
            return missing
    ids = _token_ids(A.config, v)
    if libs == ("paddleformers", "paddleformers"):
        return _compare_logits(a_path, b_path, ids, v, timeout)
    return _compare_across(a_path, b_path, ids, v, timeout, libs, pythons)


def _hf_python() -> str:
    """The Python of the HF venv: ``$HF_PYTHON``, else the one ``tests/tools/hf_venv.sh`` builds
    (``$HF_VENV``, default ``~/.cache/tietool/hf-venv``) when it exists; "" when neither is a file."""
    named = os.environ.get(HF_ENV, "")
    if named:
        return named if Path(named).is_file() else ""
    venv = Path(os.environ.get("HF_VENV") or Path.home() / ".cache" / "tietool" / "hf-venv")
    py = venv / "bin" / "python"
    return str(py) if py.is_file() else ""


def _missing(lib: str, path, side: int, pythons: dict[str, str]) -> dict | None:
    """Why ``lib`` cannot run checkpoint ``path`` (the input when ``side`` is 0) on this machine, as a
    not-compared dict; None when it can (its Python recorded in ``pythons``)."""
    import importlib.util

    if lib == "paddleformers":
        missing = [m for m in ("paddle", "paddleformers") if importlib.util.find_spec(m) is None]
        if missing:
            return _not_compared(
                NotCompared.NO_PADDLE,
                f"{' and '.join(missing)} not installed",
                f"{install_extra('paddle')} adds paddlepaddle and PaddleFormers 1.2.0",
            )
        return None
    if lib == "paddlenlp":
        pnlp = os.environ.get(PNLP_ENV, "")
        if not pnlp or not Path(pnlp).is_file():
            what = "a PaddleNLP checkpoint" if side == 0 else "to run in PaddleNLP"
            return _not_compared(
                NotCompared.PADDLENLP,
                f"{path} is {what}, PaddleFormers cannot load its names, and {PNLP_ENV} names no Python "
                "with PaddleNLP 2.8.1",
                f"set {PNLP_ENV} to the python of a venv with paddlepaddle 2.6.2 and paddlenlp 2.8.1 "
                "(tests/tools/pnlp_venv.sh builds one), or convert both to PaddleFormers first",
            )
        pythons[lib] = pnlp
        return None
    hf = _hf_python()
    if not hf:
        return _not_compared(
            NotCompared.NO_HF,
            f"{path} is to run in HF transformers, and {HF_ENV} names no Python with transformers and torch "
            "(nor is there one at ~/.cache/tietool/hf-venv)",
            f"set {HF_ENV} to the python of a venv with transformers and CPU torch (tests/tools/hf_venv.sh "
            "builds one)",
        )
    pythons[lib] = hf
    return None


def _hf_unproven(B: Checkpoint, b_path) -> dict | None:
    """Why transformers is not known to load the output (a not-compared dict), or None: it must be an
    HF-layout safetensors folder of a model type whose ``hf`` loader facts the architecture table proves."""
    from .. import arch

    mt = B.config.get("model_type") if isinstance(B.config.get("model_type"), str) else None
    if B.format != "safetensors" or "hf" not in arch.proven_loaders(mt, B.format):
        return _not_compared(
            NotCompared.HF_UNPROVEN,
            f"{b_path} is {B.format} of model type {mt!r}, which no test proves HF transformers loads "
            "(the architecture table's hf rows)",
            f"compare with {Opt('logits_with', 'paddleformers')}, or convert to PaddleFormers safetensors "
            "first",
        )
    return None


def _token_ids(config: dict, v: int) -> np.ndarray:
    """A fixed ``int64 [2, 8]`` batch of ids in ``1..v-1`` (0 is the padding id of PaddleFormers Llama, which
    reads as zeros whatever the weights), none a ``*_token_id`` the config names at any nesting (image,
    video, vision-start ids make a vision-language model look for pixels)."""
    special = {val for k, val in walk(config) if k.endswith("token_id") and isinstance(val, int)}
    pool = np.setdiff1d(np.arange(1, max(2, v)), np.array(sorted(special), dtype=np.int64))
    return (
        np.random.default_rng(0).choice(pool if pool.size else np.arange(1, 2), size=(2, 8)).astype(np.int64)
    )


def _compare_logits(a_path, b_path, ids: np.ndarray, v: int, timeout: float) -> dict:
    """Run both checkpoints (:func:`_run_fidelity`) and compare their logits on the first ``v`` entries."""
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        np.save(Path(tmp) / "ids.npy", ids)
        doc = _run_fidelity([a_path, b_path], Path(tmp) / "ids.npy", Path(tmp), timeout)
        if "cause" in doc:  # timed out, or no verdict
            return doc
        found = {"model_class": doc.get("model_class"), "class_from": doc.get("class_from")}
        results = doc.get("results") or []
        if found["model_class"] is None:
            return _not_compared(
                NotCompared.NO_CLASS,
                f"{a_path}: {doc.get('error')}",
                "compare the logits with the library that wrote the checkpoint",
                **found,
            )
        if not results or not results[0].get("ok"):
            r = results[0] if results else {"error": doc.get("error"), "stage": None}
            return _not_compared(
                NotCompared.INPUT_FAILED,
                f"{a_path} does not {'load' if r.get('stage') in ('load', None) else 'run'} under "
                f"PaddleFormers {found['model_class']} ({r.get('error')})",
                f"the tensors alone were compared; verify with {Opt('logits', True)} where PaddleFormers "
                "can load and run the input (a GPU for a GPU-only kernel, another PaddleFormers version for "
                "files this one cannot read back)",
                **found,
            )
        after = Path(tmp) / "1.npy"
        if len(results) < 2 or not results[1].get("ok"):
            # a load after a successful one: run it again alone, so no state of the first can be the cause
            again = _run_fidelity([b_path], Path(tmp) / "ids.npy", Path(tmp) / "b", timeout, config_of=a_path)
            if again.get("cause") == NotCompared.TIMEOUT.value:
                return {**again, **found}
            r = (again.get("results") or [{"error": again.get("error")}])[0]
            if not r.get("ok"):  # the input runs, the output does not: a difference
                return {"ok": False, "compared": True, "output_error": r.get("error"), "error": None, **found}
            after = Path(tmp) / "b" / "0.npy"
        d = float(np.max(np.abs(np.load(Path(tmp) / "0.npy")[..., :v] - np.load(after)[..., :v])))
    return {
        "ok": d <= TOLERANCE,
        "compared": True,
        "max_abs_diff": d,
        "tolerance": TOLERANCE,
        "error": None,
        "token_ids_below": v,
        **found,
    }


def _compare_across(a_path, b_path, ids: np.ndarray, v: int, timeout: float, libs, pythons) -> dict:
    """The input run by ``libs[0]``, the output by ``libs[1]`` (:func:`_run_one`; both PaddleNLP: one
    subprocess), their logits compared on the first ``v`` entries, as :func:`_compare_logits` compares them:
    a convert from PaddleNLP to PaddleFormers, or to the HF layout, runs each side in the library meant to
    read it."""
    import tempfile

    both = libs == ("paddlenlp", "paddlenlp")
    with tempfile.TemporaryDirectory() as tmp:
        t = Path(tmp)
        np.save(t / "ids.npy", ids)
        first = [a_path, b_path] if both else [a_path]
        doc = _run_one(libs[0], first, t / "ids.npy", t / "a", timeout, pythons)
        if "cause" in doc:
            return doc
        results = doc.get("results") or [{"ok": False, "error": doc.get("error"), "stage": None}]
        ra = results[0]
        if not ra.get("ok"):
            return _not_compared(
                NotCompared.INPUT_FAILED,
                f"{a_path} does not {'run' if ra.get('stage') == 'forward' else 'load'} under "
                f"{_NAMES[libs[0]]} ({ra.get('error')})",
                f"the tensors alone were compared; verify with {Opt('logits', True)} where {_NAMES[libs[0]]} "
                "can load and run the input",
            )
        after = t / "a" / "1.npy" if both else t / "b" / "0.npy"
        if both:
            rb = results[1] if len(results) > 1 else {"ok": False, "error": "not run"}
            b_class = rb.get("model_class")
        else:
            db_ = _run_one(libs[1], [b_path], t / "ids.npy", t / "b", timeout, pythons)
            if "cause" in db_:
                return db_
            rb = (db_.get("results") or [{"ok": False, "error": db_.get("error")}])[0]
            b_class = rb.get("model_class") or db_.get("model_class")
        lib, lib_a = _NAMES[libs[1]], _NAMES[libs[0]]
        found = {
            "model_class": b_class,
            "class_from": f"{lib}'s registry for the output, {lib_a}'s for the input",
            "libraries": lib if both else f"{lib} (the output) and {lib_a} (the input)",
        }
        if not rb.get("ok"):
            return {"ok": False, "compared": True, "output_error": rb.get("error"), "error": None, **found}
        d = float(np.max(np.abs(np.load(t / "a" / "0.npy")[..., :v] - np.load(after)[..., :v])))
    tol = HF_TOLERANCE if "hf" in libs and libs[0] != libs[1] else TOLERANCE
    return {
        "ok": d <= tol,
        "compared": True,
        "max_abs_diff": d,
        "tolerance": tol,
        "error": None,
        "token_ids_below": v,
        **found,
    }


def _run_one(lib: str, paths: list, ids: Path, out: Path, timeout: float, pythons: dict[str, str]) -> dict:
    """Run the checkpoints ``paths`` in ``lib``: PaddleFormers (:func:`_run_fidelity`), PaddleNLP 2.8.1 or
    HF transformers (their workers, by file path, under the Python ``pythons`` names for them)."""
    if lib == "paddleformers":
        return _run_fidelity(paths, ids, out, timeout)
    worker = "pnlp_logits_worker.py" if lib == "paddlenlp" else "hf_logits_worker.py"
    return _run_worker(pythons[lib], worker, lib, paths, ids, out, timeout)


def _run_worker(
    python: str, worker: str, lib: str, paths: list, ids: Path, out: Path, timeout: float
) -> dict:
    """Run ``surgery/<worker>`` (by its file path) under ``python`` on ``paths``: its JSON line, or a
    not-compared dict when it timed out or printed none (its stderr's last line says why)."""
    out.mkdir(parents=True, exist_ok=True)
    script = Path(__file__).resolve().parent.parent / worker
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="")
    # -I: not surgery/ on the path
    r = _call([python, "-I", str(script)], [str(ids), str(out), *map(str, paths)], timeout, env)
    if r is None:
        return _not_compared(
            NotCompared.TIMEOUT,
            f"{_NAMES[lib]} took more than {timeout:.0f} s to run {paths[0]}",
            "run verify on a machine with more memory or cores",
        )
    lines = [ln for ln in r.stdout.strip().splitlines() if ln.startswith("{")]
    try:
        return json.loads(lines[-1])
    except (IndexError, json.JSONDecodeError):
        tail = r.stderr.strip().splitlines()
        why = tail[-1][-300:] if tail else f"exit code {r.returncode}, no output"
        env_name = PNLP_ENV if lib == "paddlenlp" else HF_ENV
        need = "transformers and CPU torch" if lib == "hf" else "paddlepaddle 2.6.2 and paddlenlp 2.8.1"
        return _not_compared(
            NotCompared.CRASHED,
            f"the {_NAMES[lib]} subprocess ({python}) stopped without a result ({why})",
            f"check that {env_name} names a Python with {need}",
        )


def _run_fidelity(paths: list, ids: Path, out: Path, timeout: float, config_of=None) -> dict:
    """Run ``tietool.surgery.logits_worker`` on the checkpoints ``paths`` in one subprocess: the logits of the
    token ids in ``ids`` go to ``out/<i>.npy``; the class comes from the first one's config (or from
    ``config_of``'s).

    Returns:
        the subprocess's JSON line (:mod:`surgery.logits_worker`), or a not-compared dict
        (:func:`_not_compared`)
        when it timed out or printed no JSON (its stderr's last line says why).
    """
    import sys

    out.mkdir(parents=True, exist_ok=True)
    args = [str(ids), str(out), str(config_of or paths[0]), *map(str, paths)]
    r = _call([sys.executable, "-m", "tietool.surgery.logits_worker"], args, timeout)
    if r is None:
        return _not_compared(
            NotCompared.TIMEOUT,
            f"PaddleFormers took more than {timeout:.0f} s to run {paths[0]}",
            "run verify on a machine with more memory or cores",
        )
    lines = [ln for ln in r.stdout.strip().splitlines() if ln.startswith("{")]
    try:
        return json.loads(lines[-1])
    except (IndexError, json.JSONDecodeError):  # no JSON line: it died before printing one
        tail = r.stderr.strip().splitlines()
        why = tail[-1][-300:] if tail else f"exit code {r.returncode}, no output"
        return _not_compared(
            NotCompared.CRASHED,
            f"the PaddleFormers subprocess stopped without a result ({why})",
            "check that paddle runs on this machine: python -c 'import paddle; paddle.utils.run_check()'",
        )


def _call(command: list[str], args: list[str], timeout: float, env: dict[str, str] | None = None):
    """Run the worker ``command`` on ``args``: in its live process inside
    :func:`surgery.verify.logits_pool.reuse_processes` (the verdicts of fresh processes kept), else in a
    subprocess of its own. Returns its ``CompletedProcess`` (the pooled one's JSON line as stdout, return
    code 0 when there is one), or None when it ran out of ``timeout`` seconds."""
    import subprocess

    from . import logits_pool

    pooled = logits_pool.run(command, args, timeout, env)
    if pooled is not None:
        line, err, expired = pooled
        return None if expired else subprocess.CompletedProcess(command, 0 if line else 1, line or "", err)
    try:
        return subprocess.run(
            [*command, *args],
            capture_output=True,
            text=True,
            timeout=timeout,
            stdin=subprocess.DEVNULL,
            env=env,
        )
    except subprocess.TimeoutExpired:
        return None
