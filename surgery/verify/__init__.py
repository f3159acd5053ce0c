"""``verify``: compare two checkpoints and say whether their difference is exactly what tie / untie /
resize explains.

Every tensor is classified: identical (same bytes), dropped, added, resized, or changed. A difference is
*explained* when:

* dropped: a head (or embedding alias) whose values equal the output's embedding (tie);
* added: a head equal to the embedding, as stored or transposed, or scaled by ``d_model ** -0.5`` (T5 untie);
* resized: a vocabulary tensor (embedding, alias, head, bias) whose common rows — columns for a
  ``[hidden, vocab]`` head, last-axis entries for a bias — are bit-identical;
* changed: the embedding taking the head's values or the head taking the embedding's (``tie --keep``), or a
  bfloat16 ``U16`` label written as ``BF16`` with the same bytes.

Every other tensor must be bit-identical, and config files may differ only in ``tie_word_embeddings`` and
vocab-size keys (:data:`surgery.arch.VOCAB_SIZE_KEYS`).

When the embedding's row count changed, every tensor of the input's vocabulary surface (heads, biases,
aliases, multi-token-prediction copies, vocabulary-shaped tensors) must have moved by the same number of
entries, and every config key that counted the rows must have moved with them: one left at the old size is
unexplained (a loader would index past it, or reject it). With ``logits=True`` the logits under PaddleFormers
must agree too. The rows a lone ``resize`` / ``add-tokens`` run made are recomputed by its planner from the
report's fields and checked bit for bit (:mod:`surgery.verify.made`). An output without
``tietool-report.json`` records no operation: only a pair with no difference passes. The verdict
(:attr:`VerifyResult.exit_code`) is decided here, not by the caller.
"""

from __future__ import annotations

from pathlib import Path

from ..io.checkpoint import REPORT_NAME, Checkpoint
from ..io.regular import load_json
from ..model.errors import CheckpointError, TietoolError
from ..report import chain_since
from . import chain, flexstate, made, prune, pruned, rebuilt, training, transplant
from .files import ALLOWED_CONFIG_KEYS, compare_configs, compare_metadata, compare_other_files
from .logits import NotCompared, logits_check
from .result import VerifyResult
from .tensors import TensorComparison, left_at_old_size
from .tokens import Tokenizers, compare_tokenizers, renamed_slots, tokenizer_names
from .vocab import fixed_rows, split_rows

__all__ = ["ALLOWED_CONFIG_KEYS", "NotCompared", "VerifyResult", "logits_check", "verify"]


def verify(
    a_path, b_path, logits: bool = False, timeout: float = 600, logits_with: str | None = None
) -> VerifyResult:
    """Compare checkpoint ``a`` (before) with ``b`` (after). Reads every tensor of both, one at a time.

    Args:
        a_path, b_path: checkpoint folders (``str`` or ``os.PathLike``).
        logits: also compare the logits of both on token ids valid in both (:func:`logits_check`;
            subprocesses: PaddleFormers needs the ``paddle`` extra, a PaddleNLP side ``$PNLP_PYTHON``, an
            HF transformers side ``$HF_PYTHON``). Logits that differ by more than the tolerance (1e-5;
            2e-5 across torch and Paddle), or an output that does not load while the input does, are
            unexplained (exit 7); logits that could not be compared make the verdict
            ``ExitCode.NOT_COMPARED`` (8) when the tensors explain everything, and ``res.logits["error"]``
            says why and what to do.
        timeout: seconds allowed for each logits subprocess.
        logits_with: the library that runs the output (``paddleformers``, ``paddlenlp``, ``hf``; None: the
            one its layout names); implies ``logits``.

    Returns:
        the classification; ``res.exit_code`` is the verdict.

    Raises:
        CheckpointError, UnsafePickleError: as :meth:`Checkpoint.open`.
        UsageError: ``logits_with`` names no library :func:`logits_check` runs.
    """
    res = _verify_tensors_and_files(a_path, b_path)
    _without_report(res, b_path)
    if logits or logits_with is not None:
        res.logits = lg = logits_check(a_path, b_path, timeout=timeout, logits_with=logits_with)
        lib = lg.get("libraries") or "PaddleFormers"
        if lg.get("ok") is False and lg.get("output_error"):
            res.unexplained.append(
                f"{b_path} does not load under {lib.split(' (')[0]}"
                + (f" {lg['model_class']}" if lg.get("model_class") else "")
                + f" while {a_path} does ({lg['output_error']})"
            )
        elif lg.get("ok") is False:
            res.unexplained.append(
                f"logits differ (max |difference| {lg.get('max_abs_diff', float('nan')):.3g} "
                f"> {lg.get('tolerance', 1e-5):.0e} on token ids below {lg.get('token_ids_below')}; {lib})"
            )
    return res


