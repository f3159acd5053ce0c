"""Tiny PaddleFormers checkpoints with a real trained tokenizer beside them, for the end-to-end oracles of
``add-tokens`` (``tests/oracles/test_add_tokens_e2e.py``).

Every checkpoint is written by PaddleFormers 1.2 itself (``<Family>ForCausalLM(<Family>Config(**cfg))`` +
``save_pretrained``, the recipe of :mod:`support.family_builder`, whose families, seeds and save options are
reused) with ``vocab_size`` = the tokenizer's length + ``slack`` rows; then the builder copies the
trained tokenizer folder ``tests/data/tokenizers/<name>`` (made by ``make_tokenizers.py`` there) beside the
weights. Written by hand after the save, and said so: DeepSeek-V3's MTP copies
(:func:`family_builder._add_mtp_copies`), an ``lm_head.bias`` (``bias=True``: the Llama row of the family
table names it; PaddleFormers' Llama has no such parameter, so its loader ignores it) and
``tensor_parallel_degree`` in config.json (``tp``).

One subprocess builds every variant (``python tokmodel_support.py PLAN ROOT``) and one subprocess loads every
tokenizer folder in HF transformers and PaddleFormers (``python tokmodel_support.py --tokenizers JOBS OUT``).
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
TOKENIZERS = HERE.parent / "data" / "tokenizers"
CORPUS = TOKENIZERS / "corpus.txt"
NOT_TOKENIZER = {"corpus.txt", "make_tokenizers.py", "README.md"}


@dataclasses.dataclass(frozen=True)
class TokVariant:
    """One checkpoint: ``family`` of :data:`family_builder.FAMILIES`, ``tie`` (tied / untied), ``fmt``
    (safetensors / pdparams: the legacy save, ``[hidden, vocab]`` head), ``dtype`` (float32 / bfloat16),
    the tokenizer folder's name, ``slack`` rows beyond the tokenizer, a head ``bias``, a ``tp`` degree."""

    family: str
    tie: str
    fmt: str
    dtype: str
    tokenizer: str
    slack: int = 0
    bias: bool = False
    tp: int | None = None

    @property
    def name(self) -> str:
        extra = ("-bias" if self.bias else "") + (f"-tp{self.tp}" if self.tp else "")
        return f"{self.family}-{self.tie}-{self.fmt}-{self.dtype}-{self.tokenizer}-slack{self.slack}{extra}"

    @property
    def model_class(self) -> str:
        from support import family_builder as fb

        return fb.FAMILIES[self.family]["model"]

    @property
    def load_kwargs(self) -> dict:
        from support import family_builder as fb

        return dict(fb.LEGACY_LOAD) if self.fmt == "pdparams" else {}


def tokenizer_dir(name: str) -> Path | None:
    """``tests/data/tokenizers/<name>``, or None where the folder is not there (yet)."""
    d = TOKENIZERS / name
    return d if d.is_dir() else None


def hf_tokenizer(folder: Path):
    """HF transformers ``AutoTokenizer.from_pretrained(folder)`` (transformers 5.x, tokenizers only)."""
    import transformers

    transformers.logging.set_verbosity_error()
    return transformers.AutoTokenizer.from_pretrained(str(folder))


def corpus_lines() -> list[str]:
    """The ordinary-text lines of the shipped corpus (none holds a token the tests add)."""
    return [ln for ln in CORPUS.read_text(encoding="utf-8").split("\n") if ln.strip()]


def build(variants: list[TokVariant], root: Path, timeout: float = 900) -> dict[TokVariant, dict]:
    """Build every variant into ``root/<name>`` in one subprocess; ``{variant: manifest entry}`` (``ok``,
    ``error``, ``path``, ``rows``, ``tokens``: the tokenizer's length as HF transformers counts it)."""
    root.mkdir(parents=True, exist_ok=True)
    plan = []
    for v in variants:
        tok = tokenizer_dir(v.tokenizer)
        assert tok is not None, f"tests/data/tokenizers/{v.tokenizer} is missing"
        n = len(hf_tokenizer(tok))
        plan.append(
            {**dataclasses.asdict(v), "name": v.name, "tok": str(tok), "tokens": n, "rows": n + v.slack}
        )
    (root / "plan.json").write_text(json.dumps(plan, indent=1))
    cp = _python([__file__, str(root / "plan.json"), str(root)], timeout)
    manifest = root / "manifest.json"
    if not manifest.is_file():
        raise RuntimeError(f"the builder wrote no manifest (exit {cp.returncode}):\n{cp.stderr[-3000:]}")
    entries = json.loads(manifest.read_text())
    out = {}
    for v, p in zip(variants, plan, strict=True):
        e = entries.get(
            v.name, {"ok": False, "error": f"not built (exit {cp.returncode}): {cp.stderr[-800:]}"}
        )
        out[v] = {**e, "path": root / v.name, "rows": p["rows"], "tokens": p["tokens"]}
    return out


def tokenizer_loads(jobs: list[dict], root: Path, timeout: float = 600) -> list[dict]:
    """Load every job's ``folder`` in HF transformers and in PaddleFormers ``AutoTokenizer`` (one subprocess
    for all) and encode ``strings`` and ``corpus`` (``add_special_tokens=False``); per job ``{"hf": {...},
    "pf": {...}}``, each ``{"ok", "error", "len", "strings", "inside", "corpus"}`` (lists of ids;
    ``inside``: each string within ``"and S then"``)."""
    root.mkdir(parents=True, exist_ok=True)
    (root / "jobs.json").write_text(json.dumps(jobs, indent=1))
    cp = _python([__file__, "--tokenizers", str(root / "jobs.json"), str(root / "out.json")], timeout)
    if not (root / "out.json").is_file():
        raise RuntimeError(f"the tokenizer loader wrote nothing (exit {cp.returncode}):\n{cp.stderr[-3000:]}")
    return json.loads((root / "out.json").read_text())


