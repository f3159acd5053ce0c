"""verify knows tokenizers: each folder's tokenizer files agree, every token of the input keeps its id,
tokens only in the output are the ones its tietool-report.json lists (``add_tokens.tokens``), the output's
len(tokenizer) fits its rows, and tokenizer files differ only in the tokens they list; anything else is
exit 7 naming the token or file.

The edited outputs are written by hand here with the ``tokenizers`` library (``Tokenizer.add_tokens``, as
HF transformers' ``add_tokens`` does) on the real trained tokenizers of tests/data/tokenizers/; the new
rows are the mean of the rows of the ids the old tokenizer splits the string into (the ``subtokens`` init).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from support import cli_runner
from test_tokenizer_read import trained_rows, write_checkpoint

from tietool import verify
from tietool.surgery.model.errors import ExitCode

EMB = "model.embed_tokens.weight"


def _rows(folder: Path) -> np.ndarray:
    from safetensors.numpy import load_file

    return load_file(str(folder / "model.safetensors"))[EMB]


def _save_rows(folder: Path, rows: np.ndarray) -> None:
    from safetensors.numpy import load_file, save_file

    t = load_file(str(folder / "model.safetensors"))
    t[EMB] = np.ascontiguousarray(rows, np.float32)
    save_file(t, str(folder / "model.safetensors"), metadata={"format": "np"})
    cfg = json.loads((folder / "config.json").read_text())
    cfg["vocab_size"] = rows.shape[0]
    (folder / "config.json").write_text(json.dumps(cfg, indent=2))


def _add(
    folder: Path, tokens: list[str], decoder: bool = True, report: bool = True, special: bool = False
) -> list[int]:
    """Add ``tokens`` to folder's tokenizer.json (tokenizers' add_tokens), its tokenizer_config.json decoder
    (unless ``decoder`` is False) and the report; set their rows (when the folder has them) to the mean
    of their subtokens' rows. Returns the new ids."""
    from tokenizers import AddedToken, Tokenizer

    lib = Tokenizer.from_file(str(folder / "tokenizer.json"))
    subs = [lib.encode(t, add_special_tokens=False).ids for t in tokens]
    n0 = lib.get_vocab_size(with_added_tokens=True)
    new = [AddedToken(t, special=special, normalized=not special) for t in tokens]
    (lib.add_special_tokens if special else lib.add_tokens)(new)
    lib.save(str(folder / "tokenizer.json"))
    ids = [lib.token_to_id(t) for t in tokens]
    assert ids == list(range(n0, n0 + len(tokens)))
    if decoder:
        tc = json.loads((folder / "tokenizer_config.json").read_text())
        for t, i in zip(tokens, ids, strict=True):
            tc["added_tokens_decoder"][str(i)] = {
                "content": t,
                "lstrip": False,
                "normalized": not special,
                "rstrip": False,
                "single_word": False,
                "special": special,
            }
        (folder / "tokenizer_config.json").write_text(json.dumps(tc, indent=2, sort_keys=True))
    rows = _rows(folder)
    for i, s in zip(ids, subs, strict=True):
        if i < rows.shape[0]:
            rows[i] = rows[s].mean(axis=0)
    _save_rows(folder, rows)
    if report:
        toks = [
            {"content": t, "id": i, "special": special, "existed": False}
            for t, i in zip(tokens, ids, strict=True)
        ]
        (folder / "tietool-report.json").write_text(
            json.dumps({"operation": "add-tokens", "add_tokens": {"tokens": toks}})
        )
    return ids


@pytest.fixture
def before(tmp_path):
    """Tied Qwen2 with the byte-level BPE tokenizer (304 tokens) and 312 rows: 8 slack rows."""
    return write_checkpoint(tmp_path / "before", trained_rows(312), "bytelevel_bpe")


def _after(before: Path) -> Path:
    out = before.parent / "after"
    shutil.copytree(before, out)
    return out


def test_a_correct_add_into_slack_rows_is_explained(before):
    after = _after(before)
    assert _add(after, ["<tool_call>", "</tool_call>"]) == [304, 305]
    res = verify(before, after)
    assert res.unexplained == [] and res.exit_code == ExitCode.OK
    assert res.tokenizer["added"] == [
        {"content": "<tool_call>", "id": 304},
        {"content": "</tool_call>", "id": 305},
    ]
    (ch,) = res.changed
    assert ch["name"] == EMB and "304..305" in ch["why"]


