"""The optimizer-state variants the quantized-state benchmarks compare."""

from shardopt._src.quantization import codes

# Quantized state: (bits, code); None is float32 state.
VARIANTS = [None] + [(bits, code) for bits in (8, 4) for code in codes.CODES]


def label(variant) -> str:
  return "float32" if variant is None else f"{variant[0]}-bit {variant[1]}"
