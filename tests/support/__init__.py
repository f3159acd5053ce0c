"""Helpers for the tietool tests: independent checkpoint readers, CLI runners, input builders.

``tests/`` is on ``sys.path`` (pytest's default import mode; ``tests/`` has no ``__init__.py``), so a test
imports these as ``from support import fixture_support as fs``. Nothing here is installed.

* :mod:`support.paths` -- where the test data lives (``tests/data``; never outside the repository).
* :mod:`support.fixture_support` -- small readers for the fixtures, ``python -m tietool`` runs, the
  PaddleFormers logits oracle (:class:`~support.fixture_support.LiveLogits`).
* :mod:`support.resize_support` -- fixture metadata and helpers of the resize tests.
* :mod:`support.casecheck` -- the check vocabulary of ``tests/data/cases/README.md``.
* :mod:`support.adversarial_support`, :mod:`support.corrupt_corpus` -- bad inputs and their contract.
* :mod:`support.loader_table` -- README's loader table, generated from the architecture table.
* ``support/pf_logits_kw.py`` -- a script: ``tests/data/tools/pf_logits.py`` with ``from_pretrained``
  keyword arguments.
"""
