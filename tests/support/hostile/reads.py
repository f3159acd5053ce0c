"""Hostile non-weight files (issue 18, items 6, 7, 9): every JSON and tokenizer file tietool reads or copies.

Kinds:

* ``special`` — a FIFO, a socket, a link to ``/dev/zero`` or ``/dev/null``, or a folder where a regular file
  belongs (config.json, model_config.json, generation_config.json, the index, tokenizer files, a carried file
  in a subfolder, a rank file or a carried file of ``merge``): refused by name, exit 3, at once (a FIFO would
  block the read or the copy forever, ``/dev/zero`` would read until memory runs out).
* ``json`` — a JSON file that is huge, nested 10,000 deep, holds a 5,000-digit integer, ``Infinity``/``NaN``/
  ``1e400``, a repeated key, a lone surrogate escape: exit 3 naming the file.
* ``config-type`` — a key tietool reads holding the wrong type or range (``vocab_size``, ``hidden_size``,
  ``tie_word_embeddings``, ``text_config`` and its keys, ...): exit 3 naming the file and the key.
* ``index`` — a weight_map entry that is not a string, a name over 255 bytes, a slash, ``..``, a NUL;
  ``metadata.total_size`` of the wrong type: exit 3 naming the index.
* ``tokenizer-type`` — a list-valued token, ``added_tokens_decoder`` entries of the wrong types in
  tokenizer_config.json: exit 3 naming the file.

(Unreadable files — permission — cannot be made here: the suite may run as root, which reads anything;
``tests/adversarial/test_bad_input.py`` runs those cases as an unprivileged user.)
"""

from __future__ import annotations

import json
import os
import socket
from collections.abc import Callable
from pathlib import Path

from support import adversarial_support as av
from support.hostile import Hostile
from support.paths import BUG_CASES_DIR

ST_INDEX = av.ST_INDEX
TOKENIZER_FILES = (
    "tokenizer_config.json",
    "tokenizer.json",
    "special_tokens_map.json",
    "added_tokens.json",
    "vocab.txt",
    "vocab.json",
    "merges.txt",
    "generation_config.json",
)
RANKS = BUG_CASES_DIR / "c05_paddlenlp_tp_rank_files" / "ckpt"


def _base(dest: Path, case: str = av.ST_ONE) -> Path:
    return av.copy_case(case, dest / "ckpt")


def _ranks(dest: Path) -> Path:
    from support import fixture_support as fs

    return fs.copy_checkpoint(RANKS, dest / "ckpt")


def _put(rel: str, make: Callable[[Path], None], base: Callable[[Path], Path] = _base):
    """A build that puts ``make(path)`` at ``rel`` of the base checkpoint (replacing a file there)."""

    def build(dest: Path) -> Path:
        ckpt = base(dest)
        p = ckpt / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        if p.is_file():
            p.unlink()
        make(p)
        return ckpt

    return build


def _fifo(p: Path) -> None:
    os.mkfifo(p)


def _socket(p: Path) -> None:
    s = socket.socket(socket.AF_UNIX)
    s.bind(str(p))
    s.close()  # the socket file stays


def _link(target: str) -> Callable[[Path], None]:
    return lambda p: p.symlink_to(target)


def _folder(p: Path) -> None:
    p.mkdir()
    (p / "x").write_text("{}")


def _text(text: str | bytes) -> Callable[[Path], None]:
    data = text.encode("utf-8") if isinstance(text, str) else text
    return lambda p: p.write_bytes(data)


def _json(doc: object) -> Callable[[Path], None]:
    return _text(json.dumps(doc))


def _edit_json(rel: str, fn: Callable[[dict], None], case: str = av.ST_ONE):
    """A build that edits ``rel`` (a JSON object) of the base checkpoint in place with ``fn``."""

    def build(dest: Path) -> Path:
        ckpt = _base(dest, case)
        doc = json.loads((ckpt / rel).read_text())
        fn(doc)
        (ckpt / rel).write_text(json.dumps(doc))
        return ckpt

    return build