def test_a_correct_special_add_is_explained(before):
    after = _after(before)
    _add(after, ["<|tool|>"], special=True)
    assert verify(before, after).exit_code == ExitCode.OK


def test_a_correct_add_that_grows_the_rows_is_explained(tmp_path):
    before = write_checkpoint(tmp_path / "before", trained_rows(304), "bytelevel_bpe")  # no slack
    after = _after(before)
    rows = _rows(after)
    _save_rows(after, np.concatenate([rows, np.zeros((8, rows.shape[1]), np.float32)]))
    _add(after, ["<tool_call>"])
    res = verify(before, after)
    assert res.unexplained == [], res.unexplained
    assert [r["name"] for r in res.resized] == [EMB]


def test_a_token_whose_id_moved(before):
    after = _after(before)
    tj = json.loads((after / "tokenizer.json").read_text())
    vocab = tj["model"]["vocab"]
    a, b = (t for t, i in vocab.items() if i in (100, 101))
    vocab[a], vocab[b] = vocab[b], vocab[a]
    (after / "tokenizer.json").write_text(json.dumps(tj))
    res = verify(before, after)
    assert res.exit_code == ExitCode.UNEXPLAINED
    moved = [u for u in res.unexplained if u.startswith("token ")]
    assert any(f"(id {vocab[b]}) is id {vocab[a]} in the output" in u for u in moved), res.unexplained


def test_a_token_the_report_does_not_list(before):
    after = _after(before)
    _add(after, ["<tool_call>"], report=False)
    res = verify(before, after)
    assert res.exit_code == ExitCode.UNEXPLAINED
    assert (
        "token '<tool_call>' (id 304) is only in the output: tietool-report.json does not list it"
        in res.unexplained
    )
    assert any(u.startswith(f"{EMB} changed") for u in res.unexplained)  # its row is no longer excused


def test_a_report_of_another_token(before):
    after = _after(before)
    _add(after, ["<tool_call>"])
    rep = json.loads((after / "tietool-report.json").read_text())
    rep["add_tokens"]["tokens"][0]["content"] = "<other>"
    (after / "tietool-report.json").write_text(json.dumps(rep))
    res = verify(before, after)
    assert (
        "token '<tool_call>' (id 304) is only in the output: the report adds '<other>' at id 304"
        in res.unexplained
    )


def test_tokens_beyond_the_output_rows(before):
    after = _after(before)
    _add(after, [f"<extra_{k}>" for k in range(10)])  # 304..313 into 312 rows
    res = verify(before, after)
    assert res.exit_code == ExitCode.UNEXPLAINED
    assert (
        "the output's tokenizer has 314 tokens but its embedding only 312 rows: ids 312..313 have no row"
        in res.unexplained
    )


def test_the_output_tokenizer_files_disagree(before):
    after = _after(before)
    _add(after, ["<tool_call>"], decoder=False)
    res = verify(before, after)
    assert res.exit_code == ExitCode.UNEXPLAINED
    assert any(
        u.startswith(
            "the output's tokenizer files disagree: tokenizer.json added_tokens has '<tool_call>' (id 304)"
        )
        for u in res.unexplained
    ), res.unexplained


def test_a_tokenizer_file_changed_beyond_its_tokens(before):
    after = _after(before)
    _add(after, ["<tool_call>"])
    tj = json.loads((after / "tokenizer.json").read_text())
    tj["truncation"] = {"max_length": 8, "strategy": "LongestFirst", "stride": 0, "direction": "Right"}
    (after / "tokenizer.json").write_text(json.dumps(tj))
    res = verify(before, after)
    assert "tokenizer.json differs beyond the tokens it lists (added_tokens)" in res.unexplained


def test_a_tokenizer_file_changed_without_a_token_change(before):
    after = _after(before)
    tc = json.loads((after / "tokenizer_config.json").read_text())
    tc["model_max_length"] = 7
    (after / "tokenizer_config.json").write_text(json.dumps(tc))
    res = verify(before, after)
    assert res.unexplained == [
        f"{after} has no tietool-report.json: no operation is recorded to explain its difference(s) from "
        "the input; verify the folder tietool wrote (its tietool-report.json beside the weights), or put "
        "that run's tietool-report.json back",
        "tokenizer_config.json differs and tietool-report.json lists no token added or removed",
    ]


def test_a_row_changed_outside_the_added_ids(before):
    after = _after(before)
    _add(after, ["<tool_call>"])
    rows = _rows(after)
    rows[5] += 1
    _save_rows(after, rows)
    res = verify(before, after)
    assert any(u.startswith(f"{EMB} changed") for u in res.unexplained), res.unexplained


