"""The verdict of ``verify``: :class:`VerifyResult`, every difference classified, the unexplained named."""

from __future__ import annotations

from dataclasses import dataclass, field

from ..model.errors import ExitCode


@dataclass
class VerifyResult:
    """Outcome of :func:`verify`. ``explained`` is True when every difference is one tietool makes."""

    identical: int = 0
    dropped: list[dict] = field(default_factory=list)
    added: list[dict] = field(default_factory=list)
    resized: list[dict] = field(default_factory=list)
    changed: list[dict] = field(default_factory=list)
    config: list[dict] = field(default_factory=list)
    unexplained: list[str] = field(default_factory=list)
    logits: dict | None = None
    tokenizer: dict | None = None
    notes: list[str] = field(default_factory=list)
    # convert / merge: each output tensor checked against its source after the inverse transform
    derived: list[dict] = field(default_factory=list)
    # --keep-training-state: each optimizer / master-weight entry checked against its rule
    training_state: list[dict] = field(default_factory=list)
    # the output holds a tietool-report.json (False: no operation is recorded, only no difference passes)
    report: bool = True
    # False: the report records a convert / merge of another input, so it was not checked against this one
    # (only a pair with no difference at all passes)
    report_checked: bool = True

    @property
    def explained(self) -> bool:
        """Every difference is one tie / untie / resize makes (and the logits agree, when compared)."""
        return not self.unexplained

    @property
    def exit_code(self) -> ExitCode:
        """The verdict as an exit status: ``UNEXPLAINED`` (7) when a difference is unexplained (the logits'
        included), else ``NOT_COMPARED`` (8) when logits were asked for but could not be compared, else
        ``OK``."""
        if not self.explained:
            return ExitCode.UNEXPLAINED
        if self.logits is not None and not self.logits_compared:
            return ExitCode.NOT_COMPARED
        return ExitCode.OK

    @property
    def logits_compared(self) -> bool:
        """Logits were asked for and computed for both checkpoints (or the output did not load while the
        input did: a difference too)."""
        return bool(self.logits) and self.logits.get("ok") is not None  # type: ignore[union-attr]

    @property
    def differences(self) -> int:
        """How many differences were classified, explained or not: tensors dropped, added, resized or
        changed (a dtype label included), config keys, tensors rebuilt from a source (the unexplained lines
        of files and tokenizers are not counted here)."""
        found = (self.dropped, self.added, self.resized, self.changed, self.config, self.derived)
        return sum(map(len, found))

    def as_dict(self) -> dict:
        return {
            "explained": self.explained,
            "exit_code": int(self.exit_code),
            "identical_tensors": self.identical,
            "dropped": self.dropped,
            "added": self.added,
            "resized": self.resized,
            "changed": self.changed,
            "config_differences": self.config,
            "unexplained": self.unexplained,
            "notes": self.notes,
            "derived": self.derived,
            "training_state": self.training_state,
            "report": self.report,
            "report_checked": self.report_checked,
            "tokenizer": self.tokenizer,
            "logits": self.logits,
            "logits_compared": self.logits_compared if self.logits is not None else None,
        }
