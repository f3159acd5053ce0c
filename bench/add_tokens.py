#!/usr/bin/env python3
"""``tietool add-tokens`` of 8 tokens into the 6.5 GB benchmark checkpoint (issue 20), against ``cp -r`` and
``tietool resize`` (+8 rows) in the same run.

    python bench/make_checkpoints.py --layers 60      # once: bench/_work/ckpt_60l (6.46 GB, 128256 rows)
    python bench/add_tokens.py [-n 3]                 # alternating rounds, medians, table + ratios
    python bench/add_tokens.py --pf only              # the PaddleFormers route once (~18 GB of RAM)

Inputs (made once, untimed, in ``bench/_work``): two hard-linked copies (``cp -al``) of ``ckpt_60l``, each
with a real tokenizer beside it, written by transformers' ``save_pretrained``:

* ``tok_slack``: 128,000 tokens for 128,256 rows (256 slack rows: the 8 new tokens take slack rows, the
  model keeps its size);
* ``tok_full``: 128,256 tokens, as many as rows (no slack: the model grows by 8 rows).

The base vocabulary is a byte-level BPE (Llama-3 / Qwen2 style: ``tokenizers``' ``BpeTrainer`` with the
256-byte initial alphabet) of 127,998 tokens, trained on a generated corpus (seeded pseudo-words of syllables,
~10 s); ``tok_slack`` adds the special tokens ``<|begin_of_text|>`` and ``<|end_of_text|>`` (bos / eos),
``tok_full`` those and the 256 ``<|reserved_special_token_N|>`` of Llama-3. transformers 5 writes
``tokenizer.json`` and ``tokenizer_config.json`` (``extra_special_tokens``); the config then gets the
``added_tokens_decoder`` and ``tokenizer_class: PreTrainedTokenizerFast`` that transformers 4.x writes and
most published checkpoints carry, so both styles of key are present for add-tokens to keep in step.

Per round, alternating (order rotated every round), one child process each, with ``run.py``'s machinery
(warm input, writeback settled, peak RSS under ``/usr/bin/time -v``, RssAnon / RssFile sampled): ``cp -r``,
``tietool resize --vocab 128264 --out`` (+8 rows), ``tietool add-tokens CKPT <8 tokens> --out`` on each
variant, and ``add-tokens`` in place on a fresh ``cp -al`` working copy of each variant (``inplace.py``'s),
where the files whose inode changed are counted (the rewritten ones; the others are still the input's
hard links). Every output is checked (rows, config, each new token's id in the output's ``tokenizer.json``).

Touched bytes (the memory goal, peak RSS under 2 x touched + 150 MB): the bytes of the vocabulary tensors
the edit writes, i.e. every tensor of the *output* with an axis of the output's rows (its shard headers),
which here are the embedding and the head the output keeps; the input's embedding + head (``run.py``'s
convention, 2 x 525 MB) are printed beside it.

Nothing here imports tietool: it runs as ``python -m tietool`` with PYTHONPATH a folder whose ``tietool``
entry is the tree measured (``--pkg``; default a symlink to this repository made in ``bench/_work/pkg``).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import time
from pathlib import Path

from inplace import _fresh
from run import MB, ROOT, WORK, clean, mem_available, run_child, settle, tensors_of, warm

TOKENS = [
    "<|im_start|>",
    "<|im_end|>",
    "<think>",
    "</think>",
    "<tool_call>",
    "</tool_call>",
    "<|pad|>",
    "<|eot|>",
]
ROWS = 128256
BASE = 127998  # BPE tokens; + 2 specials = 128,000 (slack), + 258 = 128,256 (full)
VARIANTS = {"slack": 128000, "full": 128256}
RESIZE_TO = ROWS + len(TOKENS)
OUT = WORK / "out"


# ---------------------------------------------------------------- inputs (untimed, once)


def _corpus(n_lines: int = 20000):
    """Seeded pseudo-words (1-5 syllables) from a 300,000-word lexicon, half Zipf-like, half uniform."""
    rng = random.Random(0)
    syl = [a + b for a in "bcdfghjklmnprstvwz" for b in "aeiou"] + list("aeiou")
    lex: set[str] = set()
    while len(lex) < 300000:
        lex.add("".join(rng.choice(syl) for _ in range(rng.randint(1, 5))))
    words = sorted(lex)
    rng.shuffle(words)
    r = random.Random(1)
    for _ in range(n_lines):
        yield " ".join(
            words[min(int(r.paretovariate(0.7)) - 1, len(words) - 1)] if r.random() < 0.5 else r.choice(words)
            for _ in range(200)
        )


def _train_bpe():
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tr = trainers.BpeTrainer(
        vocab_size=BASE, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False
    )
    tok.train_from_iterator(_corpus(), tr)
    if tok.get_vocab_size() != BASE:
        raise SystemExit(f"BPE training reached {tok.get_vocab_size()} tokens, not {BASE}")
    return tok


def _write_tokenizer(base, folder: Path, n_tokens: int) -> None:
    """transformers' save_pretrained of ``base`` + specials up to ``n_tokens``, then the 4.x config keys."""
    from tokenizers import Tokenizer
    from transformers import PreTrainedTokenizerFast

    t = PreTrainedTokenizerFast(
        tokenizer_object=Tokenizer.from_str(base.to_str()),
        bos_token="<|begin_of_text|>",
        eos_token="<|end_of_text|>",
    )
    extra = [f"<|reserved_special_token_{i}|>" for i in range(n_tokens - BASE - 2)]
    if extra:
        t.add_special_tokens({"additional_special_tokens": extra})
    if len(t) != n_tokens:
        raise SystemExit(f"tokenizer has {len(t)} tokens, not {n_tokens}")
    t.save_pretrained(str(folder))
    cfg_path = folder / "tokenizer_config.json"
    cfg = json.loads(cfg_path.read_text())
    added = json.loads((folder / "tokenizer.json").read_text())["added_tokens"]
    keys = ("content", "lstrip", "normalized", "rstrip", "single_word", "special")
    cfg["added_tokens_decoder"] = {str(a["id"]): {k: a[k] for k in keys} for a in added}
    cfg["tokenizer_class"] = "PreTrainedTokenizerFast"
    cfg_path.write_text(json.dumps(cfg, indent=2, ensure_ascii=False) + "\n")


