"""Property (issue 18, item 6): every command, run through the Python API on a mutant of a small checkpoint
*folder*, either succeeds or raises ``TietoolError``; a success writes an output that reads back with the
independent readers of ``support.fixture_support`` (no tietool code) and that ``verify`` can compare.

``test_fuzz_hypothesis.py`` mutates the bytes of one weight file and runs only the reader; here the
mutations are of the folder's structure, so that detect, plan, layout, write, convert and verify meet values
a byte flip rarely makes: config values (sizes, flags, model type, dtype, of the wrong type or range), the
embedding's and head's shapes (0-D, 1-D, 3-D, 40-D, transposed, one row more or less, an empty axis) and
dtypes (integers, bool, float8, float64), tensors dropped or duplicated, index entries (dropped, pointing
to a missing shard or tensor, a wrong ``total_size``), and files present or not (config, index, a stray
single file beside the shards, generation / tokenizer configs, training state, a subfolder).

Anything but a ``TietoolError`` escaping is a bug (the CLI would say "internal error", exit 70).
``derandomize=True`` keeps CI deterministic and ``database=None`` keeps the tree clean; the fast variant
runs 400 examples per fixture (~6 s here), the slow one 500 (4,000 under ``TIETOOL_DEEP_FUZZ=1``:
:mod:`support.fuzz_budget`).
"""

from __future__ import annotations

import json
import math
import shutil
import tempfile
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from support import adversarial_support as av
from support import fixture_support as fs
from support.fuzz_budget import fast_twin, slow_examples  # noqa: F401 - fast_twin: autouse (TWINS)

import tietool
from tietool.surgery.model.errors import OutputError, TietoolError

# fast variant -> its slow twin (same property and strategy, the same found examples, more examples)
TWINS = {"test_every_command_on_folder_mutants": "test_every_command_on_folder_mutants_slow"}


V, H = 100, 16  # both fixtures: vocab_size 100, hidden_size 16
ST_CASE, PD_CASE = av.ST_ONE, av.PD_ONE
EMB = {ST_CASE: "model.embed_tokens.weight", PD_CASE: "llama.embed_tokens.weight"}
HEAD = "lm_head.weight"

ITEMSIZE = {"F32": 4, "F16": 2, "BF16": 2, "F64": 8, "I64": 8, "I32": 4, "U8": 1, "BOOL": 1, "F8_E4M3": 1}
READ_ITEMSIZE = ITEMSIZE | {"U16": 2, "I16": 2, "I8": 1, "U32": 4, "U64": 8, "F8_E5M2": 1}
NP_OF = {"F32": "float32", "F16": "float16", "BF16": "uint16", "F64": "float64", "I64": "int64"}
NP_OF |= {"I32": "int32", "U8": "uint8", "BOOL": "bool"}
ST_OF = {"float32": "F32", "float16": "F16", "uint16": "BF16", "float64": "F64", "int64": "I64"}
ST_OF |= {"int32": "I32", "uint8": "U8", "bool": "BOOL"}

SHAPES = [
    [],
    [V * H],
    [V, H],
    [H, V],
    [V + 1, H],
    [V - 1, H],
    [V, H + 1],
    [V, H, 1],
    [1, V, H],
    [0, H],
    [V, 0],
    [2, V, H],
    [1] * 38 + [V, H],
    [H, H],
]
VALUES = [
    0,
    -1,
    1,
    2,
    16,
    99,
    100,
    101,
    128,
    10**30,
    1.5,
    "x",
    "",
    None,
    True,
    False,
    [],
    {},
    [100],
    {"a": 1},
]
CONFIG_KEYS = [
    "vocab_size",
    "hidden_size",
    "tie_word_embeddings",
    "model_type",
    "architectures",
    "torch_dtype",
    "dtype",
    "paddleformers_version",
    "paddlenlp_version",
    "num_hidden_layers",
    "intermediate_size",
    "num_attention_heads",
    "num_key_value_heads",
    "head_dim",
    "pad_token_id",
    "eos_token_id",
    "text_config",
    "tensor_parallel_degree",
    "d_model",
]
MODEL_TYPES = ["llama", "qwen2", "qwen3", "ernie4_5", "gpt2", "t5", "bert", "unknown", "mixtral"]

