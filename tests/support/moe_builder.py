"""Real PaddleFormers 1.2 MoE checkpoints with 4 routed experts, for the expert-parallel merge tests.

``python moe_builder.py OUT`` builds every MoE family of :data:`EXPERT_KEYS` as :mod:`support.family_builder`
does (same tiny configs, same seeds; ERNIE-4.5-MoE, which family_builder lacks, with
:mod:`support.convert_loads`' config) but with 4 routed experts (so they can be cut into 2 and 4
expert-parallel ranks), the count set under the model type's own key (dotted: inside ``text_config``), and
saves each with the library's legacy save
(``save_pretrained(save_checkpoint_format="legacy", save_to_hf=False, safe_serialization=False)``:
``model_state.pdparams`` + ``config.json``, as the trainer's rank files are written). One subprocess for all.
"""

from __future__ import annotations

import contextlib
import io
import json
import logging
import os
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import family_builder as fb  # noqa: E402

EXPERT_KEYS = {
    "qwen3_moe": "num_experts",
    "qwen2_moe": "num_experts",
    "qwen3_next": "num_experts",
    "deepseek_v3": "n_routed_experts",
    "glm4_moe": "n_routed_experts",
    "glm4v_moe": "text_config.n_routed_experts",
    "ernie4_5_moe": "moe_num_experts",
}
"""model_type → the key its configuration class takes the number of routed experts under (PaddleFormers
1.2 ``transformers/<family>/configuration.py``)."""
EXPERTS = 4


def build(out: Path, timeout: float = 600) -> dict[str, Path]:
    """Build every family of :data:`EXPERT_KEYS` into ``out/<family>`` (one subprocess); family → folder."""
    out.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="")
    from support import preload  # the parent side only: this file also runs as a script

    cp = preload.run(
        [sys.executable, __file__, str(out)],
        libs=preload.PADDLEFORMERS,
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
        stdin=subprocess.DEVNULL,
    )
    if cp.returncode != 0:
        raise RuntimeError(f"moe_builder failed (exit {cp.returncode}):\n{cp.stderr[-3000:]}")
    return {f: out / f for f in EXPERT_KEYS}


def _main(root: str) -> int:
    fb._stub_gpt_provider()
    fb._stub_paddlefleet_ops()
    import paddle

    paddle.set_device("cpu")
    logging.disable(logging.WARNING)
    import convert_loads

    config, model, kwargs, seed = convert_loads.ERNIE["ernie4_5_moe"]
    fb.FAMILIES.setdefault(
        "ernie4_5_moe",
        {"config": config, "model": model, "kwargs": kwargs, "seed": seed, "dtype": "float32"},
    )
    for family, key in EXPERT_KEYS.items():
        spec = fb.FAMILIES[family]
        block, _, leaf = key.rpartition(".")
        kwargs = dict(spec["kwargs"])
        if block:
            kwargs[block] = {**kwargs[block], leaf: EXPERTS}
        else:
            kwargs[leaf] = EXPERTS
        fb.FAMILIES[family] = {**spec, "kwargs": kwargs}
        with contextlib.redirect_stdout(io.StringIO()):
            model = fb._build_model(family, "untied")
            fb._save(model, {"sharded": False, "fmt": "pdparams"}, Path(root) / family)
        for transient in (Path(root) / family).glob("saved_signal_*"):
            transient.unlink()
    Path(root, "done.json").write_text(json.dumps(sorted(EXPERT_KEYS)))
    return 0


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1]))
