"""``hf://`` checkpoints: ``huggingface_hub``'s ``HfFileSystem`` pointed at a local stand-in for the Hub's
HTTP API (``support/hub_server.py``, serving fixtures as repositories); no network."""

from __future__ import annotations

import json
import struct

import pytest
from support.hub_server import HubServer
from support.paths import CASES_DIR

pytest.importorskip("huggingface_hub")
pytest.importorskip("upath")

REPOS = {"org/untied-sharded": "pf_llama_untied_sharded", "org/pnlp-untied": "pnlp_llama_untied"}


@pytest.fixture(scope="module")
def hub():
    from huggingface_hub import HfFileSystem, constants

    srv = HubServer({repo: CASES_DIR / case for repo, case in REPOS.items()}).start()
    # what HF_ENDPOINT sets when huggingface_hub is imported (it may be imported already)
    saved = constants.ENDPOINT, constants.HUGGINGFACE_CO_URL_TEMPLATE
    constants.ENDPOINT = srv.endpoint
    constants.HUGGINGFACE_CO_URL_TEMPLATE = srv.endpoint + "/{repo_id}/resolve/{revision}/{filename}"
    HfFileSystem.clear_instance_cache()
    yield srv
    constants.ENDPOINT, constants.HUGGINGFACE_CO_URL_TEMPLATE = saved
    HfFileSystem.clear_instance_cache()
    srv.stop()


def _doc(info) -> str:
    d = dict(info)
    d.pop("path")
    d.pop("transferred", None)
    return json.dumps(d, sort_keys=True, default=str)


@pytest.mark.parametrize("repo", sorted(REPOS))
@pytest.mark.parametrize("values", [False, True])
def test_inspect_hf_equals_local(hub, repo, values):
    from tietool.surgery import ops as operations

    hub.app.sent.clear()
    remote = operations.inspect(f"hf://{repo}", compare_values=values)
    local = operations.inspect(CASES_DIR / REPOS[repo], compare_values=values)
    assert _doc(remote) == _doc(local)
    files = {p: n for p, n in hub.app.sent.items() if "/resolve/" in p}
    assert remote["transferred"]["received"] == sum(files.values())  # tietool's count = the server's


def test_inspect_hf_no_values_reads_headers_only(hub):
    from tietool.surgery import ops as operations

    hub.app.sent.clear()
    operations.inspect("hf://org/untied-sharded", compare_values=False)
    folder = CASES_DIR / REPOS["org/untied-sharded"]
    for f in sorted(folder.glob("*.safetensors")):
        with open(f, "rb") as fh:
            header = 8 + struct.unpack("<Q", fh.read(8))[0]
        assert hub.app.sent.get(f"/org/untied-sharded/resolve/main/{f.name}", 0) == header, f.name


def test_resize_hf_to_local_equals_local(hub, tmp_path):
    from tietool.surgery import ops as operations

    operations.resize(CASES_DIR / REPOS["org/untied-sharded"], 192, tmp_path / "local", seed=0)
    operations.resize("hf://org/untied-sharded", 192, tmp_path / "remote", seed=0)
    names = sorted(p.name for p in (tmp_path / "local").iterdir())
    assert names == sorted(p.name for p in (tmp_path / "remote").iterdir())
    for n in names:
        a, b = (tmp_path / "local" / n).read_bytes(), (tmp_path / "remote" / n).read_bytes()
        if n == "tietool-report.json":
            ra, rb = json.loads(a), json.loads(b)
            for r in (ra, rb):
                r.pop("input"), r.pop("output"), r.pop("transferred", None)
            assert ra == rb
        else:
            assert a == b, n
