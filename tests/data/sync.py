#!/usr/bin/env python3
"""Keep tests/data in step with the shared test data it copies.

usage: python tests/data/sync.py [--shared PATH] [--check]

Copies ``PATH/fixtures/`` to ``tests/data/fixtures/``, ``PATH/cases/`` to ``tests/data/cases/`` and
``PATH/tools/pf_logits.py`` to ``tests/data/tools/pf_logits.py``, removes what no longer exists there, and
prints every file it adds, updates or removes. ``--shared`` defaults to ``../shared`` beside the repository.
``--check`` changes nothing and exits 1 when the copies are out of sync (0 when they are not).

Run it by hand when the shared data changes (new cases, new fixtures); the tests never run it and never read
anything outside the repository.
"""

from __future__ import annotations

import argparse
import shutil
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent  # tests/data
REPO = HERE.parents[1]
# (path under --shared, path under tests/data): folders are mirrored, files copied
ITEMS = [("fixtures", "fixtures"), ("cases", "cases"), ("tools/pf_logits.py", "tools/pf_logits.py")]


def files_below(root: Path) -> dict[str, Path]:
    """Relative path -> file, for a file or every file below a folder (nothing when it does not exist)."""
    if root.is_file():
        return {"": root}
    if not root.is_dir():
        return {}
    return {
        p.relative_to(root).as_posix(): p
        for p in sorted(root.rglob("*"))
        if p.is_file() and "__pycache__" not in p.parts
    }


def plan(src: Path, dst: Path) -> list[tuple[str, Path, Path | None]]:
    """The changes that make ``dst`` a copy of ``src``: (what, destination file, source file or None)."""
    have, want = files_below(dst), files_below(src)
    changes: list[tuple[str, Path, Path | None]] = []
    for rel, s in want.items():
        d = dst / rel if rel else dst
        if rel not in have:
            changes.append(("added", d, s))
        elif have[rel].read_bytes() != s.read_bytes():
            changes.append(("updated", d, s))
    changes += [("removed", p, None) for rel, p in have.items() if rel not in want]
    return changes


def remove_empty_dirs(root: Path) -> None:
    if not root.is_dir():
        return
    for d in sorted((p for p in root.rglob("*") if p.is_dir()), key=lambda p: len(p.parts), reverse=True):
        if not any(d.iterdir()):
            d.rmdir()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shared", type=Path, default=REPO.parent / "shared", help="default: ../shared")
    ap.add_argument("--check", action="store_true", help="change nothing; exit 1 when out of sync")
    args = ap.parse_args(argv)
    shared = args.shared.resolve()
    missing = [s for s, _ in ITEMS if not (shared / s).exists()]
    if missing:
        print(f"sync: {shared} has no {', '.join(missing)}", file=sys.stderr)
        return 2
    changes = [c for s, d in ITEMS for c in plan(shared / s, HERE / d)]
    for what, dst, src in changes:
        print(f"{what:8} {dst.relative_to(REPO)}")
        if args.check:
            continue
        if src is None:
            dst.unlink()
        else:
            dst.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(src, dst)  # contents only: the shared files are read-only, the copies are not
    if not args.check:
        for _, d in ITEMS:
            remove_empty_dirs(HERE / d)
    print(f"{len(changes)} file(s) {'out of sync' if args.check else 'changed'} (from {shared})")
    return 1 if args.check and changes else 0


if __name__ == "__main__":
    sys.exit(main())
