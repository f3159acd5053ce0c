"""How long README's first command takes a new user: clone the committed tree into an empty temporary folder
(as ``.ci/run`` does), run README's first ```` ```bash ```` block there (the user install, ``pip install .``
into a fresh ``.venv``, then the main job on a shipped sample) and report the wall time, the CPU time of the
children (user + system), the number of packages installed and the size of ``.venv``.

``PIP_NO_CACHE_DIR=1`` unless ``--cache``: a new user's pip has nothing cached (the wheels still come from
whatever index pip is configured with). Rounds run one after another; each prints a line, then the medians.
Results go in ``bench/RESULTS.md`` ("README's first command").

    python3 bench/first_command.py -n 3          # from the root of a clone; needs git and network
"""

from __future__ import annotations

import argparse
import os
import re
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def first_block(readme: str) -> str:
    """README's first ```bash block, as ``.ci/run`` reads it."""
    m = re.search(r"^```bash\n(.*?)^```$", readme, re.S | re.M)
    if m is None:
        raise SystemExit("README.md has no ```bash block")
    return m.group(1)


def one_round(cmd: str, cache: bool) -> dict:
    """Clone, run ``cmd`` in the clone, measure; the temporary folder is removed."""
    with tempfile.TemporaryDirectory(prefix="tietool-first-") as tmp:
        clone = Path(tmp) / "tietool"
        subprocess.run(["git", "clone", "-q", "--no-hardlinks", str(ROOT), str(clone)], check=True)
        env = dict(os.environ)
        if not cache:
            env["PIP_NO_CACHE_DIR"] = "1"
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        t0 = time.monotonic()
        run = subprocess.run(["bash", "-euo", "pipefail", "-c", cmd], cwd=clone, env=env, capture_output=True)
        wall = time.monotonic() - t0
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        if run.returncode:
            sys.stderr.write(run.stdout.decode()[-2000:] + run.stderr.decode()[-2000:])
            raise SystemExit(f"README's first command exited {run.returncode}")
        cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
        pkgs = subprocess.run(
            [str(clone / ".venv/bin/python"), "-m", "pip", "list", "--format=freeze"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.split()
        size = sum(
            f.stat().st_size for f in (clone / ".venv").rglob("*") if f.is_file() and not f.is_symlink()
        )
        return {"wall_s": wall, "cpu_s": cpu, "packages": len(pkgs), "venv_mb": size / 1e6}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-n", type=int, default=1, help="rounds")
    ap.add_argument("--cache", action="store_true", help="let pip use its cache (a returning user)")
    args = ap.parse_args()
    cmd = first_block((ROOT / "README.md").read_text(encoding="utf-8"))
    print(f"README's first command: {cmd.strip()}")
    rounds = []
    for i in range(args.n):
        r = one_round(cmd, args.cache)
        rounds.append(r)
        print(
            f"round {i + 1}: {r['wall_s']:.1f} s wall, {r['cpu_s']:.1f} s CPU, {r['packages']} packages, "
            f"{r['venv_mb']:.0f} MB"
        )
    med = {k: statistics.median(r[k] for r in rounds) for k in rounds[0]}
    print(
        f"median of {args.n}: {med['wall_s']:.1f} s wall, {med['cpu_s']:.1f} s CPU, {med['packages']:.0f} "
        f"packages, {med['venv_mb']:.0f} MB"
    )


if __name__ == "__main__":
    main()