def _set(key: str, value: object) -> Callable[[dict], None]:
    def fn(doc: dict) -> None:
        *parents, last = key.split(".")
        d = doc
        for k in parents:
            d = d.setdefault(k, {})
        d[last] = value

    return fn


def _special_cases() -> list[Hostile]:
    out = []
    for rel in ("config.json", "model_config.json", ST_INDEX, *TOKENIZER_FILES, "sub/notes.txt"):
        out.append(
            Hostile(
                f"fifo-{rel.replace('/', '-')}",
                "special",
                _put(rel, _fifo),
                3,
                names=(rel.split("/")[-1], "FIFO"),
            )
        )
    for rel in ("config.json", "tokenizer.json", ST_INDEX, "generation_config.json"):
        out.append(
            Hostile(f"devzero-{rel}", "special", _put(rel, _link("/dev/zero")), 3, names=(rel, "device"))
        )
    out += [
        Hostile(
            "devnull-tokenizer_config.json",
            "special",
            _put("tokenizer_config.json", _link("/dev/null")),
            3,
            names=("tokenizer_config.json", "device"),
        ),
        Hostile(
            "socket-tokenizer.json",
            "special",
            _put("tokenizer.json", _socket),
            3,
            names=("tokenizer.json", "socket"),
        ),
        Hostile("socket-sub-file", "special", _put("assets/s", _socket), 3, names=("s", "socket")),
        Hostile(
            "folder-config.json", "special", _put("config.json", _folder), 3, names=("config.json", "folder")
        ),
        Hostile("folder-index", "special", _put(ST_INDEX, _folder), 3, names=(ST_INDEX,)),
        Hostile(
            "devzero-pd-index",
            "special",
            _put(av.PD_INDEX, _link("/dev/zero"), lambda d: _base(d, av.PD_SHARDED)),
            3,
            names=(av.PD_INDEX, "device"),
        ),
    ]
    merge = ("merge",)
    for rel, what in (
        ("model_state.tp01.pdparams", "FIFO"),
        ("config.json", "FIFO"),
        ("tokenizer_config.json", "FIFO"),
        ("special_tokens_map.json", "FIFO"),
    ):
        out.append(
            Hostile(f"fifo-merge-{rel}", "special", _put(rel, _fifo, _ranks), 3, merge, names=(rel, what))
        )
    out.append(
        Hostile(
            "devzero-merge-generation_config.json",
            "special",
            _put("generation_config.json", _link("/dev/zero"), _ranks),
            3,
            merge,
            names=("generation_config.json", "device"),
        )
    )
    return out


DEEP = "[" * 10_000 + "]" * 10_000
HOSTILE_JSON = {
    "deep-list": DEEP,
    "deep-object": '{"a": ' * 10_000 + "1" + "}" * 10_000,
    "bigint": '{"vocab_size": ' + "9" * 5000 + "}",
    "bigint-nested": '{"x": [[' + "1" * 4301 + "]]}",
    "infinity": '{"initializer_range": Infinity}',
    "nan": '{"a": NaN}',
    "1e400": '{"rms_norm_eps": 1e400}',
    "dup-key": '{"vocab_size": 100, "vocab_size": 200}',
    "surrogate": '{"model_type": "\\ud800"}',
    "not-utf8": b'{"a": "\xff\xfe"}',
    "truncated": '{"vocab_size": 1',
}


# model_config.json beside config.json is PaddleNLP 2.x's legacy name, which its loaders read only when
# config.json is missing: carried unchanged by inspect/tie/untie/convert, read (and so refused) by resize
# (which moves its vocab_size keys) and verify (which compares it)
BESIDE = {"resize": 3, "verify": 3, "*": 0}


def _expect(rel: str):
    return BESIDE if rel == "model_config.json" else 3