def _without_report(res: VerifyResult, b_path) -> None:
    """An output without ``tietool-report.json`` records no operation: only a pair with no difference at
    all passes; any difference (one a run would explain included) is unexplained, the missing report named
    first with the fix."""
    folder = Path(b_path) if isinstance(b_path, str) else b_path  # a Path, or a URL's remote path
    try:
        load_json(folder / REPORT_NAME, REPORT_NAME)
        return
    except (CheckpointError, OSError, ValueError):  # missing or unreadable, as surgery.report.history
        has = "an unreadable" if (folder / REPORT_NAME).exists() else "no"
    res.report = False
    if res.differences or res.unexplained:
        n = f" {res.differences}" if res.differences else ""
        res.unexplained.insert(
            0,
            f"{b_path} has {has} {REPORT_NAME}: no operation is recorded to explain its{n} difference(s) "
            f"from the input; verify the folder tietool wrote (its {REPORT_NAME} beside the weights), or "
            f"put that run's {REPORT_NAME} back",
        )


def _verify_tensors_and_files(a_path, b_path, original=None) -> VerifyResult:
    """:func:`verify` without logits. ``original``: the chain's input before its prunes, when ``a_path``
    is that input pruned (:mod:`surgery.verify.pruned`; the rows set before a prune are checked there)."""
    rep = rebuilt.one_step(a_path, b_path)
    if rep is not None:  # one convert or merge run: the output rebuilt from the input and compared
        return _verify_rebuilt(a_path, b_path, rep)
    sec = prune.section(a_path, b_path)
    if sec is not None:  # one prune run: every entry checked at its old id (surgery.verify.prune)
        return prune.verify_prune(a_path, b_path, sec)
    sec = transplant.section(a_path, b_path)
    if sec is not None:  # one transplant run: every entry recomputed as its row says
        return transplant.verify_transplant(a_path, b_path, sec)
    if original is None and pruned.applies(a_path, b_path):  # a prune in a longer chain: the input pruned
        return pruned.verify_through(a_path, b_path, _after_prune)
    if chain.applies(a_path, b_path):  # a convert or merge in a longer chain: the input carried through it
        return _verify_composed(a_path, b_path, original)
    if flexstate.is_pair(a_path, b_path):  # Trainer checkpoints: their merged views, then the state
        A, B, config_dir = flexstate.open_views(a_path, b_path)
        cmp = _compare(A, B, config_dir, original)
        flexstate.compare_state(cmp.res, A, B, _moves(cmp))
        made.check(cmp.res, A, B, whole=False)
        return cmp.res
    A, B = Checkpoint.open(a_path), Checkpoint.open(b_path)
    cmp = _with_training_files(A, B, original)
    transplant.chained(cmp.res, a_path, b_path)
    made.check(cmp.res, A, B, whole=original is None)
    return cmp.res


def _after_prune(mid_path, b_path, a_path) -> VerifyResult:
    """:func:`verify` of the input ``a_path`` pruned as the output's chain says (``mid_path``,
    :mod:`surgery.verify.pruned`) and the output."""
    return _verify_tensors_and_files(mid_path, b_path, original=a_path)


def _verify_composed(a_path, b_path, original=None) -> VerifyResult:
    """:func:`verify` of a chain with a ``convert`` or ``merge`` in it (:mod:`surgery.verify.chain`)."""
    try:
        A = chain.carried(a_path, b_path)
    except (TietoolError, ValueError) as e:
        res = VerifyResult()
        res.unexplained.append(
            f"the convert / merge runs of the output's report chain do not plan on {a_path} ({e}); "
            "the chain is unverifiable"
        )
        return res
    B = Checkpoint.open(b_path)
    cmp = _with_training_files(A, B, original)
    made.check(cmp.res, A, B, whole=False)
    cmp.res.notes.append(
        "the input was carried through the convert / merge runs of the output's report chain (rebuilt from "
        f"its headers: {len(A.tensors)} tensors), then compared with the output"
    )
    return cmp.res


