"""How a message tells a user to install one of tietool's optional extras.

tietool is installed from a clone (it is not on a package index), so ``pip install "tietool[tokenizer]"``
would fail with "no matching distribution"; the command that works is ``pip install ".[tokenizer]"`` run in
the clone (pyproject.toml lists the extras: ``tokenizer``, ``paddle``, ``remote``).
"""

from __future__ import annotations


def install_extra(extra: str) -> str:
    """The install command for ``extra`` (``"tokenizer"``, ``"paddle"``, ``"remote"``) as a message says it:
    ``pip install ".[tokenizer]" in the tietool clone``. Pure; raises nothing."""
    return f'pip install ".[{extra}]" in the tietool clone'
