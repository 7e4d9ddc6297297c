"""``QuantizedArray``: one state leaf stored as block-wise codes, self-describing.

A quantized leaf keeps its codes and per-block scales (the arrays, ordinary
pytree leaves that shard and checkpoint like any other) and, as static
metadata, what is needed to read them back: the leaf's global shape and its
code (bits and sign). The block (tile) is the leaf's shape divided by the
scales' shape, so a leaf read from a checkpoint written on another mesh,
with other tiles, still decodes, and ``retile`` re-encodes it for the tiles
of this mesh.
"""

import dataclasses

import jax
import jax.numpy as jnp

from shardopt._src.quantization import blocks
from shardopt._src.quantization import codes

__all__ = ["QuantizedArray", "decode", "encode", "is_quantized", "requantize",
           "retile"]


@dataclasses.dataclass(frozen=True)
class QuantizedArray:
  """A float state leaf stored as ``codes`` (``uint8``; at 4 bits two per
  byte) and one ``float32`` absmax ``scales`` entry per block."""

  codes: jax.Array
  scales: jax.Array
  shape: tuple[int, ...]  # the decoded leaf's global shape
  bits: int  # 8 or 4
  signed: bool  # signed code (any sign) or unsigned (non-negative moments)
  code: str  # the code family (codes.CODES)

  @property
  def tile(self) -> tuple[int, ...]:
    """The block: a tile of the global array, ``shape / scales.shape``."""
    return tuple(n // m for n, m in zip(self.shape, self.scales.shape))

  @property
  def book(self) -> codes.CodeBook:
    return codes.code_book(self.bits, self.signed, self.code)

  def decode(self, dtype=jnp.float32) -> jax.Array:
    """The values stored, in ``dtype``."""
    return decode(self, dtype)


jax.tree_util.register_dataclass(
    QuantizedArray, data_fields=["codes", "scales"],
    meta_fields=["shape", "bits", "signed", "code"])


def is_quantized(x) -> bool:
  return isinstance(x, QuantizedArray)


def encode(x, tile, bits: int, signed: bool, code: str) -> QuantizedArray:
  """``x`` quantized in blocks of ``tile`` with the ``bits``-bit code of
  family ``code``."""
  stored = blocks.quantize(x, tile, codes.code_book(bits, signed, code), bits)
  return QuantizedArray(stored.codes, stored.scales, tuple(x.shape), bits,
                        signed, code)


def decode(q: QuantizedArray, dtype=jnp.float32) -> jax.Array:
  """The values ``q`` stores, in ``dtype``."""
  return blocks.dequantize(blocks.BlockCodes(q.codes, q.scales), q.tile,
                           q.book, q.bits, dtype)


def requantize(x, like: QuantizedArray) -> QuantizedArray:
  """``x`` quantized with ``like``'s tile and code."""
  return encode(x, like.tile, like.bits, like.signed, like.code)


def retile(q: QuantizedArray, like: QuantizedArray) -> QuantizedArray:
  """``q``'s values in ``like``'s blocks (a state restored onto a mesh whose
  shards fit other blocks).

  Args:
    q: the quantized leaf as saved.
    like: the leaf as this mesh lays it out (its arrays may be
      ``jax.ShapeDtypeStruct``s): the same shape and code, maybe other
      tiles.

  Returns:
    ``q`` itself where the tiles agree; else ``q`` decoded and encoded
    again in ``like``'s tiles, each value within one quantization step of
    ``q``'s.

  Raises:
    ValueError: ``like`` has another shape or code.

  References:
    Dettmers et al., "8-bit Optimizers via Block-wise Quantization", ICLR
    2022 (https://arxiv.org/abs/2110.02861): block-wise absmax codes.
  """
  if (q.shape, q.bits, q.signed, q.code) != (like.shape, like.bits,
                                             like.signed, like.code):
    raise ValueError(
        f"retile: a leaf of shape {q.shape} coded {q.book.name} cannot become "
        f"one of shape {like.shape} coded {like.book.name}.")
  if q.tile == like.tile:
    return q
  return requantize(decode(q), like)