def test_a_trim_that_removes_reported_tokens(tmp_path):
    before = write_checkpoint(tmp_path / "before", trained_rows(304), "bytelevel_bpe")
    after = _after(before)
    _save_rows(after, _rows(after)[:302])
    tj = json.loads((after / "tokenizer.json").read_text())
    gone = [t for t in tj["added_tokens"] if t["id"] >= 302]
    tj["added_tokens"] = [t for t in tj["added_tokens"] if t["id"] < 302]
    (after / "tokenizer.json").write_text(json.dumps(tj))
    tc = json.loads((after / "tokenizer_config.json").read_text())
    tc["added_tokens_decoder"] = {k: v for k, v in tc["added_tokens_decoder"].items() if int(k) < 302}
    tc["additional_special_tokens"] = [
        t for t in tc.get("additional_special_tokens", []) if t not in {g["content"] for g in gone}
    ]
    (after / "tokenizer_config.json").write_text(json.dumps(tc))
    sm = json.loads((after / "special_tokens_map.json").read_text())
    if "additional_special_tokens" in sm:
        sm["additional_special_tokens"] = tc["additional_special_tokens"]
    (after / "special_tokens_map.json").write_text(json.dumps(sm))
    res = verify(before, after)
    assert sorted(u for u in res.unexplained if u.startswith("token ")) == sorted(
        f"token {g['content']!r} (id {g['id']}) is not in the output's tokenizer" for g in gone
    )
    removed = [{"content": g["content"], "id": g["id"]} for g in gone]
    for spelling in ("tokens_removed", "removed"):  # resize's report, and the TokenEdit's field name
        rep = {"operation": "resize", "resize": {spelling: removed, "rows_before": 304, "rows_after": 302}}
        (after / "tietool-report.json").write_text(json.dumps(rep))
        res = verify(before, after)
        assert res.unexplained == [], res.unexplained
        assert res.tokenizer["removed"] == removed
    # a removal is a trim's: a report without the rows it kept, or keeping the removed ids, is unverifiable
    for rows in ({}, {"rows_before": 304, "rows_after": 304}):
        rep = {"operation": "resize", "resize": {"tokens_removed": removed, **rows}}
        (after / "tietool-report.json").write_text(json.dumps(rep))
        res = verify(before, after)
        lines = [u for u in res.unexplained if u.startswith("token ")]
        assert len(lines) == len(gone) and all("unverifiable" in u for u in lines), res.unexplained


def test_cli_exit_7_names_the_token_and_json_lists_it(before):
    after = _after(before)
    _add(after, ["<tool_call>"], report=False)
    r = cli_runner.run_cli(["verify", before, after])
    assert r.rc == 7
    assert (
        "token '<tool_call>' (id 304) is only in the output: tietool-report.json does not list it"
        in r.stdout + r.stderr
    )
    r = cli_runner.run_cli(["verify", before, after, "--json"])
    got = json.loads(r.stdout)
    assert got["exit_code"] == 7 and got["tokenizer"]["after"]["length"] == 305
    shutil.rmtree(after)
    after = _after(before)
    _add(after, ["<tool_call>"])
    assert cli_runner.run_cli(["verify", before, after]).rc == 0


def _set_head(folder: Path, head: np.ndarray) -> None:
    from safetensors.numpy import load_file, save_file

    t = load_file(str(folder / "model.safetensors"))
    t["lm_head.weight"] = np.ascontiguousarray(head, np.float32)
    save_file(t, str(folder / "model.safetensors"), metadata={"format": "np"})


def test_an_untied_hidden_vocab_head_column_of_a_new_token(tmp_path):
    """An untied [hidden, vocab] head: the new token's column may change (the mean of its subtokens'
    columns), every other column must keep its bits."""
    head = trained_rows(312, seed=1).T  # [8, 312]
    before = write_checkpoint(tmp_path / "before", trained_rows(312), "bytelevel_bpe", head=head)
    after = _after(before)
    (i,) = _add(after, ["<tool_call>"])
    from tokenizers import Tokenizer

    subs = (
        Tokenizer.from_file(str(before / "tokenizer.json"))
        .encode("<tool_call>", add_special_tokens=False)
        .ids
    )
    new = head.copy()
    new[:, i] = head[:, subs].mean(axis=1)
    _set_head(after, new)
    res = verify(before, after)
    assert res.unexplained == [], res.unexplained
    assert sorted(c["name"] for c in res.changed) == ["lm_head.weight", EMB]
    new[:, 3] += 1  # a column of an old token
    _set_head(after, new)
    res = verify(before, after)
    assert any(u.startswith("lm_head.weight changed") for u in res.unexplained), res.unexplained


