"""The harness's cases (``bench/harness.py``): each benchmark of ``bench/`` as a command, an input, a budget.

Groups (the former scripts they replace, whose measurement and budget each keeps):

* ``startup/`` — ``tietool --help``, ``inspect --no-values`` (headers only: start-up, ≤ 0.5 s on the 6.5 GB
  checkpoint), ``inspect`` (values compared, ≤ 1.2 s) (``run.py``'s start-up rows)
* ``copy/`` — the baselines: ``cp -r`` and ``cp -r`` + ``sync`` of the input; tietool's ``copy_file`` from 1,
  2, 4, 8 threads and cut in 256 MiB pieces (``copy_threads.py``: why ``COPY_THREADS`` is what it is)
* ``ops/`` — ``tie``, ``untie``, ``resize`` (+256 rows) with ``--out``, and with ``--link`` (``run.py``):
  each ≤ 1.1 × ``cp -r``, peak RSS ≤ 2 × touched (embedding + head) + 150 MB
* ``inplace/`` — ``tie`` and ``resize`` in place on a fresh hard-linked copy, against ``cp -r`` (tie ≤ 0.1 ×)
  and a durable ``cp`` of the two shards resize rewrites (``inplace.py``)
* ``convert/`` — ``convert --to paddlenlp``: peak RSS ≤ 2 × the largest tensor + 150 MB
  (``convert_memory.py``)
* ``diff/`` — ``diff`` of the input against a full copy with one bit of one embedding row flipped (must exit
  1 naming exactly that row) ≤ 1.2 × reading both once, RSS ≤ 2 × largest + 150 MB; ``diff A A`` (``diff.py``)
* ``verify/`` — ``verify`` of the input against its ``tie`` and ``resize`` outputs and itself: peak RSS
  ≤ 200 MB at any size (``verify_memory.py``; its old-commit baseline is now ``--before``)
* ``flex/`` — ``merge`` of a flex checkpoint ≤ 1.5 × ``cp -r`` of it, RSS ≤ 2 × largest + 150 MB
  (``flex_merge.py``); ``resize --keep-training-state`` of a Trainer ``checkpoint-N/`` with optimizer state,
  RSS ≤ 2 × its largest fp32 moment + 150 MB (``flex_resize.py``, whose ``make`` builds that input)
* ``tokens/`` — ``add-tokens`` of 8 special tokens ``--out`` ≤ 1.1 × ``resize --out`` of +8 rows
  (``add_tokens.py``, whose ``prepare`` builds the tokenizer inputs)
* ``vocab/`` — ``prune`` to a 32k keep-list and ``transplant`` of a 32k SentencePiece donor, each ≤ 1.5 ×
  ``cp -r``, on a PaddleFormers-written Llama with a real 128k tokenizer (``vocab128k.py``, whose
  docstring says where the files come from: ``TIETOOL_BENCH_TOKENIZER_128K`` and ``TIETOOL_BENCH_DONOR``;
  skipped without them; at tiny the repository's real test tokenizers)
* ``walk/`` — the ``.pdparams`` opcode walker over every real ``.pdparams`` in ``tests/data`` and a synthetic
  many-tensor file, in process, against ``pickletools.genops`` over the same bytes (``pdparams_walk.py``);
  the same over every real flex ``.metadata`` and a paddle-style one of 28,800 slices (``-metadata``)
* ``remote/``, ``pf/``, ``first/`` — object storage against local (``remote.py``, needs moto), the
  PaddleFormers route (``pf_route.py``, needs paddleformers), README's first command (``first_command.py``,
  needs the network): their scripts run as the case's child, which measures inside

Inputs are built on first use and cached under ``bench/_work`` (``--size tiny`` under ``bench/_work/tiny``).
"""

from __future__ import annotations

import importlib.util
import io
import json
import os
import pickletools
import shutil
import struct
import subprocess
import sys
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from add_tokens import TOKENS
from harness import BENCH, ROOT, WORK, Budget, Case, Ctx, clean, package_folder

EMB, HEAD = "model.embed_tokens.weight", "lm_head.weight"
ROW = 1234  # the embedding row diff's copy changes (row 12 at --size tiny)
SAMPLES = ROOT / "sample_checkpoints"


# ---------------------------------------------------------------- inputs


def _dir(size: str) -> Path:
    d = WORK / "tiny" if size == "tiny" else WORK
    d.mkdir(parents=True, exist_ok=True)
    return d


def _tool(*args: str) -> None:
    """Run this tree's tietool (untimed, to make an input); fail loudly."""
    env = dict(os.environ, PYTHONPATH=str(package_folder(ROOT)))
    r = subprocess.run([sys.executable, "-m", "tietool", *args], env=env, capture_output=True, text=True)
    if r.returncode:
        raise SystemExit(f"tietool {' '.join(args)} failed: {r.stdout[-1000:]}{r.stderr[-1000:]}")