SETTINGS = dict(
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


# ------------------------------------------------------------------------------------------------ the folder
def _tensors(case: str) -> tuple[dict[str, tuple[str, list[int], bytes]], dict]:
    """The fixture's tensors as ``name → (safetensors dtype label, shape, bytes)``, and its extras."""
    src = av.CASES / case
    if case == ST_CASE:
        return av.st_tensors(src / av.ST_ONE_FILE), {}
    state = av.pd_state(case)
    tensors = {
        k: (ST_OF[v.dtype.name], list(v.shape), np.ascontiguousarray(v).tobytes())
        for k, v in state.items()
        if isinstance(v, np.ndarray)
    }
    return tensors, {k: v for k, v in state.items() if not isinstance(v, np.ndarray)}


BASE = {case: _tensors(case) for case in (ST_CASE, PD_CASE)}


def _fill(data: bytes, n: int) -> bytes:
    """``n`` bytes cycled from ``data`` (zeros when it is empty)."""
    if not data:
        return bytes(n)
    return (data * (n // len(data) + 1))[:n]


def _write_weights(case: str, ckpt: Path, tensors: dict) -> None:
    """Write ``tensors`` as the fixture's weight file (the safetensors shard or the ``.pdparams``)."""
    if case == ST_CASE:
        av.st_write_tensors(ckpt / av.ST_ONE_FILE, tensors, {"format": "pt"})
        return
    state: dict = dict(BASE[case][1])
    for name, (label, shape, data) in tensors.items():
        if label not in NP_OF:  # a .pdparams holds numpy dtypes only: float8 becomes uint8
            label = "U8"
        state[name] = av.FakeArray(shape, np.dtype(NP_OF[label]), data)  # any rank, as numpy pickles it
    av.pd_dump(state, ckpt / av.PD_FILE)


# ------------------------------------------------------------------------------------------------ mutations
def _tensor_target(case: str):
    names = sorted(BASE[case][0])
    return st.one_of(st.sampled_from(["embedding", "head"]), st.sampled_from(names))


def mutations(case: str):
    which = _tensor_target(case)
    one = st.one_of(
        st.tuples(st.just("config"), st.sampled_from(CONFIG_KEYS), st.sampled_from(VALUES)),
        st.tuples(st.just("model_type"), st.sampled_from(MODEL_TYPES)),
        st.tuples(st.just("config_del"), st.sampled_from(CONFIG_KEYS)),
        st.tuples(st.just("shape"), which, st.sampled_from(range(len(SHAPES)))),
        st.tuples(st.just("dtype"), which, st.sampled_from(sorted(ITEMSIZE))),
        st.tuples(st.just("drop"), which),
        st.tuples(
            st.just("dup"), which, st.sampled_from(["lm_head.bias", "model.embed_tokens.weight2", HEAD])
        ),
        st.tuples(st.just("index"), st.sampled_from(["drop", "ghost", "missing_file", "total", "not_dict"])),
        st.tuples(
            st.just("file"),
            st.sampled_from(
                ["no_config", "no_index", "stray_single", "gen_config", "tok_config", "optimizer", "subdir"]
            ),
        ),
    )
    return st.lists(one, min_size=1, max_size=4)


def _name(case: str, which: str) -> str:
    return {"embedding": EMB[case], "head": HEAD}.get(which, which)


def _mutate_tensor(case: str, tensors: dict, m: tuple) -> None:
    kind, name = m[0], _name(case, m[1])
    if name not in tensors:
        return
    label, shape, data = tensors[name]
    if kind == "shape":
        shape = SHAPES[m[2]]
    elif kind == "dtype":
        label = m[2]
    elif kind == "drop":
        del tensors[name]
        return
    elif kind == "dup":
        tensors[m[2]] = (label, shape, data)
        return
    tensors[name] = (label, shape, _fill(data, math.prod(shape) * ITEMSIZE[label]))


def _mutate_config(cfg: dict, m: tuple) -> None:
    if m[0] == "config":
        cfg[m[1]] = m[2]
    elif m[0] == "model_type":
        cfg["model_type"] = m[1]
    else:
        cfg.pop(m[1], None)


def _mutate_index(ckpt: Path, op: str, tensors: dict) -> None:
    p = ckpt / av.ST_INDEX
    if not p.exists():
        return
    idx = json.loads(p.read_text())
    wm = idx["weight_map"]
    if not isinstance(wm, dict):  # already mutated to a list
        return
    if op == "drop" and wm:
        wm.pop(sorted(wm)[0])
    elif op == "ghost":
        wm["model.ghost.weight"] = av.ST_ONE_FILE
    elif op == "missing_file":
        wm[sorted(wm)[-1]] = "model-00002-of-00002.safetensors"
    elif op == "total":
        idx["metadata"] = {"total_size": -5}
    elif op == "not_dict":
        idx["weight_map"] = [list(kv) for kv in wm.items()]
    p.write_text(json.dumps(idx))


def _mutate_file(case: str, ckpt: Path, op: str) -> None:
    if op == "no_config":
        (ckpt / "config.json").unlink(missing_ok=True)
    elif op == "no_index":
        (ckpt / av.ST_INDEX).unlink(missing_ok=True)
    elif op == "stray_single":
        src = ckpt / (av.ST_ONE_FILE if case == ST_CASE else av.PD_FILE)
        if src.exists():
            shutil.copyfile(
                src, ckpt / ("model.safetensors" if case == ST_CASE else "model_state.pdparams.bak")
            )
    elif op == "gen_config":
        (ckpt / "generation_config.json").write_text(
            json.dumps({"eos_token_id": [2, 10**6], "pad_token_id": -1})
        )
    elif op == "tok_config":
        (ckpt / "tokenizer_config.json").write_text(
            json.dumps({"added_tokens_decoder": {"150": {"content": "x"}}})
        )
    elif op == "optimizer":
        (ckpt / "optimizer.pdopt").write_bytes(b"\x80\x04N.")
    elif op == "subdir":
        (ckpt / "assets").mkdir(exist_ok=True)
        (ckpt / "assets" / "a.txt").write_text("x")


def build(case: str, muts: list, root: Path) -> Path:
    """A copy of fixture ``case`` under ``root`` with ``muts`` applied."""
    ckpt = av.copy_case(case, root / "ckpt")
    tensors = {k: tuple(v) for k, v in BASE[case][0].items()}
    cfg = json.loads((ckpt / "config.json").read_text())
    for m in muts:
        if m[0] in ("shape", "dtype", "drop", "dup"):
            _mutate_tensor(case, tensors, m)
        elif m[0] in ("config", "model_type", "config_del"):
            _mutate_config(cfg, m)
    _write_weights(case, ckpt, tensors)
    (ckpt / "config.json").write_text(json.dumps(cfg))
    if case == ST_CASE:  # the index lists what the shard now holds (then the mutations below break it)
        wm = {n: av.ST_ONE_FILE for n in tensors}
        total = sum(len(t[2]) for t in tensors.values())
        (ckpt / av.ST_INDEX).write_text(json.dumps({"metadata": {"total_size": total}, "weight_map": wm}))
    for m in muts:
        if m[0] == "index":
            _mutate_index(ckpt, m[1], tensors)
        elif m[0] == "file":
            _mutate_file(case, ckpt, m[1])
    return ckpt


# ------------------------------------------------------------------------------------------------ commands
IN_PLACE = st.booleans()  # tie/untie/resize: --out or in place (the new version swapped in, a backup kept)
COMMANDS = st.one_of(
    st.just(("inspect",)),
    st.tuples(st.just("tie"), st.sampled_from([None, "embedding", "head"]), IN_PLACE),
    st.tuples(st.just("untie"), st.none(), IN_PLACE),
    st.tuples(st.just("resize"), st.sampled_from([(128, False), (96, True), (None, False)]), IN_PLACE),
    st.tuples(st.just("convert"), st.sampled_from(["paddleformers", "paddlenlp", "safetensors", "pdparams"])),
    st.tuples(st.just("verify"), st.booleans()),
)


def run(command: tuple, ckpt: Path, out: Path, case: str) -> tuple[Path, Path] | None:
    """Run ``command`` on ``ckpt`` through the Python API; returns (the version it read, the folder it
    wrote): ``(ckpt, out)``, or in place ``(backup, ckpt)``; None for inspect and verify."""
    name = command[0]
    in_place = name in ("tie", "untie", "resize") and command[2]
    dst = None if in_place else out
    if name == "inspect":
        tietool.inspect(ckpt)
    elif name == "tie":
        rep = tietool.tie(ckpt, dst, keep=command[1])
    elif name == "untie":
        rep = tietool.untie(ckpt, dst)
    elif name == "resize":
        size, force = command[1]
        if size is None:
            rep = tietool.resize(ckpt, None, dst, pad_to_multiple_of=64, init="zeros")
        else:
            rep = tietool.resize(ckpt, size, dst, force=force, init="zeros", seed=0)
    elif name == "convert":
        tietool.convert(ckpt, command[1], out)
    else:
        tietool.verify(av.CASES / case if command[1] else ckpt, ckpt)
    if name in ("inspect", "verify"):
        return None
    if not in_place:
        return ckpt, out
    backup = rep["in_place"]["backup"]
    return (Path(backup), ckpt) if backup else None  # a plan that changes nothing writes nothing


def check_output(ckpt: Path, out: Path) -> None:
    """A written output ``out`` reads back with the independent readers, has a JSON config, and ``verify``
    of ``ckpt`` (the version it was made from) against it raises nothing but a ``TietoolError``."""
    tensors = fs.read_checkpoint(out)
    assert tensors, f"{out}: no tensor in the output"
    for t in tensors.values():
        size = READ_ITEMSIZE[t.dtype] if t.dtype in READ_ITEMSIZE else np.dtype(t.dtype).itemsize
        assert len(t.data) == math.prod(t.shape) * size, (t.file, t.dtype, t.shape, len(t.data))
    cfgs = [p for p in ("config.json", "model_config.json") if (out / p).is_file()]
    assert cfgs, f"{out}: no config"
    json.loads((out / cfgs[0]).read_text())
    try:
        tietool.verify(ckpt, out)
    except TietoolError:
        pass


def one_example(case: str, muts: list, command: tuple) -> None:
    root = Path(tempfile.mkdtemp(prefix="fuzzcmd-"))
    try:
        ckpt = build(case, muts, root)
        try:
            written = run(command, ckpt, root / "out", case)
        except OutputError as e:  # a healthy temporary folder: an output error is a write that went wrong
            raise AssertionError(f"exit 6 on a healthy disk: {e}") from None
        except TietoolError:
            return
        if written is not None:
            check_output(*written)
    finally:
        shutil.rmtree(root, ignore_errors=True)


# what the fuzzer found (each was an exit 70 or a write that did not read back), kept as fixed examples:
FOUND = [
    ([("shape", "embedding", 1)], ("untie", None, False)),  # 1-D embedding taken as missing: written twice
    ([("shape", "embedding", 12)], ("verify", True)),  # 40 axes: numpy's reshape raised
    ([("shape", "head", 0)], ("inspect",)),  # 0-D head: vocab_axis 0 of shape ()
    ([("shape", "llama.layers.0.input_layernorm.weight", 0)], ("verify", True)),  # [16] → []: IndexError
    ([("dtype", "head", "F64")], ("tie", "embedding", False)),  # --keep across dtypes: wrong payload size
    ([("dtype", "embedding", "F16")], ("tie", "embedding", True)),
    (
        [("dup", "model.norm.weight", "lm_head.bias"), ("shape", "lm_head.bias", 0)],
        ("resize", (128, False), False),
    ),
    ([("model_type", "t5"), ("config", "d_model", 0)], ("inspect",)),  # 0.0 ** -0.5: ZeroDivisionError
    ([("model_type", "t5"), ("config", "d_model", -1)], ("untie", None, False)),  # (-1) ** -0.5 is complex
]


def _with_found(prop):
    for muts, command in FOUND:
        prop = example(muts, command)(prop)
    return prop


@pytest.mark.parametrize("case", [ST_CASE, PD_CASE])
def test_every_command_on_folder_mutants(case: str) -> None:
    @settings(max_examples=400, **SETTINGS)
    @given(mutations(case), COMMANDS)
    @_with_found
    def prop(muts, command):
        one_example(case, muts, command)

    prop()


@pytest.mark.slow
@pytest.mark.parametrize("case", [ST_CASE, PD_CASE])
def test_every_command_on_folder_mutants_slow(case: str) -> None:
    @settings(max_examples=slow_examples(4000), **SETTINGS)
    @given(mutations(case), COMMANDS)
    @_with_found
    def prop(muts, command):
        one_example(case, muts, command)

    prop()
