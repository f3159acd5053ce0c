"""``verify --logits``: both checkpoints run by PaddleFormers on the same token ids in a subprocess
(:mod:`surgery.logits_worker`), their logits compared; or why they could not be (:class:`NotCompared`)."""

from __future__ import annotations

import json
import os
from enum import Enum
from pathlib import Path

import numpy as np

from ..inspect.detect import detect
from ..io.checkpoint import Checkpoint
from ..io.vocabkeys import walk
from ..model.errors import Opt
from ..model.extras import install_extra

PNLP_ENV = "PNLP_PYTHON"
"""The environment variable naming the Python of a PaddleNLP 2.8.1 venv (paddle 2.6.2: it cannot share
tietool's), which runs a PaddleNLP input's logits."""


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


def _not_compared(cause: NotCompared, why: str, fix: str, **extra) -> dict:
    """``res.logits`` when nothing was compared: ``ok`` None, the cause, and one line naming cause and fix."""
    return {
        "ok": None,
        "compared": False,
        "cause": cause.value,
        "error": f"logits not compared: {why}; {fix}",
        **extra,
    }


def logits_check(a_path, b_path, timeout: float = 600) -> dict:
    """Logits of both checkpoints under PaddleFormers on CPU, on a fixed batch of ids valid in both and not a
    special token the config names (a vision-language model's image id would ask for pixels), in one
    subprocess (:mod:`surgery.logits_worker`: the model class comes from the input's config through
    PaddleFormers'
    own registries, and both are run with it).

    Returns:
        compared: ``{"ok": max |difference| <= 1e-5, "compared": True, "max_abs_diff", "token_ids_below",
        "model_class", "class_from", "error": None}``; when the input runs but the output does not load (or
        loads without every weight), ``ok`` False and ``output_error`` says why: the output is broken.
        Not compared: ``{"ok": None, "compared": False, "cause": NotCompared value, "error": one line
        naming the cause and the fix}`` (no paddle, a URL, a PaddleNLP checkpoint, no class, the input
        does not run, timeout).
    """
    import importlib.util

    from ..io import store

    missing = [m for m in ("paddle", "paddleformers") if importlib.util.find_spec(m) is None]
    if missing:
        return _not_compared(
            NotCompared.NO_PADDLE,
            f"{' and '.join(missing)} not installed",
            f"{install_extra('paddle')} adds paddlepaddle and PaddleFormers 1.2.0",
        )
    remote = [str(p) for p in (a_path, b_path) if not store.is_local(p)]
    if remote:
        return _not_compared(
            NotCompared.REMOTE,
            f"{remote[0]} is in object storage and PaddleFormers loads local folders",
            f"download both checkpoints and verify the local copies with {Opt('logits', True)}",
        )
    A, B = Checkpoint.open(a_path), Checkpoint.open(b_path)
    da, db = detect(A, compare_values=False), detect(B, compare_values=False)
    v = min(da.vocab_rows, db.vocab_rows)
    if da.loader.name.startswith("paddlenlp"):
        pnlp = os.environ.get(PNLP_ENV, "")
        if not pnlp or not Path(pnlp).is_file():
            return _not_compared(
                NotCompared.PADDLENLP,
                f"{a_path} is a PaddleNLP checkpoint ({da.loader.source}), PaddleFormers cannot load its "
                f"names, and {PNLP_ENV} names no Python with PaddleNLP 2.8.1",
                f"set {PNLP_ENV} to the python of a venv with paddlepaddle 2.6.2 and paddlenlp 2.8.1 "
                "(tests/tools/pnlp_venv.sh builds one), or convert both to PaddleFormers first",
            )
        in_pnlp = db.loader.name.startswith("paddlenlp")
        return _compare_across(a_path, b_path, _token_ids(A.config, v), v, timeout, pnlp, in_pnlp)
    return _compare_logits(a_path, b_path, _token_ids(A.config, v), v, timeout)


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
        "ok": d <= 1e-5,
        "compared": True,
        "max_abs_diff": d,
        "error": None,
        "token_ids_below": v,
        **found,
    }