def _made(path: Path, make: Callable[[Path], None]) -> Path:
    """``path`` if it exists, else made by ``make(tmp)`` then renamed (an interrupted build is redone)."""
    if not path.exists():
        tmp = path.with_name(path.name + ".partial")
        clean(tmp)
        make(tmp)
        tmp.rename(path)
    return path


def llama(size: str) -> Path:
    """The benchmark Llama (``make_checkpoints.py``): 2 or 60 layers, or the 2-layer one at tiny shapes."""
    sys.path.insert(0, str(BENCH))
    import make_checkpoints as mc

    if size == "tiny":
        return _made(_dir(size) / "ckpt_2l", lambda t: mc.build_tiny(2, t))
    layers = int(size[:-1])
    return _made(WORK / f"ckpt_{size}", lambda t: mc.build(layers, t))


def llama_tied(size: str) -> Path:
    """``tie`` of :func:`llama` (the input of ``untie``)."""
    return _made(
        _dir(size) / f"ckpt_{size}_tied", lambda t: _tool("tie", str(llama(size)), "--out", str(t), "-q")
    )


def llama_resized(size: str) -> Path:
    """``resize`` of :func:`llama` by +256 rows (the second output ``verify`` checks)."""
    v = str(vocab(llama(size)) + 256)
    args = ["resize", str(llama(size)), "--vocab", v, "--init", "zeros", "-q"]
    return _made(_dir(size) / f"ckpt_{size}_resized", lambda t: _tool(*args, "--out", str(t)))


def llama_changed(size: str) -> Path:
    """A full copy (``cp``, not linked) of :func:`llama` with one bit of embedding row :data:`ROW` flipped."""

    def make(tmp: Path) -> None:
        subprocess.run(["cp", "-r", "--reflink=never", str(llama(size)), str(tmp)], check=True)
        index = json.loads((tmp / "model.safetensors.index.json").read_text())
        f = tmp / index["weight_map"][EMB]
        n, head = _header(f)
        t = head[EMB]
        row_bytes = (t["data_offsets"][1] - t["data_offsets"][0]) // t["shape"][0]
        at = 8 + n + t["data_offsets"][0] + diff_row(size) * row_bytes + 1  # bf16 high byte: a value bit
        with open(f, "r+b") as fh:
            fh.seek(at)
            b = fh.read(1)[0]
            fh.seek(at)
            fh.write(bytes([b ^ 0x01]))

    return _made(_dir(size) / f"ckpt_{size}_changed", make)


def flex(size: str) -> Path:
    """A flex checkpoint: ``make_flex.py``'s 4-rank one of :func:`llama` (needs paddle), or at tiny the
    shipped Trainer sample's ``checkpoint-2``."""
    if size == "tiny":
        return _copy(SAMPLES / "pf_llama_trainer", _dir(size) / "flex") / "checkpoint-2"
    return WORK / f"flex_{size}" / "checkpoint-1"


def flex_state(size: str) -> Path:
    """A Trainer ``checkpoint-N/`` with ``optimizer_state/`` + ``master_weight/``: at tiny the shipped
    sample; else ``make_flex.py --paddle-layout``'s with ``flex_resize.make`` (written once)."""
    if size == "tiny":
        return flex(size)
    ck = WORK / f"flex_{size}_paddle" / "checkpoint-1"
    if (ck / "model_state").is_dir() and not (ck / "optimizer_state").exists():
        sys.path.insert(0, str(BENCH))
        import flex_resize

        flex_resize.make(ck)
    return ck


def tok(size: str) -> Path:
    """:func:`llama` with a tokenizer of 256 rows fewer than the model (``add_tokens.prepare``: a trained
    byte-level BPE, needs tokenizers + transformers), or at tiny the shipped sample with a tokenizer."""
    if size == "tiny":
        return _copy(SAMPLES / "pf_llama_with_tokenizer", _dir(size) / "tok")
    import add_tokens

    return add_tokens.prepare(llama(size))["slack"]


def vocab128k(size: str) -> Path:
    """A PaddleFormers-written Llama with a real 128k tokenizer (``vocab128k.checkpoint``: needs paddle,
    transformers and ``TIETOOL_BENCH_TOKENIZER_128K``), or at tiny the shipped sample with a tokenizer (the
    repository's real byte-level BPE test tokenizer)."""
    if size == "tiny":
        return _copy(SAMPLES / "pf_llama_with_tokenizer", _dir(size) / "vocab128k")
    import vocab128k as v

    return v.checkpoint()