def _json_cases() -> list[Hostile]:
    out = []
    for rel in ("config.json", ST_INDEX, "model_config.json"):  # files a command needs: refused
        for what, text in HOSTILE_JSON.items():
            out.append(
                Hostile(f"json-{what}-{rel}", "json", _put(rel, _text(text)), _expect(rel), names=(rel,))
            )
    # tokenizer and generation files are read for facts only (the tokenizer's size, special token ids): one
    # that is not strict JSON counts as unreadable (a finding, as a syntax error always did) and is carried
    # unchanged: exit 0, never 70, never a hang
    for rel in ("tokenizer_config.json", "tokenizer.json", "added_tokens.json", "generation_config.json"):
        for what in ("deep-list", "bigint-nested", "infinity", "1e400", "surrogate", "dup-key"):
            expect = {"verify": 3, "*": 0} if rel == "generation_config.json" else 0  # verify compares it
            out.append(Hostile(f"json-{what}-{rel}", "json", _put(rel, _text(HOSTILE_JSON[what])), expect))
    # model_config.json in a PaddleNLP 2.x folder (no config.json): the one config tietool reads
    out.append(
        Hostile(
            "json-deep-model_config-only",
            "json",
            _model_config_only('{"init_args": [' * 5000 + "{}" + "]}" * 5000),
            3,
            names=("model_config.json",),
        )
    )
    # a huge config: more than tietool reads from a JSON file (bounded, never loaded whole)
    out.append(
        Hostile(
            "json-huge-config.json", "json", _put("config.json", _huge), 3, names=("config.json", "larger")
        )
    )
    # merge reads the rank folder's config.json the same way
    for what in ("deep-list", "bigint", "1e400", "dup-key", "surrogate"):
        out.append(
            Hostile(
                f"json-merge-{what}-config.json",
                "json",
                _put("config.json", _text(HOSTILE_JSON[what]), _ranks),
                3,
                ("merge",),
                names=("config.json",),
            )
        )
    for key, value in (("vocab_size", "16"), ("hidden_size", True), ("tensor_parallel_degree", "2")):
        out.append(
            Hostile(
                f"config-type-merge-{key}",
                "config-type",
                _ranks_config(key, value),
                3,
                ("merge",),
                names=("config.json", key),
            )
        )
    return out


def _ranks_config(key: str, value: object):
    def build(dest: Path) -> Path:
        ckpt = _ranks(dest)
        doc = json.loads((ckpt / "config.json").read_text())
        doc[key] = value
        (ckpt / "config.json").write_text(json.dumps(doc))
        return ckpt

    return build


def _huge(p: Path) -> None:
    with open(p, "wb") as f:
        f.write(b'{"pad": "')
        f.seek(65 * 1024**2)  # sparse: 65 MiB, over regular.JSON_LIMIT, costs no disk
        f.write(b'"}')


def _model_config_only(text: str):
    def build(dest: Path) -> Path:
        ckpt = _base(dest, av.PD_ONE)
        cfg = ckpt / "config.json"
        cfg.unlink()
        (ckpt / "model_config.json").write_text(text)
        return ckpt

    return build


CONFIG_TYPES: dict[str, object] = {
    "vocab_size": "100",
    "hidden_size": 16.0,
    "tie_word_embeddings": "false",
    "text_config": [1, 2],
    "text_config.vocab_size": -5,
    "text_config.tie_word_embeddings": 1,
    "num_attention_heads": True,
    "num_key_value_heads": "2",
    "head_dim": [8],
    "intermediate_size": "32",
    "model_type": 3,
    "torch_dtype": ["float32"],
    "initializer_range": "0.02",
    "padded_vocab_size": 1.5,
    "llm_config.hidden_size": {"a": 1},
}