def prepare(ckpt: Path) -> dict[str, Path]:
    """``tok_slack`` and ``tok_full``: ``cp -al`` of ``ckpt`` with a tokenizer of 128,000 / 128,256 tokens."""
    dirs = {v: WORK / f"tok_{v}" for v in VARIANTS}
    ready = {v: WORK / f".tok_{v}.ready" for v in VARIANTS}
    if all(r.exists() for r in ready.values()):
        return dirs
    t0 = time.perf_counter()
    base = _train_bpe()
    print(f"trained byte-level BPE of {BASE} tokens in {time.perf_counter() - t0:.1f} s", flush=True)
    for v, d in dirs.items():
        clean(d)
        subprocess.run(["cp", "-al", str(ckpt), str(d)], check=True)
        _write_tokenizer(base, d, VARIANTS[v])
        ready[v].write_text("")
    return dirs


def _pkg(arg: Path | None) -> Path:
    """A folder whose ``tietool`` entry is the tree to run (for PYTHONPATH)."""
    if arg is not None:
        return arg
    pkg = WORK / "pkg"
    pkg.mkdir(parents=True, exist_ok=True)
    link = pkg / "tietool"
    if not link.is_symlink() or link.resolve() != ROOT:
        link.unlink(missing_ok=True)
        link.symlink_to(ROOT)
    return pkg


# ---------------------------------------------------------------- cases and checks


