"""The enums inside (issue 19, S3): a fact enum is its string everywhere it is printed or serialised, the
Format objects name files as the writers do, and Detection is grouped by role."""

from __future__ import annotations

import dataclasses
import json

import pytest

from tests.support.paths import REPO
from tietool.surgery.inspect.detect import detect
from tietool.surgery.inspect.detection import Detection
from tietool.surgery.inspect.findings import OneOf
from tietool.surgery.io.checkpoint import Checkpoint
from tietool.surgery.io.formats import FORMATS, PDPARAMS, SAFETENSORS, format_of
from tietool.surgery.model.enums import LAYOUTS, Container, HeadLayout, TieState
from tietool.surgery.model.errors import Opt, api_wording

SAMPLES = REPO / "sample_checkpoints"


@pytest.mark.parametrize("member", [*HeadLayout, *TieState, *Container])
def test_fact_enum_is_its_string(member) -> None:
    """f-strings, str(), %s, json and dict keys give the value: messages and --json keep today's bytes."""
    v = member.value
    assert (f"{member}", str(member), " ".join([member]), f"{member:>20}") == (v, v, v, f"{v:>20}")
    assert json.dumps({member: [member]}) == json.dumps({v: [v]})
    assert member == v and {v: 1}[member] == 1


def test_options_word_enums_by_value() -> None:
    """Python wording of an option whose value is an enum member: the string, as the CLI words it."""
    assert api_wording(Opt("layout", HeadLayout.HIDDEN_VOCAB)) == "layout='hidden-vocab'"
    assert repr(OneOf(LAYOUTS)) == "'vocab-hidden' or 'hidden-vocab'"


@pytest.mark.parametrize("container", list(Container))
def test_format_names_match_the_writer(container: Container) -> None:
    """The Format's shard and index names are the ones save_pretrained gives (and the assemble writer gave
    before it was folded into the one writer, which now takes them from the Format), for 1 to 3 shards."""
    fmt = format_of(container)
    assert fmt is FORMATS[container] and fmt.container is container
    stem, ext = (
        ("model", ".safetensors") if container is Container.SAFETENSORS else ("model_state", ".pdparams")
    )
    expected = {
        1: ([f"{stem}-00001-of-00001{ext}"], f"{stem}{ext}.index.json")
        if container is Container.SAFETENSORS
        else ([f"{stem}{ext}"], None),
        2: ([f"{stem}-00001-of-00002{ext}", f"{stem}-00002-of-00002{ext}"], f"{stem}{ext}.index.json"),
        3: ([f"{stem}-{k:05d}-of-00003{ext}" for k in (1, 2, 3)], f"{stem}{ext}.index.json"),
    }
    for n, (names, index) in expected.items():
        assert (fmt.shard_names(n), fmt.index_name(n)) == (names, index)
    assert (SAFETENSORS.single, SAFETENSORS.index) == ("model.safetensors", "model.safetensors.index.json")
    assert (PDPARAMS.single, PDPARAMS.index) == ("model_state.pdparams", "model_state.pdparams.index.json")


@pytest.mark.parametrize("sample", ["pf_llama_tied_fp32", "pnlp_gpt"])
def test_checkpoint_reads_through_its_format(sample: str) -> None:
    """A checkpoint's container is a Container and its Format reads the same arrays as load()."""
    ck = Checkpoint.open(SAMPLES / sample)
    assert isinstance(ck.format, Container) and ck.fmt is FORMATS[ck.format]
    name, t = next(iter(ck.tensors.items()))
    assert (ck.fmt.read_array(ck.path / t.file, t) == ck.load(name)).all()
    header = ck.fmt.read_header(ck.path / t.file, t.file)
    assert [x.name for x in header.tensors if x.file == t.file] == [
        n for n, x in ck.tensors.items() if x.file == t.file
    ]


def test_detection_grouped_by_role() -> None:
    """Detection holds its facts by role (13 fields, 34 before), each an enum or a typed group."""
    assert len(dataclasses.fields(Detection)) == 13
    det = detect(Checkpoint.open(SAMPLES / "pf_llama_tied_fp32"))
    assert det.head.present and det.head.layout is HeadLayout.VOCAB_HIDDEN
    assert det.comparison.values is TieState.EXACT and det.tie.tied is True
    assert (det.embedding.name, det.head.name) == ("model.embed_tokens.weight", "lm_head.weight")
    assert det.vocab_rows == det.embedding.rows == det.ckpt.tensors[det.embedding.name].shape[0]