def _compare(A: Checkpoint, B: Checkpoint, config_dir=None, original=None) -> TensorComparison:
    """Every tensor, config file, safetensors ``__metadata__``, carried file and tokenizer of ``A`` and
    ``B`` classified (``config_dir``: where the input's config files are, if not in ``A.path``;
    ``original``: the chain's input before its prunes, when ``A`` is that input pruned)."""
    cmp = TensorComparison(A, B)  # detection first: it refuses a tokenizer_config of the wrong types
    tok = renamed_slots(Tokenizers.read(cmp.da, cmp.db), B, A)
    cmp.added_ids = tok.new_rows()
    cmp.fixed_ids = fixed_rows(cmp.res, cmp.da, B, original) | split_rows(cmp.res, cmp.da, B, original)
    for name, ta in A.tensors.items():
        tb = B.tensors.get(name)
        if tb is None:
            cmp.dropped(name, ta)
        else:
            cmp.kept(name, ta, tb)
    for name, tb in B.tensors.items():
        if name not in A.tensors:
            cmp.added(name, tb)
    runs = chain_since(B.path, A.path)  # the runs that made B from A, as its report records them
    compare_configs(cmp.res, A, B, cmp.da, cmp.db, runs, a_dir=config_dir)
    compare_metadata(cmp.res, A, B, runs)
    compare_other_files(cmp.res, A, B, tokenizer_names(A, B, tok.sets))
    compare_tokenizers(cmp.res, A, B, tok, (cmp.da.vocab_rows, cmp.db.vocab_rows))
    left_at_old_size(cmp.res, cmp.da, cmp.db)
    return cmp


def _with_training_files(A: Checkpoint, B: Checkpoint, original=None) -> TensorComparison:
    """:func:`_compare` of two opened checkpoints, then their training files (``.pdopt`` and the like,
    :func:`surgery.verify.training.compare_training_files`) by how each weight's vocabulary axis moved."""
    cmp = _compare(A, B, original=original)
    training.compare_training_files(cmp.res, A, B, _moves(cmp))
    return cmp


def _moves(cmp: TensorComparison) -> dict[str, training.Move]:
    """How each weight's vocabulary axis moved (:func:`surgery.verify.training.moves`)."""
    return training.moves(cmp.A, cmp.B, cmp.vocab_names_a, cmp.da.vocab_rows, cmp.added_ids)


def _verify_rebuilt(a_path, b_path, rep: dict) -> VerifyResult:
    """:func:`verify` of one ``convert`` or ``merge`` run (:mod:`surgery.verify.rebuilt`)."""
    res = VerifyResult()
    B = Checkpoint.open(b_path)
    try:
        rb = rebuilt.rebuild(a_path, rep)
    except (TietoolError, ValueError) as e:
        return _not_its_input(a_path, B, rep, e)
    rebuilt.compare(res, rb, B, rep)
    return res


def _not_its_input(a_path, B: Checkpoint, rep: dict, e: Exception) -> VerifyResult:
    """The output's report records a ``convert`` / ``merge`` the input cannot have made (``e`` says why):
    another folder's run, as when a merge of rank files is checked against the model before it was split.
    The two are then compared as checkpoints: a pair with no difference at all passes (nothing needs
    explaining; a note says the report was not checked), any difference is unexplained, the report's line
    first. An input that cannot be opened as one checkpoint (rank files, a flex folder) gets the report's
    line alone."""
    try:
        A = Checkpoint.open(a_path)
    except TietoolError:
        res = VerifyResult()
        rebuilt.refused(res, rep, a_path, e)
        return res
    cmp = _with_training_files(A, B)
    res = cmp.res
    res.report_checked = False
    if res.differences or res.unexplained:
        rebuilt.refused(res, rep, a_path, e)
        res.unexplained.insert(0, res.unexplained.pop())
    else:
        res.notes.append(
            f"{REPORT_NAME} records a {rep.get('operation')} of {rep.get('input')}, not of {a_path}: "
            "the report was not checked; the two hold the same tensors, config and files"
        )
    return res