def _python(argv: list[str], timeout: float) -> subprocess.CompletedProcess:
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="", PYTHONPATH=os.pathsep.join(sys.path))
    from support import preload  # the parent side only: this file also runs as a script

    return preload.run(
        [sys.executable, *argv],
        libs=preload.PADDLEFORMERS,
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
        stdin=subprocess.DEVNULL,
        check=False,
    )


# ===================================================================================== subprocess side
def _add_bias(out: Path, rows: int, seed: int) -> None:
    """An ``lm_head.bias`` [rows] float32 (seeded normal values) added to the safetensors file holding
    ``lm_head.weight`` (written again with its metadata) and to the index."""
    import numpy as np
    from safetensors import safe_open
    from safetensors.numpy import load_file, save_file

    index = out / "model.safetensors.index.json"
    idx = json.loads(index.read_text())
    path = out / idx["weight_map"]["lm_head.weight"]
    with safe_open(str(path), "np") as f:
        meta = f.metadata()
    tensors = load_file(str(path))
    tensors["lm_head.bias"] = np.random.default_rng(seed).normal(0, 0.5, rows).astype(np.float32)
    save_file(tensors, str(path), metadata=meta)
    idx["weight_map"]["lm_head.bias"] = path.name
    index.write_text(json.dumps(idx, indent=2))


def _build_one(fb, v: dict, out: Path) -> list[str]:
    import contextlib
    import io

    import paddle
    import paddleformers.transformers as T

    spec = fb.FAMILIES[v["family"]]
    kwargs = fb._with_tie({**spec["kwargs"], "vocab_size": v["rows"]}, v["tie"] == "tied")
    paddle.seed(spec["seed"])
    paddle.set_default_dtype(v["dtype"])
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            model = getattr(T, spec["model"])(getattr(T, spec["config"])(**kwargs))
    finally:
        paddle.set_default_dtype("float32")
    model.eval()
    with contextlib.redirect_stdout(io.StringIO()):
        fb._save(model, {"sharded": False, "fmt": v["fmt"]}, out)
    notes = []
    if v["family"] == "deepseek_v3":
        notes += fb._add_mtp_copies(out, spec["kwargs"]["num_hidden_layers"])
    for transient in out.glob("saved_signal_*"):
        transient.unlink()
    if v["bias"]:
        _add_bias(out, v["rows"], spec["seed"])
        notes.append("lm_head.bias added")
    if v["tp"]:
        cfg = json.loads((out / "config.json").read_text())
        cfg["tensor_parallel_degree"] = v["tp"]
        (out / "config.json").write_text(json.dumps(cfg, indent=2))
    for f in Path(v["tok"]).iterdir():
        shutil.copy2(f, out / f.name)
    return notes


def _main(plan_path: str, root: str) -> int:
    import logging
    import traceback

    sys.path.insert(0, str(HERE.parent))
    from support import family_builder as fb

    fb._stub_gpt_provider()
    fb._stub_paddlefleet_ops()
    import paddle

    paddle.set_device("cpu")
    logging.disable(logging.WARNING)
    manifest: dict[str, dict] = {}
    for v in json.loads(Path(plan_path).read_text()):
        entry: dict = {"ok": False, "error": None, "notes": []}
        try:
            entry["notes"] = _build_one(fb, v, Path(root) / v["name"])
            entry["ok"] = True
        except Exception as e:  # noqa: BLE001  (reported per variant)
            entry["error"] = f"{type(e).__name__}: {str(e)[:500]}\n{traceback.format_exc()[-1500:]}"
        manifest[v["name"]] = entry
        Path(root, "manifest.json").write_text(json.dumps(manifest, indent=1))
    return 0


def _encode_all(load, job: dict) -> dict:
    try:
        tok = load(job["folder"])
        enc = [list(tok.encode(s, add_special_tokens=False)) for s in job["strings"]]
        inside = [list(tok.encode(f"and {s} then", add_special_tokens=False)) for s in job["strings"]]
        corpus = [list(tok.encode(s, add_special_tokens=False)) for s in job["corpus"]]
        return {
            "ok": True,
            "error": None,
            "len": len(tok),
            "strings": enc,
            "inside": inside,
            "corpus": corpus,
            "specials": {
                n: [getattr(tok, f"{n}_token", None), getattr(tok, f"{n}_token_id", None)]
                for n in ("pad", "bos", "eos")
            },
        }
    except Exception as e:  # noqa: BLE001  (reported per job)
        return {"ok": False, "error": f"{type(e).__name__}: {str(e)[:800]}"}


def _tokenizers_main(jobs_path: str, out_path: str) -> int:
    import contextlib
    import io
    import logging

    sys.path.insert(0, str(HERE.parent))
    from support import family_builder as fb

    fb._stub_gpt_provider()
    logging.disable(logging.WARNING)
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        import paddleformers.transformers as pft
        import transformers
    transformers.logging.set_verbosity_error()
    results = []
    for job in json.loads(Path(jobs_path).read_text()):
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            hf = _encode_all(transformers.AutoTokenizer.from_pretrained, job)
            pf = _encode_all(pft.AutoTokenizer.from_pretrained, job)
        results.append({"hf": hf, "pf": pf})
        Path(out_path).write_text(json.dumps(results))
    return 0


if __name__ == "__main__":
    if sys.argv[1] == "--tokenizers":
        sys.exit(_tokenizers_main(sys.argv[2], sys.argv[3]))
    sys.exit(_main(sys.argv[1], sys.argv[2]))