ADD_CASES = [
    ("bytelevel_bpe", 312, {}),
    ("bytelevel_bpe", 304, {"pad_to_multiple_of": 16}),  # no slack: the rows grow
    ("sp_bpe_with_json", 256, {"special": True}),
    ("sp_unigram", 252, {}),
    ("sp_bpe", 250, {}),
    ("wordpiece", 240, {}),
    ("gpt2_bpe", 301, {"init": "mean"}),
]


@pytest.mark.parametrize(("tok", "rows", "kw"), ADD_CASES)
def test_verify_explains_what_add_tokens_writes(tmp_path, tok, rows, kw):
    """tietool's own add-tokens output (every tokenizer format, slack and growth, special, mean init) is
    explained token by token and row by row; the output's files agree (inspect)."""
    import tietool

    if not hasattr(tietool, "add_tokens"):
        pytest.skip("add-tokens is not on this branch yet (i20-addplan)")
    from tietool.surgery.inspect.summary import inspect_path

    src = write_checkpoint(tmp_path / "in", trained_rows(rows), tok)
    out = tmp_path / "out"
    tietool.add_tokens(src, ["<tool_call>", "hello_world_x", "<think>"], out, seed=1, **kw)
    res = verify(src, out)
    assert res.unexplained == [] and res.exit_code == ExitCode.OK
    assert [t["content"] for t in res.tokenizer["added"]][:2] == ["<tool_call>", "hello_world_x"]
    assert inspect_path(out)["vocab"]["tokenizer"]["agree"]


def test_verify_explains_a_resize_trim_that_removes_tokens(tmp_path):
    """tietool's own resize --force below added tokens (they leave every tokenizer file; the report lists
    them as resize.tokens_removed) is explained; the same trim with the report's list emptied is not."""
    import tietool

    src = write_checkpoint(tmp_path / "in", trained_rows(304), "bytelevel_bpe")
    out = tmp_path / "out"
    tietool.resize(src, 302, out, force=True)
    res = verify(src, out)
    assert res.unexplained == [] and res.exit_code == ExitCode.OK
    gone = [{"content": "<|im_end|>", "id": 302}, {"content": "<think>", "id": 303}]
    assert res.tokenizer["removed"] == gone
    rep = json.loads((out / "tietool-report.json").read_text())
    rep["resize"]["tokens_removed"] = []
    (out / "tietool-report.json").write_text(json.dumps(rep))
    res = verify(src, out)
    assert "token '<think>' (id 303) is not in the output's tokenizer" in res.unexplained


def test_a_shortfall_the_input_already_has_is_a_note_not_a_difference(tmp_path):
    """The input's tokenizer already has more tokens than rows (case b20's `<pad>` of added_tokens.json):
    an operation that leaves it so (tie, untie, convert, a resize to the same rows) did not make the
    difference, so verify notes it and exits 0; one that makes it worse (fewer rows) is still exit 7."""
    before = write_checkpoint(tmp_path / "before", trained_rows(312), "bytelevel_bpe")
    _add(before, [f"<extra_{k}>" for k in range(10)], report=False)  # 314 tokens for 312 rows
    same = _after(before)
    res = verify(before, same)
    assert res.exit_code == ExitCode.OK, res.unexplained
    assert res.notes == [
        "the output's tokenizer has 314 tokens but its embedding only 312 rows: ids 312..313 have no row "
        "(the input's has 314 tokens for 312 rows)"
    ]
    worse = tmp_path / "worse"
    shutil.copytree(before, worse)
    _save_rows(worse, _rows(before)[:311])
    res = verify(before, worse)
    assert (
        "the output's tokenizer has 314 tokens but its embedding only 311 rows: ids 311..313 have no row"
        in res.unexplained
    )


def test_a_disagreement_the_input_already_has_is_a_note(before):
    """Tokenizer files that disagree in the input and, the same way, in the output: a note (the input's
    problem), not a difference of the operation; a new disagreement in the output is exit 7 (above)."""
    _add(before, ["<tool_call>"], decoder=False, report=False)
    after = _after(before)
    res = verify(before, after)
    assert res.exit_code == ExitCode.OK, res.unexplained
    assert any(n.startswith("the input's tokenizer files disagree: ") for n in res.notes), res.notes
    assert any(n.endswith("(as the input's do)") for n in res.notes), res.notes