def cases(
    py: str, dirs: dict[str, Path], extra: list[str], resize_init: list[str]
) -> dict[str, tuple[list[str], str | None]]:
    """label → (argv, the variant whose fresh working copy the case edits in place, or None)."""
    tool = [py, "-m", "tietool"]
    add = ["add-tokens", *extra]
    c: dict[str, tuple[list[str], str | None]] = {
        "cp -r": (["cp", "-r", str(dirs["slack"]), str(OUT)], None),
        "resize --out (+8 rows)": (
            [*tool, "resize", str(dirs["slack"]), "--vocab", str(RESIZE_TO), "--seed", "0", "--out", str(OUT)]
            + [*resize_init, "-q"],
            None,
        ),
    }
    for v in VARIANTS:
        c[f"add-tokens --out ({v})"] = (
            [*tool, add[0], str(dirs[v]), *TOKENS, *add[1:], "--out", str(OUT)],
            None,
        )
    for v in VARIANTS:
        c[f"add-tokens in place ({v})"] = ([*tool, add[0], str(WORK / f"ip_{v}"), *TOKENS, *add[1:]], v)
    # same-run references for in place: resize in place, and the floor of an edit that rewrites the
    # embedding's shard and the tokenizer files (a durable copy of those)
    resize_ip = [*tool, "resize", str(WORK / "ip_slack"), "--vocab", str(RESIZE_TO), "--seed", "0", "-q"]
    resize_ip += resize_init
    c["resize in place (+8 rows)"] = (resize_ip, "slack")
    index = json.loads((dirs["slack"] / "model.safetensors.index.json").read_text())["weight_map"]
    files = [dirs["slack"] / index["model.embed_tokens.weight"]]
    files += [dirs["slack"] / n for n in ("tokenizer.json", "tokenizer_config.json")]
    copy = f'mkdir -p "{OUT}" && cp {" ".join(map(str, files))} "{OUT}/" && sync "{OUT}"/*'
    c["cp embedding shard + tokenizer + fsync"] = (["sh", "-c", copy], None)
    return c


def inodes(folder: Path) -> dict[str, int]:
    return {str(p.relative_to(folder)): p.stat().st_ino for p in folder.rglob("*") if p.is_file()}


def vocab_bytes(folder: Path) -> tuple[int, int]:
    """(rows of the embedding, bytes of every tensor with an axis of that many rows) of ``folder``."""
    ts = tensors_of(folder)
    rows = ts["model.embed_tokens.weight"]["shape"][0]
    return rows, sum(t["nbytes"] for t in ts.values() if rows in t["shape"])


def check(label: str, folder: Path, n_before: int | None) -> str | None:
    """None when ``folder`` is what ``label`` should make, else what is wrong (untimed)."""
    try:
        if label.startswith("cp"):
            return None
        cfg = json.loads((folder / "config.json").read_text())
        rows, _ = vocab_bytes(folder)
        if label.startswith("resize"):
            want = RESIZE_TO
        else:
            want = max(ROWS, n_before + len(TOKENS))  # type: ignore[operator]
        if rows < want or cfg.get("vocab_size") != rows:
            return f"rows {rows}, config vocab_size {cfg.get('vocab_size')}, want {want}"
        if label.startswith("add-tokens"):
            from tokenizers import Tokenizer

            tok = Tokenizer.from_file(str(folder / "tokenizer.json"))
            got = [tok.token_to_id(t) for t in TOKENS]
            if got != list(range(n_before, n_before + len(TOKENS))):  # type: ignore[operator]
                return f"new ids {got}"
            if tok.get_vocab_size(with_added_tokens=True) > rows:
                return f"tokenizer {tok.get_vocab_size(with_added_tokens=True)} > rows {rows}"
            dec = json.loads((folder / "tokenizer_config.json").read_text())["added_tokens_decoder"]
            if [dec.get(str(i), {}).get("content") for i in got] != TOKENS:
                return "tokenizer_config.json added_tokens_decoder lacks the new tokens"
        return None
    except Exception as e:  # noqa: BLE001
        return f"{type(e).__name__}: {e}"


# ---------------------------------------------------------------- running


def one(label: str, argv: list[str], variant: str | None, dirs: dict[str, Path], env: dict) -> dict:
    clean(OUT)
    work = WORK / f"ip_{variant}" if variant else None
    before = inodes(_fresh(dirs[variant], work)) if work else None
    os.sync()
    warm([dirs["slack"]])  # its shards are ckpt's and tok_full's (hard links): one read warms all three
    settle()
    r = run_child(argv, env=env, cwd=WORK)
    r["load"] = os.getloadavg()[0]
    res = work or OUT
    v = variant or next((x for x in VARIANTS if f"({x})" in label), "slack")
    r["problem"] = f"exit {r['rc']}: {r['log_tail'][-400:]}" if r["rc"] else check(label, res, VARIANTS[v])
    if not r["problem"] and not label.startswith("cp"):
        r["rows"], r["touched"] = vocab_bytes(res)
    if before is not None and work is not None and not r["problem"]:
        after, old = inodes(work), set(before.values())  # a renamed hard link keeps its inode: not rewritten
        r["rewritten"] = sorted(n for n, i in after.items() if i not in old)
        r["kept"] = sum(1 for i in after.values() if i in old)
        r["renamed"] = sorted(n for n, i in after.items() if i in old and before.get(n) != i)
    clean(OUT)
    return r