def _config_type_cases() -> list[Hostile]:
    out = [
        Hostile(
            "config-type-initializer_range-negative",
            "config-type",
            _edit_json("config.json", _set("initializer_range", -1.0)),
            3,
            names=("config.json", "initializer_range"),
            extra={"resize": ("--init", "normal")},  # exit 70 before: numpy's normal() with scale < 0
        )
    ]
    for key, value in CONFIG_TYPES.items():
        out.append(
            Hostile(
                f"config-type-{key}",
                "config-type",
                _edit_json("config.json", _set(key, value)),
                3,
                names=("config.json", key),
            )
        )
    # the same in model_config.json beside config.json (resize moves its vocab keys) and alone (PaddleNLP 2.x)
    out.append(
        Hostile(
            "config-type-model_config-beside",
            "config-type",
            _put("model_config.json", _json({"init_args": [{"vocab_size": "100"}]})),
            BESIDE,
            names=("model_config.json", "init_args.0.vocab_size"),
        )
    )
    out.append(
        Hostile(
            "config-type-model_config-only",
            "config-type",
            _model_config_only(
                json.dumps(
                    {
                        "init_args": [{"hidden_size": "16", "vocab_size": 100}],
                        "init_class": "LlamaForCausalLM",
                    }
                )
            ),
            3,
            names=("model_config.json", "hidden_size"),
        )
    )
    return out


def _wm_entry(value: object):
    def fn(doc: dict) -> None:
        doc["weight_map"]["lm_head.weight"] = value

    return fn


INDEX_ENTRIES: dict[str, object] = {
    "int": 5,
    "null": None,
    "list": ["model-00001-of-00001.safetensors"],
    "long-name": "m" * 300 + ".safetensors",
    "long-utf8": "é" * 130 + ".safetensors",
    "slash": "sub/model-00001-of-00001.safetensors",
    "dotdot": "../model-00001-of-00001.safetensors",
    "absolute": "/etc/passwd",
    "backslash": "..\\model-00001-of-00001.safetensors",
    "nul": "model\x00.safetensors",
    "empty": "",
    "not-listed": "model-00002-of-00009.safetensors",
}


def _index_cases() -> list[Hostile]:
    out = [
        Hostile(f"index-entry-{what}", "index", _edit_json(ST_INDEX, _wm_entry(v)), 3, names=(ST_INDEX,))
        for what, v in INDEX_ENTRIES.items()
    ]
    for what, meta in {
        "total-size-string": {"total_size": "123"},
        "total-size-negative": {"total_size": -1},
        "total-size-float": {"total_size": 1.5},
        "total-size-bool": {"total_size": True},
        "metadata-list": [1],
    }.items():
        out.append(
            Hostile(
                f"index-{what}", "index", _edit_json(ST_INDEX, _set("metadata", meta)), 3, names=(ST_INDEX,)
            )
        )
    out += [
        Hostile(
            "index-weight-map-list",
            "index",
            _edit_json(ST_INDEX, _set("weight_map", [1])),
            3,
            names=(ST_INDEX,),
        ),
        Hostile("index-not-object", "index", _put(ST_INDEX, _json([1, 2])), 3, names=(ST_INDEX,)),
    ]
    return out


TOKENIZER_CONFIGS: dict[str, dict] = {
    "list-token": {"eos_token": ["</s>"]},
    "int-token": {"bos_token": 1},
    "float-token": {"pad_token": 1.5},
    "object-token-no-content": {"unk_token": {"content": 5}},
    "decoder-list": {"added_tokens_decoder": [1, 2]},
    "decoder-entry-string": {"added_tokens_decoder": {"5": "<x>"}},
    "decoder-entry-content-list": {"added_tokens_decoder": {"5": {"content": ["<x>"]}}},
    "decoder-key-word": {"added_tokens_decoder": {"five": {"content": "<x>"}}},
    "decoder-key-superscript": {"added_tokens_decoder": {"²": {"content": "<x>"}}},
    "decoder-key-huge": {"added_tokens_decoder": {"9" * 5000: {"content": "<x>"}}},
}


def _tokenizer_cases() -> list[Hostile]:
    return [
        Hostile(
            f"tokenizer-type-{what}",
            "tokenizer-type",
            _put("tokenizer_config.json", _json(doc)),
            {"convert": 0, "*": 3},  # convert reads no token ids: it carries the file unchanged
            names=("tokenizer_config.json",),
        )
        for what, doc in TOKENIZER_CONFIGS.items()
    ]


CASES = _special_cases() + _json_cases() + _config_type_cases() + _index_cases() + _tokenizer_cases()