def _compare_across(a_path, b_path, ids: np.ndarray, v: int, timeout: float, pnlp: str, both: bool) -> dict:
    """The input run by PaddleNLP 2.8.1 (:mod:`surgery.pnlp_logits_worker` under the Python ``pnlp``), the
    output by PaddleNLP too (``both``) or by PaddleFormers (:func:`_run_fidelity`, its class from its own
    config): a convert from PaddleNLP to PaddleFormers runs each side in the library meant to read it. The
    logits are compared on the first ``v`` entries, as :func:`_compare_logits` compares them."""
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        t = Path(tmp)
        np.save(t / "ids.npy", ids)
        doc = _run_pnlp(pnlp, [a_path, b_path] if both else [a_path], t / "ids.npy", t / "a", timeout)
        if "cause" in doc:
            return doc
        results = doc.get("results") or [{"ok": False, "error": doc.get("error"), "stage": None}]
        ra = results[0]
        if not ra.get("ok"):
            return _not_compared(
                NotCompared.INPUT_FAILED,
                f"{a_path} does not {'run' if ra.get('stage') == 'forward' else 'load'} under PaddleNLP "
                f"2.8.1 ({ra.get('error')})",
                f"the tensors alone were compared; verify with {Opt('logits', True)} where PaddleNLP can "
                "load and run the input",
            )
        lib, after = ("PaddleNLP 2.8.1", t / "a" / "1.npy") if both else ("PaddleFormers", t / "b" / "0.npy")
        if both:
            rb = results[1] if len(results) > 1 else {"ok": False, "error": "not run"}
            b_class = rb.get("model_class")
        else:
            db_ = _run_fidelity([b_path], t / "ids.npy", t / "b", timeout)
            if "cause" in db_:
                return db_
            rb = (db_.get("results") or [{"ok": False, "error": db_.get("error")}])[0]
            b_class = db_.get("model_class")
        found = {
            "model_class": b_class,
            "class_from": f"{lib}'s registry for the output, PaddleNLP 2.8.1's for the input",
            "libraries": lib if both else f"{lib} (the output) and PaddleNLP 2.8.1 (the input)",
        }
        if not rb.get("ok"):
            return {"ok": False, "compared": True, "output_error": rb.get("error"), "error": None, **found}
        d = float(np.max(np.abs(np.load(t / "a" / "0.npy")[..., :v] - np.load(after)[..., :v])))
    return {
        "ok": d <= 1e-5,
        "compared": True,
        "max_abs_diff": d,
        "error": None,
        "token_ids_below": v,
        **found,
    }


def _run_pnlp(pnlp: str, paths: list, ids: Path, out: Path, timeout: float) -> dict:
    """Run :mod:`surgery.pnlp_logits_worker` (by its file path) under the Python ``pnlp`` on ``paths``."""
    import subprocess

    out.mkdir(parents=True, exist_ok=True)
    worker = Path(__file__).resolve().parent.parent / "pnlp_logits_worker.py"
    try:
        r = subprocess.run(
            [pnlp, "-I", str(worker), str(ids), str(out), *map(str, paths)],  # -I: not surgery/ on the path
            capture_output=True,
            text=True,
            timeout=timeout,
            stdin=subprocess.DEVNULL,
        )
    except subprocess.TimeoutExpired:
        return _not_compared(
            NotCompared.TIMEOUT,
            f"PaddleNLP took more than {timeout:.0f} s to run {paths[0]}",
            "run verify on a machine with more memory or cores",
        )
    lines = [ln for ln in r.stdout.strip().splitlines() if ln.startswith("{")]
    try:
        return json.loads(lines[-1])
    except (IndexError, json.JSONDecodeError):
        tail = r.stderr.strip().splitlines()
        why = tail[-1][-300:] if tail else f"exit code {r.returncode}, no output"
        return _not_compared(
            NotCompared.CRASHED,
            f"the PaddleNLP subprocess ({pnlp}) stopped without a result ({why})",
            f"check that {PNLP_ENV} names a Python with paddlepaddle 2.6.2 and paddlenlp 2.8.1",
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
    import subprocess
    import sys

    out.mkdir(parents=True, exist_ok=True)
    args = [
        sys.executable,
        "-m",
        "tietool.surgery.logits_worker",
        str(ids),
        str(out),
        str(config_of or paths[0]),
    ]
    try:
        r = subprocess.run(
            [*args, *map(str, paths)],
            capture_output=True,
            text=True,
            timeout=timeout,
            stdin=subprocess.DEVNULL,
        )
    except subprocess.TimeoutExpired:
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
