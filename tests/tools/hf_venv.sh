# source it: a venv with CPU torch + HF transformers (the version PaddleFormers 1.2 pins, >=5.0,<5.4), for the
# tests marked `hf` (tests/oracles/test_hf_loader.py: the proofs of the architecture table's `hf` loader facts).
# Built once at $HF_VENV (default $HOME/.cache/tietool/hf-venv) and rebuilt when the pins below change;
# exports HF_PYTHON.
# A venv of its own, not the test extra: in one process PaddleFormers patches transformers'
# is_torch_available to False, and its dependency paddlecodec installs a `torchcodec` module without
# torchcodec's metadata, so that transformers (seeing torch) fails to import any model
# ("No package metadata was found for torchcodec"). HF users do not have PaddleFormers beside transformers.
# torch==2.13.0 resolves to the 192 MB CPU wheel (torch-2.13.0+cpu) where pip finds it; a plain `torch`
# requirement pulls the CUDA build (GBs): never that.
_hf_build() {
  local HV=${HF_VENV:-$HOME/.cache/tietool/hf-venv}
  local pins="torch==2.13.0 transformers==5.3.0 safetensors numpy"
  if [ ! -f "$HV/.hf-ok" ] || [ "$(cat "$HV/.hf-ok")" != "$pins" ]; then
    if [ -e "$HV" ] && [ ! -f "$HV/pyvenv.cfg" ]; then echo "$HV exists and is not a venv: set HF_VENV"; return 1; fi
    rm -rf "$HV" && mkdir -p "$(dirname "$HV")"
    # shellcheck disable=SC2086  # the pin list is meant to split into words
    { "${HF_BASE_PYTHON:-python3.11}" -m venv "$HV" \
      && "$HV/bin/pip" install -q $pins \
      && "$HV/bin/python" -c "import torch, transformers; assert '+cpu' in torch.__version__ or not torch.cuda.is_available(), torch.__version__; assert transformers.__version__ == '5.3.0', transformers.__version__; import transformers.models.llama.modeling_llama"
    } >"$HV.build.log" 2>&1 \
      && printf '%s' "$pins" > "$HV/.hf-ok" \
      || { echo "cannot build the HF transformers venv at $HV (log: $HV.build.log)"; return 1; }
  fi
  export HF_PYTHON="$HV/bin/python"
}
_hf_build