def keep32k(size: str) -> Path:
    """The keep-list of ``vocab/prune-128k`` (``vocab128k.keep_list``): the merge closure of the first ids,
    31,744 ids (+ the 256 specials ``--keep-special`` adds: 32,000); 200 at tiny."""
    import vocab128k as v

    return v.keep_list(vocab128k(size), 200 if size == "tiny" else v.KEEP - 256, "keep_32k.json")


def donor32k(size: str) -> Path:
    """The donor tokenizer of ``vocab/transplant-128k``: ``TIETOOL_BENCH_DONOR``'s (``vocab128k.donor``), or
    at tiny the repository's SentencePiece BPE test tokenizer (``tests/data/tokenizers/sp_bpe``)."""
    if size == "tiny":
        return _copy(ROOT / "tests" / "data" / "tokenizers" / "sp_bpe", _dir(size) / "donor32k")
    import vocab128k as v

    return v.donor()


def pdparams_files(size: str) -> Path:
    """A folder of ``.pdparams``: every real one under ``tests/data`` (linked) and a synthetic file of many
    small tensors written by tietool's writer (20,000; 2,000 at tiny)."""

    def make(tmp: Path) -> None:
        tmp.mkdir(parents=True)
        for i, p in enumerate(sorted((ROOT / "tests" / "data").rglob("*.pdparams"))):
            if p.is_file():
                (tmp / f"{i:04d}_{p.name}").symlink_to(p)
        _synthetic(tmp / "many.pdparams", 2_000 if size == "tiny" else 20_000)

    return _made(_dir(size) / "pdparams_files", make)


def _synthetic(dest: Path, n: int) -> None:
    import numpy as np

    sys.path.insert(0, str(package_folder(ROOT)))
    from tietool.surgery.io import pdparams
    from tietool.surgery.io.safetensors_io import Source

    rows = []
    for i in range(n):
        a = np.full((4, 8) if i % 2 else (16,), i % 7, dtype=np.float32)
        rows.append((f"llama.layers.{i}.weight", "float32", a.shape, Source(array=a), None, False))
    names = {r[0]: f"w_{i}" for i, r in enumerate(rows)}
    pdparams.write_file(dest, rows, {"StructuredToParameterName@@": names})


def metadata_files(size: str) -> Path:
    """A folder of flex ``.metadata``: every real one under ``tests/data`` (linked; not the hostile ones)
    and a synthetic one as paddle writes it for 3,600 tensors of 8 slices each (28,800 slices, 2.9 MB,
    1.4 M opcodes; 360 tensors at tiny): :func:`_paddle_metadata`."""

    def make(tmp: Path) -> None:
        tmp.mkdir(parents=True)
        for i, p in enumerate(sorted((ROOT / "tests" / "data").rglob("*.metadata"))):
            if p.is_file() and "hostile" not in p.parts:
                (tmp / f"{i:04d}_{p.name}").symlink_to(p)
        (tmp / "many.metadata").write_bytes(_paddle_metadata(360 if size == "tiny" else 3_600, 8))

    return _made(_dir(size) / "metadata_files", make)


