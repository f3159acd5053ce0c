# source it: a venv with paddlepaddle 2.6.2 + PaddleNLP 2.8.1 (it cannot live beside paddle 3), for the
# tests marked `pnlp` (tests/oracles/test_pnlp_loaders.py). Built once at $PNLP_VENV (default
# $HOME/.cache/tietool/pnlp-venv) and rebuilt when the pins below change; exports PNLP_PYTHON.
# Copied from the project's shared/tools/pnlp_venv.sh (a clone has no ../shared); changes: the pins are one
# list, recorded in the marker file, and a failed build returns 1 instead of exiting the sourcing shell.
# The pins after paddlenlp are needed: newer huggingface_hub / aistudio-sdk / datasets / pyarrow / pandas /
# scipy / scikit-learn break `import paddlenlp` 2.8.1. `import zlib` must come before `import paddle` (2.6.2).
_pnlp_build() {
  local PV=${PNLP_VENV:-$HOME/.cache/tietool/pnlp-venv}
  local pins="paddlepaddle==2.6.2 paddlenlp==2.8.1 | huggingface_hub==0.23.4 aistudio-sdk==0.2.6 datasets==2.19.2 pyarrow==16.1.0 pandas==2.2.2 scipy==1.13.1 scikit-learn==1.5.0"
  # an empty marker: built by shared/tools/pnlp_venv.sh, whose pins these are
  if [ ! -f "$PV/.pnlp-ok" ] || { [ -s "$PV/.pnlp-ok" ] && [ "$(cat "$PV/.pnlp-ok")" != "$pins" ]; }; then
    if [ -e "$PV" ] && [ ! -f "$PV/pyvenv.cfg" ]; then echo "$PV exists and is not a venv: set PNLP_VENV"; return 1; fi
    rm -rf "$PV" && mkdir -p "$(dirname "$PV")"
    # shellcheck disable=SC2086  # the pin lists are meant to split into words
    { "${PNLP_BASE_PYTHON:-python3.11}" -m venv "$PV" \
      && "$PV/bin/pip" install -q ${pins%%|*} \
      && "$PV/bin/pip" install -q ${pins#*|} \
      && CUDA_VISIBLE_DEVICES= "$PV/bin/python" -c "import zlib; import paddle; import paddlenlp; assert paddle.__version__ == '2.6.2', paddle.__version__; assert paddlenlp.__version__.startswith('2.8.1'), paddlenlp.__version__"
    } >"$PV.build.log" 2>&1 \
      && printf '%s' "$pins" > "$PV/.pnlp-ok" \
      || { echo "cannot build the PaddleNLP 2.8.1 venv at $PV (log: $PV.build.log)"; return 1; }
  fi
  export PNLP_PYTHON="$PV/bin/python"
}
_pnlp_build