def med(runs: list[dict], key: str = "wall") -> float | None:
    xs = [r[key] for r in runs if not r.get("problem")]
    return statistics.median(xs) if xs else None


def table(runs: dict[str, list[dict]], input_touched: int) -> list[str]:
    f = lambda x, nd=2: "—" if x is None else f"{x:.{nd}f}"  # noqa: E731
    lines = [
        "| case | wall s (median; each round) | peak RSS MB | anon / file MB | touched MB | RSS / (2 x "
        "touched + 150 MB) | files rewritten (in place) |",
        "|---|---|---|---|---|---|---|",
    ]
    for label, rs in runs.items():
        ok = [r for r in rs if not r.get("problem")]
        if not ok:
            lines.append(f"| {label} | failed: {rs[0].get('problem', '')[:120].strip()} | | | | | |")
            continue
        rss, touched = med(ok, "rss"), ok[0].get("touched")
        lim = "" if not touched else f"{rss / (2 * touched + 150 * MB):.2f}"
        rew = ok[0].get("rewritten")
        rew_s = (
            ""
            if rew is None
            else f"{len(rew)} ({', '.join(rew)}); {ok[0]['kept']} kept ({len(ok[0]['renamed'])} renamed)"
        )
        lines.append(
            f"| {label} | {f(med(ok))} ({', '.join(f(r['wall']) for r in rs)}) | {rss / MB:,.0f} | "
            f"{med(ok, 'anon') / MB:,.0f} / {med(ok, 'file') / MB:,.0f} | "
            f"{'' if not touched else f'{touched / MB:,.0f}'} | {lim} | "
            f"{rew_s} |"
        )
    m = {k: med(v) for k, v in runs.items()}
    lines += ["", "| ratio (medians of the same run) | value | goal |", "|---|---|---|"]
    for v in VARIANTS:
        a, rz, cp = m.get(f"add-tokens --out ({v})"), m.get("resize --out (+8 rows)"), m.get("cp -r")
        ip = m.get(f"add-tokens in place ({v})")
        lines.append(f"| add-tokens --out ({v}) / resize --out | {_r(a, rz)} | ≤ 1.1x |")
        lines.append(f"| add-tokens --out ({v}) / cp -r | {_r(a, cp)} | |")
        lines.append(f"| add-tokens in place ({v}) / cp -r | {_r(ip, cp)} | only the touched shards |")
    lines.append(f"| resize --out / cp -r | {_r(m.get('resize --out (+8 rows)'), m.get('cp -r'))} | |")
    floor, rz_ip = m.get("cp embedding shard + tokenizer + fsync"), m.get("resize in place (+8 rows)")
    for v in VARIANTS:
        ip = m.get(f"add-tokens in place ({v})")
        lines.append(f"| add-tokens in place ({v}) / resize in place | {_r(ip, rz_ip)} | |")
        lines.append(f"| add-tokens in place ({v}) / cp of the rewritten files + fsync | {_r(ip, floor)} | |")
    lines.append(f"\nInput embedding + head (run.py's touched bytes): {input_touched / MB:,.0f} MB.")
    return lines


def _r(a: float | None, b: float | None) -> str:
    return "—" if a is None or not b else f"{a / b:.2f}x"


