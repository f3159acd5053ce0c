"""Weight-file formats: headers first (``TensorInfo``), tensor data on demand.

* :mod:`.safetensors_io` — ``*.safetensors`` (header parse, streamed writer)
* :mod:`.pdparams_io` — Paddle ``*.pdparams`` pickles (opcode walker with an allow-list, streamed writer)
"""

from .tensor import DTYPES, DType, TensorInfo, bf16_bits_to_f32, f32_to_bf16_bits

__all__ = ["TensorInfo", "DTYPES", "DType", "bf16_bits_to_f32", "f32_to_bf16_bits"]