def _paddle_metadata(n_tensors: int, ranks: int) -> bytes:
    """``pickle.dumps(Metadata, protocol=4)`` of paddle's three flex records (the dataclasses of
    ``paddle.distributed.flex_checkpoint.dcp.metadata``, here stand-ins registered under that module's name
    only while pickling: paddle is not needed), every tensor cut in ``ranks`` row blocks. Not
    :func:`surgery.io.flex_write.write_metadata`: its emitter memoizes strings and records only, Python's
    pickle every tuple too, and the walker is measured on the bytes paddle itself writes."""
    import pickle
    import types
    from dataclasses import dataclass

    module = "paddle.distributed.flex_checkpoint.dcp.metadata"

    @dataclass(frozen=True)
    class LocalTensorIndex:
        tensor_key: str
        global_offset: tuple
        is_flattened: bool = False
        flattened_range: object = None
        replica_id: object = None
        local_shape: object = None

    @dataclass(frozen=True)
    class LocalTensorMetadata:
        global_offset: tuple
        local_shape: tuple
        dtype: str
        global_shape: tuple
        is_flattened: bool = False
        flattened_range: object = None

    @dataclass
    class Metadata:
        state_dict_metadata: dict
        storage_metadata: dict
        flat_mapping: dict

    mod = types.ModuleType(module)
    for c in (LocalTensorIndex, LocalTensorMetadata, Metadata):
        c.__module__, c.__qualname__ = module, c.__name__
        setattr(mod, c.__name__, c)
    sdm: dict = {}
    stm: dict = {}
    for i in range(n_tensors):
        name = f"llama.layers.{i // 9}.mlp.w{i % 9}.weight"
        shape = (4096, 11008) if i % 9 < 7 else (4096,)
        for r in range(ranks):
            off = (r * shape[0] // ranks,) + (0,) * (len(shape) - 1)
            local = (shape[0] // ranks,) + shape[1:]
            sdm.setdefault(name, []).append(LocalTensorMetadata(off, local, "bfloat16", shape))
            stm[LocalTensorIndex(name, off, local_shape=local)] = f"{r}_0.distcp"
    sys.modules[module] = mod
    try:
        return pickle.dumps(Metadata(sdm, stm, {k: (k,) for k in sdm}), protocol=4)
    finally:
        del sys.modules[module]


def _copy(src: Path, dst: Path) -> Path:
    """A copy of a shipped sample under ``_work`` (inputs are never the repository's own files)."""
    return _made(dst, lambda t: shutil.copytree(src, t, symlinks=True))


INPUTS: dict[str, Callable[[str], Path]] = {
    "llama": llama,
    "llama_tied": llama_tied,
    "llama_resized": llama_resized,
    "llama_changed": llama_changed,
    "flex": flex,
    "flex_state": flex_state,
    "tok": tok,
    "pdparams_files": pdparams_files,
    "metadata_files": metadata_files,
    "vocab128k": vocab128k,
    "keep32k": keep32k,
    "donor32k": donor32k,
    "repo": lambda size: ROOT,
}


# ---------------------------------------------------------------- facts of an input


def _header(f: Path) -> tuple[int, dict]:
    with open(f, "rb") as fh:
        (n,) = struct.unpack("<Q", fh.read(8))
        return n, json.loads(fh.read(n))


def vocab(ckpt: Path) -> int:
    return int(json.loads((ckpt / "config.json").read_text())["vocab_size"])


def diff_row(size: str) -> int:
    return 12 if size == "tiny" else ROW


def largest_tensor(folder: Path) -> int | None:
    """Bytes of the largest tensor in ``folder``'s safetensors, or of a flex checkpoint's ``.metadata`` (by
    this tree's reader), or None."""
    if not folder.is_dir():
        return None
    sizes = [
        t["data_offsets"][1] - t["data_offsets"][0]
        for f in folder.glob("*.safetensors")
        for k, t in _header(f)[1].items()
        if k != "__metadata__"
    ]
    if sizes:
        return max(sizes)
    if not (folder / "model_state").is_dir():
        return None
    sys.path.insert(0, str(package_folder(ROOT)))
    try:
        from tietool.surgery.io import flex as flexio

        model = flexio.open_flex(flexio.FlexFolder(folder, folder / "model_state", ()))
        return max(t.nbytes for t in model.tensors.values())
    except Exception:  # noqa: BLE001 - the reader's API moved: no RSS budget then
        return None


def missing(case: Case, size: str) -> str | None:
    """Why ``case`` cannot run here at ``size`` (a library, the network, an input paddle makes), or None."""
    mods = {
        "paddle": "paddleformers",
        "moto": "moto",
        "transformers": "transformers",
        "tokenizers": "tokenizers",
    }
    for need in case.needs:
        if need == "network":
            if os.environ.get("TIETOOL_BENCH_NETWORK") != "1":
                return "needs the network (set TIETOOL_BENCH_NETWORK=1)"
        elif need.endswith("@big") and size == "tiny":
            continue
        elif need.removesuffix("@big") == "real-tokenizers":
            import vocab128k as v

            if why := v.why_missing():
                return why
        elif importlib.util.find_spec(mods.get(need.removesuffix("@big"), need.removesuffix("@big"))) is None:
            return f"needs {need.removesuffix('@big')}"
    if (
        case.input in ("flex", "flex_state")
        and size != "tiny"
        and not (INPUTS[case.input](size) / "model_state").is_dir()
    ):
        return f"no {INPUTS[case.input](size)}: run bench/make_flex.py --ckpt {size}" + (
            " --paddle-layout" if case.input == "flex_state" else ""
        )
    return None


# ---------------------------------------------------------------- checks


def _config(out: Path) -> dict:
    return json.loads((out / "config.json").read_text())


def tied(want: bool) -> Callable[[Ctx, str], str | None]:
    def check(ctx: Ctx, log: str) -> str | None:
        folder = ctx.extra.get("work", ctx.out)
        got = _config(folder).get("tie_word_embeddings")
        return None if got is want else f"tie_word_embeddings = {got}"

    return check


def resized(rows: int) -> Callable[[Ctx, str], str | None]:
    def check(ctx: Ctx, log: str) -> str | None:
        folder = ctx.extra.get("work", ctx.out)
        want = vocab(ctx.inp) + rows
        got = _config(folder).get("vocab_size")
        return None if got == want else f"vocab_size {got}, not {want}"

    return check


def diff_names_the_row(ctx: Ctx, log: str) -> str | None:
    try:
        d = json.loads(log[log.index("{") :])
    except ValueError as e:
        return f"no JSON: {e}"
    ch = d["tensors"]["changed"]
    row = diff_row(ctx.size)
    if [c["name"] for c in ch] != [EMB] or ch[0]["rows_changed"]["ranges"] != [[row, row + 1]]:
        return f"unexpected changes: {json.dumps(ch)[:300]}"
    return None


def copied(ctx: Ctx, log: str) -> str | None:
    return None if ctx.out.is_dir() and any(ctx.out.iterdir()) else "nothing copied"


def pruned(ctx: Ctx, log: str) -> str | None:
    """The output keeps the keep-list (+ specials at full size: 32,000 rows)."""
    got, kept = _config(ctx.out)["vocab_size"], len(json.loads(ctx.extra["keep32k"].read_text()))
    want = kept + (256 if ctx.size != "tiny" else 0)
    return None if got == want or (ctx.size == "tiny" and kept <= got < vocab(ctx.inp)) else f"vocab {got}"


def transplanted(ctx: Ctx, log: str) -> str | None:
    """The output has the donor's tokenizer.model and a new vocab_size."""
    ok = (ctx.out / "tokenizer.model").is_file() and _config(ctx.out)["vocab_size"] != vocab(ctx.inp)
    return None if ok else "no donor tokenizer.model or vocab_size unchanged"


# ---------------------------------------------------------------- in-process cases


def copy_pool(threads: int) -> Callable[[Ctx], None]:
    """Copy every file of the input with tietool's ``copy_file`` from ``threads`` threads."""

    def copy_file_pool(ctx: Ctx) -> None:
        sys.path.insert(0, str(ctx.pkg))
        from tietool.surgery.write.copy import copy_file

        ctx.out.mkdir()
        files = sorted(p for p in ctx.inp.iterdir() if p.is_file())
        with ThreadPoolExecutor(threads) as ex:
            list(ex.map(lambda p: copy_file(p, ctx.out / p.name), files))

    return copy_file_pool


def copy_pieces(threads: int, piece: int = 256 << 20) -> Callable[[Ctx], None]:
    """The alternative: each file cut into ``piece``-byte ranges copied at their offsets by a pool
    (``copy_file_range`` with both offsets), each file fsynced when done."""

    def copy_256mib_pieces(ctx: Ctx) -> None:
        ctx.out.mkdir()
        files = sorted(p for p in ctx.inp.iterdir() if p.is_file())
        jobs = []
        for p in files:
            n = p.stat().st_size
            with open(ctx.out / p.name, "wb") as f:
                f.truncate(n)
            jobs += [(p, o, min(piece, n - o)) for o in range(0, n, piece)] or [(p, 0, 0)]

        def one(job: tuple[Path, int, int]) -> None:
            p, off, n = job
            with open(p, "rb") as fs, open(ctx.out / p.name, "r+b") as fd:
                end = off + n
                while off < end:
                    off += os.copy_file_range(fs.fileno(), fd.fileno(), end - off, off, off)

        def fsync(p: Path) -> None:
            with open(ctx.out / p.name, "r+b") as fd:
                os.fsync(fd.fileno())

        with ThreadPoolExecutor(threads) as ex:
            list(ex.map(one, jobs))
            list(ex.map(fsync, files))

    return copy_256mib_pieces


_TREES: dict[Path, dict] = {}  # tree -> its tietool modules, while another tree's are imported


def _tietool(pkg: Path) -> None:
    """Make ``import tietool`` give the tree of ``pkg`` in this process (an in-process case of ``--before``
    runs two trees): the other tree's ``tietool`` modules are set aside from ``sys.modules`` and this tree's
    put back (imported from ``pkg`` the first time)."""
    want = (pkg / "tietool").resolve()
    loaded = sys.modules.get("tietool")
    have = Path(loaded.__path__[0]).resolve() if loaded is not None else None
    if have == want:
        return
    mine = [k for k in sys.modules if k == "tietool" or k.startswith("tietool.")]
    if have is not None:
        _TREES[have] = {k: sys.modules.pop(k) for k in mine}
    sys.modules.update(_TREES.pop(want, {}))
    if str(pkg) in sys.path:
        sys.path.remove(str(pkg))
    sys.path.insert(0, str(pkg))


def walk_pdparams(ctx: Ctx) -> None:
    """The opcode walker over every file of the input folder (a ``.metadata`` under flex's allow-list)."""
    _tietool(ctx.pkg)
    from tietool.surgery.io import flex, pdparams

    for p in sorted(ctx.inp.iterdir()):
        pdparams.walk(p, flex.METADATA if p.suffix == ".metadata" else None)


def genops(ctx: Ctx) -> None:
    """``pickletools.genops`` over the same bytes (a pure-Python opcode decoder: the ratio does not move
    with the machine's speed)."""
    for p in sorted(ctx.inp.iterdir()):
        for _ in pickletools.genops(io.BytesIO(p.read_bytes())):
            pass


# ---------------------------------------------------------------- the table

READ_BOTH = """
import pathlib, sys
buf = bytearray(4 << 20)
for root in sys.argv[1:]:
    for f in sorted(pathlib.Path(root).rglob("*")):
        if f.is_file():
            with open(f, "rb", buffering=0) as fh:
                while fh.readinto(buf):
                    pass
"""

OPS_BUDGET = Budget(
    ratio=1.1, rss_x_largest=4.0, why="issue 4: ≤ 1.1 × cp -r, RSS ≤ 2 × touched (emb + head) + 150 MB"
)
MEM = Budget(rss_x_largest=2.0, why="≤ 2 × the largest tensor + 150 MB")


def _cp(name: str, inp: str, doc: str, needs: tuple[str, ...] = ()) -> list[Case]:
    return [
        Case(
            name,
            inp,
            doc,
            lambda c: ["cp", "-r", str(c.inp), str(c.out)],
            tietool=False,
            check=copied,
            needs=needs,
        ),
        Case(
            name + "-fsync",
            inp,
            doc + ", then sync of every copied file (tietool fsyncs what it writes)",
            lambda c: ["sh", "-c", 'cp -r "$0" "$1" && sync "$1"/*', str(c.inp), str(c.out)],
            tietool=False,
            check=copied,
            needs=needs,
        ),
    ]


def _resize(c: Ctx, *more: str) -> list[str]:
    v = str(vocab(c.inp) + 256)
    return c.tool("resize", str(c.inp), "--vocab", v, "--init", "zeros", "--seed", "0", "-q", *more)


def _touched(c: Ctx) -> list[str]:
    index = json.loads((c.inp / "model.safetensors.index.json").read_text())["weight_map"]
    files = " ".join(sorted({str(c.inp / index[n]) for n in (EMB, HEAD)}))
    return ["sh", "-c", f'mkdir -p "{c.out}" && cp {files} "{c.out}/" && sync "{c.out}"/*']


VOCAB_NEEDS = ("real-tokenizers@big", "paddle@big", "transformers@big", "tiktoken@big")
CASES: list[Case] = [
    Case("startup/help", "llama", "tietool --help", lambda c: c.tool("--help")),
    Case(
        "startup/inspect-no-values",
        "llama",
        "inspect --no-values: headers only, the start-up of every command",
        lambda c: c.tool("inspect", "--no-values", str(c.inp)),
        budget=Budget(wall_s=0.5, why="issue 30, on the 6.5 GB checkpoint"),
    ),
    Case(
        "startup/inspect",
        "llama",
        "inspect: the embedding and head compared by value",
        lambda c: c.tool("inspect", str(c.inp)),
        budget=Budget(wall_s=1.2, why="issue 30, on the 6.5 GB checkpoint"),
    ),
    *_cp("copy/cp-r", "llama", "cp -r of the checkpoint (the baseline of ops/, inplace/, convert/)"),
    *(
        Case(
            f"copy/threads-{n}",
            "llama",
            f"tietool's copy_file from {n} threads",
            call=copy_pool(n),
            baseline="copy/cp-r",
        )
        for n in (1, 2, 4, 8)
    ),
    *(
        Case(
            f"copy/pieces-{n}",
            "llama",
            f"256 MiB pieces from {n} threads",
            call=copy_pieces(n),
            baseline="copy/cp-r",
        )
        for n in (4, 8)
    ),
    Case(
        "ops/tie",
        "llama",
        "tie --out",
        lambda c: c.tool("tie", str(c.inp), "--out", str(c.out), "-q"),
        baseline="copy/cp-r",
        budget=OPS_BUDGET,
        check=tied(True),
    ),
    Case(
        "ops/untie",
        "llama_tied",
        "untie --out of the tied copy",
        lambda c: c.tool("untie", str(c.inp), "--out", str(c.out), "-q"),
        baseline="copy/cp-r",
        budget=OPS_BUDGET,
        check=tied(False),
    ),
    Case(
        "ops/resize",
        "llama",
        "resize --vocab V+256 --init zeros --out",
        lambda c: _resize(c, "--out", str(c.out)),
        baseline="copy/cp-r",
        budget=OPS_BUDGET,
        check=resized(256),
    ),
    Case(
        "ops/tie-link",
        "llama",
        "tie --out --link (untouched shards hard-linked: tietool's own cost)",
        lambda c: c.tool("tie", str(c.inp), "--out", str(c.out), "-q", "--link"),
        baseline="copy/cp-r",
        check=tied(True),
    ),
    Case(
        "ops/untie-link",
        "llama_tied",
        "untie --out --link",
        lambda c: c.tool("untie", str(c.inp), "--out", str(c.out), "-q", "--link"),
        baseline="copy/cp-r",
        check=tied(False),
    ),
    Case(
        "ops/resize-link",
        "llama",
        "resize --out --link",
        lambda c: _resize(c, "--out", str(c.out), "--link"),
        baseline="copy/cp-r",
        check=resized(256),
    ),
    Case(
        "inplace/cp-touched",
        "llama",
        "cp + sync of the two shards resize rewrites (embedding's, head's)",
        _touched,
        tietool=False,
        check=copied,
    ),
    Case(
        "inplace/tie",
        "llama",
        "tie in place (a fresh cp -al working copy each run)",
        lambda c: c.tool("tie", str(c.extra["work"]), "-q"),
        baseline="copy/cp-r",
        fresh=True,
        budget=Budget(ratio=0.1, why="issue 11 / 30: in place ≤ 0.1 × cp -r"),
        check=tied(True),
    ),
    Case(
        "inplace/resize",
        "llama",
        "resize +256 rows in place",
        fresh=True,
        command=lambda c: c.tool(
            "resize", str(c.extra["work"]), "--vocab", str(vocab(c.inp) + 256), "--init", "zeros", "-q"
        ),
        baseline="inplace/cp-touched",
        budget=Budget(ratio=1.0, why="issue 11: in the time of writing the touched shards"),
        check=resized(256),
    ),
    Case(
        "convert/paddlenlp",
        "llama",
        "convert --to paddlenlp (transposes, renames)",
        lambda c: c.tool("convert", str(c.inp), "-q", "--out", str(c.out), "--to", "paddlenlp"),
        baseline="copy/cp-r",
        budget=MEM,
    ),
    Case(
        "diff/read-both",
        "llama",
        "read both folders once (4 MiB readinto, a child Python)",
        lambda c: [c.python, "-c", READ_BOTH, str(c.inp), str(c.extra["llama_changed"])],
        tietool=False,
        extra=("llama_changed",),
    ),
    Case(
        "diff/cat",
        "llama",
        "cat A/* B/* | wc -c",
        tietool=False,
        extra=("llama_changed",),
        command=lambda c: [
            "sh",
            "-c",
            'cat "$0"/* "$1"/* | wc -c',
            str(c.inp),
            str(c.extra["llama_changed"]),
        ],
    ),
    Case(
        "diff/row",
        "llama",
        "diff --json against the copy with one row changed: exit 1, that row named",
        lambda c: c.tool("diff", str(c.inp), str(c.extra["llama_changed"]), "--json"),
        expect_rc=1,
        baseline="diff/read-both",
        extra=("llama_changed",),
        check=diff_names_the_row,
        budget=Budget(ratio=1.2, rss_x_largest=2.0, why="issue 32"),
    ),
    Case(
        "diff/itself",
        "llama",
        "diff A A (same files: nothing read)",
        lambda c: c.tool("diff", str(c.inp), str(c.inp), "--json"),
        baseline="diff/read-both",
    ),
    *(
        Case(
            f"verify/{k}",
            "llama",
            f"verify the input against {what}",
            lambda c, k=k: c.tool("verify", str(c.inp), str(c.extra[k] if k != "llama" else c.inp), "--json"),
            extra=(k,) if k != "llama" else (),
            budget=Budget(rss_mb=200, why="issue 11: ≤ 200 MB at any size"),
        )
        for k, what in (
            ("llama_tied", "its tie output"),
            ("llama_resized", "its resize +256"),
            ("llama", "itself"),
        )
    ),
    *_cp("flex/cp-r", "flex", "cp -r of the flex checkpoint"),
    Case(
        "flex/merge",
        "flex",
        "merge of a flex checkpoint into safetensors",
        lambda c: c.tool("merge", str(c.inp), "--out", str(c.out), "-q"),
        baseline="flex/cp-r",
        budget=Budget(ratio=1.5, rss_x_largest=2.0, why="issue 21"),
    ),
    *_cp("flex/state-cp-r", "flex_state", "cp -r of the Trainer checkpoint with optimizer state"),
    Case(
        "flex/resize-state",
        "flex_state",
        "resize --vocab V+8 --keep-training-state --out",
        lambda c: c.tool(
            "resize",
            str(c.inp),
            "--vocab",
            str(vocab(c.inp.parent if not (c.inp / "config.json").exists() else c.inp) + 8),
            "--keep-training-state",
            "--out",
            str(c.out),
            "-q",
        ),
        baseline="flex/state-cp-r",
        budget=Budget(
            rss_x_largest=4.0, why="issue 21: 2 × the largest fp32 moment (2 × a bf16 tensor) + 150 MB"
        ),
    ),
    Case(
        "tokens/add-tokens",
        "tok",
        "add-tokens of 8 chat/tool tokens (add_tokens.TOKENS) --special --seed 0 --out",
        lambda c: c.tool(
            "add-tokens",
            str(c.inp),
            *TOKENS,
            "--special",
            "--seed",
            "0",
            "--out",
            str(c.out),
            "-q",
        ),
        baseline="tokens/resize",
        budget=Budget(ratio=1.1, why="issue 20: ≤ 1.1 × resize --out"),
        needs=("tokenizers@big", "transformers@big"),
    ),
    Case(
        "tokens/resize",
        "tok",
        "resize --vocab V+8 --out (the same-run reference of add-tokens)",
        lambda c: c.tool("resize", str(c.inp), "--vocab", str(vocab(c.inp) + 8), "--out", str(c.out), "-q"),
        baseline="copy/cp-r",
        needs=("tokenizers@big", "transformers@big"),
    ),
    *_cp("vocab/cp-r", "vocab128k", "cp -r of the 128k-token Llama (the baseline of vocab/)", VOCAB_NEEDS),
    Case(
        "vocab/prune-128k",
        "vocab128k",
        "prune to the 32k keep-list (vocab128k.keep_list) --keep-special --out",
        lambda c: c.tool(
            "prune",
            str(c.inp),
            "--keep-ids",
            str(c.extra["keep32k"]),
            "--keep-special",
            "--out",
            str(c.out),
            "-q",
        ),
        baseline="vocab/cp-r",
        budget=Budget(ratio=1.5, why="issue 33: ≤ 1.5 × cp -r"),
        check=pruned,
        extra=("keep32k",),
        needs=VOCAB_NEEDS,
    ),
    Case(
        "vocab/transplant-128k",
        "vocab128k",
        "transplant of a 32k SentencePiece donor (--init subword) --out",
        lambda c: c.tool(
            "transplant", str(c.inp), "--tokenizer", str(c.extra["donor32k"]), "--out", str(c.out), "-q"
        ),
        baseline="vocab/cp-r",
        budget=Budget(ratio=1.5, why="issue 33: ≤ 1.5 × cp -r"),
        check=transplanted,
        extra=("donor32k",),
        needs=VOCAB_NEEDS,
    ),
    Case(
        "walk/genops",
        "pdparams_files",
        "pickletools.genops over every .pdparams (the baseline)",
        call=genops,
        tietool=False,
    ),
    Case(
        "walk/walker",
        "pdparams_files",
        "tietool's .pdparams opcode walker over the same files",
        call=walk_pdparams,
        baseline="walk/genops",
    ),
    Case(
        "walk/genops-metadata",
        "metadata_files",
        "pickletools.genops over every flex .metadata (the baseline)",
        call=genops,
        tietool=False,
    ),
    Case(
        "walk/walker-metadata",
        "metadata_files",
        "tietool's walker over the same files (flex's allow-list, the result checked)",
        call=walk_pdparams,
        baseline="walk/genops-metadata",
        budget=Budget(ratio=3.0, why="measured 2.4 x genops (CPU), 2.6 x wall: bench/RESULTS.md"),
    ),
    Case(
        "remote/s3",
        "llama",
        "remote.py: inspect and tie on s3:// (moto) beside local, its own table",
        lambda c: [c.python, str(BENCH / "remote.py"), "--ckpt", str(c.inp), "-n", "1"],
        needs=("moto",),
    ),
    *(
        Case(
            f"pf/{op}",
            "llama" if op != "untie" else "llama_tied",
            f"the PaddleFormers route of {op}",
            lambda c, op=op: (
                [c.python, str(BENCH / "pf_route.py"), op, str(c.inp), str(c.out)]
                + (["--vocab", str(vocab(c.inp) + 256)] if op == "resize" else [])
            ),
            tietool=False,
            needs=("paddle",),
        )
        for op in ("tie", "untie", "resize")
    ),
    Case(
        "first/readme",
        "repo",
        "README's first command in a fresh clone (pip install into a new .venv)",
        lambda c: [c.python, str(BENCH / "first_command.py"), "-n", "1"],
        tietool=False,
        needs=("network",),
    ),
]