def pf_route(py: str, dirs: dict[str, Path], env: dict, min_free_gb: float) -> dict:
    """The PaddleFormers route once on ``tok_full`` (its rows run out: the recipe grows the model by 8)."""
    free = mem_available() / 1e9
    if free < min_free_gb:
        print(f"PaddleFormers route skipped: MemAvailable {free:.1f} GB < {min_free_gb} GB", flush=True)
        return {"skipped": f"MemAvailable {free:.1f} GB < {min_free_gb} GB"}
    argv = [py, str(Path(__file__).parent / "pf_route.py"), "add-tokens", str(dirs["full"]), str(OUT)]
    argv += ["--tokens", *TOKENS, "--special"]
    clean(OUT)
    os.sync()
    warm([dirs["full"]])
    settle()
    r = run_child(argv, env=env, cwd=WORK)
    r["load"] = os.getloadavg()[0]
    r["problem"] = f"exit {r['rc']}: {r['log_tail'][-600:]}" if r["rc"] else None
    r["phases"] = r["log_tail"].strip().splitlines()[-1] if r["rc"] == 0 else None
    clean(OUT)
    return r


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-n", "--repeat", type=int, default=3)
    ap.add_argument("--python", default=sys.executable)
    ap.add_argument("--pkg", type=Path, help="PYTHONPATH folder whose tietool entry is the tree to run")
    ap.add_argument("--init", help="add-tokens --init (default: add-tokens' own default)")
    ap.add_argument("--no-special", action="store_true", help="add the 8 tokens without --special")
    ap.add_argument("--resize-init", help="resize --init of the reference cases (default: resize's own)")
    ap.add_argument("--only", action="append", help="run only cases whose label contains this (repeatable)")
    ap.add_argument("--results", default="add_tokens", help="name of the results files in bench/_work/")
    ap.add_argument("--pf", choices=["no", "also", "only"], default="no", help="the PaddleFormers route once")
    ap.add_argument("--pf-min-free-gb", type=float, default=20.0)
    a = ap.parse_args()
    ckpt = WORK / "ckpt_60l"
    if not (ckpt / "config.json").exists():
        print(f"{ckpt} is missing: run bench/make_checkpoints.py --layers 60 first", file=sys.stderr)
        return 2
    dirs = prepare(ckpt)
    env = {"PYTHONPATH": str(_pkg(a.pkg)), "PATH": "/usr/bin:/bin", "CUDA_VISIBLE_DEVICES": ""}
    extra = ([] if a.no_special else ["--special"]) + (["--init", a.init] if a.init else []) + ["--seed", "0"]
    info: dict = {"load_start": os.getloadavg(), "tokens": TOKENS, "extra": extra, "runs": {}}
    info["resize_init"] = a.resize_init or "resize's default"
    info["git_head"] = subprocess.run(
        ["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True, text=True
    ).stdout.strip()
    print(f"tietool {info['git_head']}, load average {info['load_start']}", flush=True)
    cs = cases(a.python, dirs, extra + ["-q"], ["--init", a.resize_init] if a.resize_init else [])
    cs = {k: v for k, v in cs.items() if not a.only or any(o in k for o in a.only)}
    runs: dict[str, list[dict]] = {k: [] for k in cs}
    for rep in range(a.repeat if a.pf != "only" else 0):
        order = list(cs)[rep % len(cs) :] + list(cs)[: rep % len(cs)]
        for label in order:
            argv, variant = cs[label]
            r = one(label, argv, variant, dirs, env)
            runs[label].append(r)
            print(
                f"round {rep + 1} {label:>28}: {r['wall']:6.2f} s {r['rss'] / MB:7.0f} MB (anon "
                f"{r['anon'] / MB:.0f}, file {r['file'] / MB:.0f}) load {r['load']:.1f}"
                + (f" rewritten {r['rewritten']}" if "rewritten" in r else "")
                + (f"  PROBLEM: {r['problem']}" if r["problem"] else ""),
                flush=True,
            )
    name = a.results
    if a.pf != "no":
        info["pf"] = pf_route(a.python, dirs, env, a.pf_min_free_gb)
        print("PaddleFormers route:", json.dumps({k: v for k, v in info["pf"].items() if k != "log_tail"}))
        name += "_pf" if a.pf == "only" else ""
    info["load_end"] = os.getloadavg()
    info["runs"] = runs
    ts = tensors_of(ckpt)
    lines = [] if a.pf == "only" else table(runs, sum(ts[n]["nbytes"] for n in ts if ROWS in ts[n]["shape"]))
    lines.append(f"\nLoad average (1, 5, 15 min): start {info['load_start']}, end {info['load_end']}.")
    (WORK / f"{name}.json").write_text(json.dumps(info, indent=1, default=str))
    (WORK / f"{name}.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    for p in WORK.glob("ip_*"):
        clean(p)
    problems = [r for rs in runs.values() for r in rs if r.get("problem")]
    return 1 if problems or (info.get("pf") or {}).get("problem") else 0


if __name__ == "__main__":
    raise SystemExit(main())
