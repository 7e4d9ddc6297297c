"""8-bit and 4-bit optimizer state, block-wise quantized and shard-local.

``quantized_state(tx, bits=8)`` stores the large float state leaves of ``tx``
that are shaped like a param (moments, accumulators, traces) as ``uint8``
codes plus one ``float32`` scale per block (``QuantizedArray``), decodes
them inside ``update``, runs ``tx.update`` in float and encodes the new
state again. Counters, scalars, factored statistics and leaves smaller than
``min_size`` elements stay as they are. Codes and scales are ordinary state
leaves built in ``init`` from the param, so their shardings are derived like
every other leaf's (``shardopt.sharding.plan_state_shardings``).

The block layout (``shardopt/_src/quantization/blocks.py``) is a tile of the
global array; given the params' shardings (and the ZeRO axis) the tile
divides every shard length, so no block straddles devices and the step needs
no communication that float32 state would not; a leaf where no tile of
``block_size`` elements fits stays float32, and
``describe_quantized_state`` says so.
"""

from collections.abc import Callable
import re
from typing import Any

import jax
import jax.numpy as jnp

from shardopt._src import base
from shardopt._src.quantization import blocks
from shardopt._src.quantization import codes
from shardopt._src.quantization.blocks import QuantizedArray
from shardopt._src.quantization.report import QuantizedLeaf
from shardopt._src.quantization.report import QuantizedStateReport
from shardopt._src.tree_map_params import tree_map_params

__all__ = [
    "NONNEGATIVE_FIELDS",
    "QuantizedArray",
    "QuantizedLeaf",
    "QuantizedStateReport",
    "describe_quantized_state",
    "quantized_state",
]

# State fields that hold averages of squares (second moments): they get the
# unsigned code. Everything else is assumed signed.
NONNEGATIVE_FIELDS = frozenset(
    {"nu", "nu_max", "sum_of_squares", "e_g", "e_x", "v", "v_row", "v_col"})

_DEFAULT_BLOCK_SIZE = {8: 256, 4: 128}


class _ParamLayout:
  """Per param: its shape and the lengths a tile must divide (a tree leaf)."""

  def __init__(self, shape, fit):
    self.shape, self.fit = tuple(shape), tuple(fit)


class _Candidate:
  """A param-shaped state leaf and its param's layout (a tree leaf)."""

  def __init__(self, value, layout: _ParamLayout):
    self.value, self.layout = value, layout


def _is_float(x) -> bool:
  return hasattr(x, "dtype") and jnp.issubdtype(x.dtype, jnp.floating)


def _default_nonnegative(path: str) -> bool:
  """Whether the last field name in ``path`` (``[0].nu['w']``: ``nu``) is one
  of ``NONNEGATIVE_FIELDS``."""
  names = re.findall(r"\.(\w+)", path)
  return bool(names) and names[-1] in NONNEGATIVE_FIELDS


class _Quantizer:
  """The configuration and the init/update of ``quantized_state``."""

  def __init__(self, inner, bits, block_size, min_size, nonnegative,
               param_shardings, shard_state_over, code):
    self.inner = base.with_extra_args_support(inner)
    self.bits, self.block_size, self.min_size = bits, block_size, min_size
    self.code = code
    self.nonnegative = nonnegative or _default_nonnegative
    self.param_shardings, self.axis = param_shardings, shard_state_over

  def book(self, path) -> codes.CodeBook:
    return codes.code_book(self.bits, not self.nonnegative(
        jax.tree_util.keystr(path)), self.code)

  def layouts(self, params):
    """A ``_ParamLayout`` per param (the params' tree structure)."""
    if self.param_shardings is None:
      return jax.tree.map(lambda p: _ParamLayout(p.shape, p.shape), params)
    flat, treedef = jax.tree_util.tree_flatten_with_path(params)
    shardings = jax.tree.leaves(self.param_shardings)
    if len(shardings) != len(flat):
      raise ValueError(
          f"quantized_state: param_shardings has {len(shardings)} leaves, the "
          f"params {len(flat)}; pass one NamedSharding per param (the tree the "
          "params are laid out with).")
    return jax.tree.unflatten(treedef, [
        self._layout(jax.tree_util.keystr(path), p.shape, s)
        for (path, p), s in zip(flat, shardings)])

  def _layout(self, path, shape, sharding) -> _ParamLayout:
    if not hasattr(sharding, "shard_shape"):
      raise TypeError(f"quantized_state: param_shardings{path} is {sharding!r};"
                      " expected a jax.sharding.NamedSharding.")
    spec = tuple(sharding.spec) + (None,) * (len(shape) - len(sharding.spec))
    used = {a for e in spec for a in (e if isinstance(e, tuple) else (e,))}
    split = 1
    if self.axis is not None and self.axis not in used:
      split = sharding.mesh.shape[self.axis]
    free = [d for d, e in enumerate(spec) if e is None]
    return _ParamLayout(shape, blocks.fit_lengths(
        shape, sharding.shard_shape(tuple(shape)), split, free))

  def decide(self, value, layout: _ParamLayout):
    """``(tile, reason)``: the tile to quantize with, or why not."""
    if tuple(value.shape) != layout.shape:
      return None, "not shaped like its param"
    if value.size < self.min_size:
      return None, f"{value.size} elements < min_size={self.min_size}"
    tile = blocks.choose_tile(value.shape, self.block_size, layout.fit)
    if tile is None:
      return None, (f"no tile of {self.block_size} elements divides the shard"
                    f" lengths {layout.fit}")
    return tile, ""

  def candidates(self, state, params):
    """``state`` with each param-shaped float leaf wrapped in ``_Candidate``."""
    wrap = lambda v, l: _Candidate(v, l) if _is_float(v) else v
    return tree_map_params(self.inner, wrap, state, self.layouts(params))

  def encode(self, state, params):
    def store(path, x):
      if not isinstance(x, _Candidate):
        return x
      tile, _ = self.decide(x.value, x.layout)
      if tile is None:
        return x.value
      return blocks.quantize(x.value, tile, self.book(path), self.bits)
    return jax.tree_util.tree_map_with_path(store, self.candidates(state, params))

  def decode(self, state, template):
    def load(path, x, like):
      if not isinstance(x, QuantizedArray):
        return x
      tile = tuple(n // m for n, m in zip(like.shape, x.scales.shape))
      return blocks.dequantize(x, tile, self.book(path), self.bits, like.dtype)
    return jax.tree_util.tree_map_with_path(
        load, state, template, is_leaf=lambda x: isinstance(x, QuantizedArray))

  def init(self, params):
    return self.encode(self.inner.init(params), params)

  def update(self, updates, state, params=None, **extra_args):
    float_state = self.decode(state, jax.eval_shape(self.inner.init, updates))
    updates_out, new_state = self.inner.update(
        updates, float_state, params, **extra_args)
    return updates_out, self.encode(new_state, updates)

  def report(self, params) -> QuantizedStateReport:
    state = jax.eval_shape(self.inner.init, params)
    rows = []
    def describe(path, x):
      value = x.value if isinstance(x, _Candidate) else x
      if not _is_float(value) or not value.shape:
        return x
      tile, reason = (self.decide(value, x.layout) if isinstance(x, _Candidate)
                      else (None, "not shaped like a param"))
      name = jax.tree_util.keystr(path)
      if tile is None:
        rows.append(QuantizedLeaf(name, tuple(value.shape), str(value.dtype),
                                  None, value.size * value.dtype.itemsize,
                                  reason))
      else:
        stored = jax.eval_shape(
            lambda v: blocks.quantize(v, tile, self.book(path), self.bits),
            value)
        rows.append(QuantizedLeaf(
            name, tuple(value.shape), self.book(path).name, tile,
            sum(s.size * s.dtype.itemsize for s in stored), ""))
      return x
    jax.tree_util.tree_map_with_path(describe, self.candidates(state, params))
    return QuantizedStateReport(self.bits, tuple(rows))


def quantized_state(
    inner: base.GradientTransformation,
    bits: int = 8,
    block_size: int | None = None,
    min_size: int = 4096,
    *,
    nonnegative: Callable[[str], bool] | None = None,
    param_shardings: Any = None,
    shard_state_over: str | None = None,
    code: str = "dynamic",
) -> base.GradientTransformationExtraArgs:
  """Stores the param-shaped float state of ``inner`` in 8 or 4 bits.

  Each float state leaf with its param's shape and at least ``min_size``
  elements is kept as ``QuantizedArray(codes, scales)``: per block of
  ``block_size`` elements (a tile of the global array) one ``float32``
  absmax scale, and per element the ``uint8`` index of the nearest value of
  a code book (at 4 bits two indices per byte). ``update`` decodes, runs
  ``inner.update`` in the state's float dtype and encodes the new state.

  Codes. Signed leaves (first moments, momentum traces) use the dynamic code
  of Dettmers et al.: one decade per level, finer near 1, exact 0 and 1 (at
  8 bits magnitudes down to 1e-6 of the block's absmax; at 4 bits 15 values
  down to 1e-2, the dynamic-exponent code Li et al. use for the first
  moment). Non-negative leaves (second moments) use the unsigned dynamic
  code at 8 bits and, at 4 bits, the linear code without zero of Li et al.,
  applied to ``sqrt(v)`` (a 256-fold range of ``v`` in 16 steps): a small
  second moment that rounded to zero would make ``1 / sqrt(v)`` explode, so
  a positive value never gets a zero code. Li et al.'s rank-1
  normalisation is not used: its row and column maxima need a reduction
  across shards, and the block-wise absmax needs none. Which leaves are
  non-negative is decided statically by the field's name (never by the
  values, which could flip from step to step): ``NONNEGATIVE_FIELDS``
  (``nu``, ``nu_max``, ``sum_of_squares``, ...) unless ``nonnegative`` says
  otherwise; a negative value in such a leaf is stored as the smallest code.

  Blocks and shards. Pass the params' ``param_shardings`` (and the ZeRO axis
  ``shard_state_over``, as given to ``make_sharded_optimizer``): each tile
  then divides every shard length, including a ZeRO split of any free
  dimension, so no block straddles two devices. A leaf where no tile of
  ``block_size`` elements fits stays in float (``describe_quantized_state``
  lists it and why). Without shardings the tile is taken from the last
  dimensions of the unsharded array. Tiles depend only on the global shapes
  and these arguments, so a checkpoint restores onto any mesh bit-exactly.

  Non-finite values: the scale is the largest finite ``|x|`` of the block,
  ``+-inf`` is stored as ``+-scale`` and ``nan`` as the code nearest zero, so
  the rest of the block keeps its values. The step that produced a ``nan``
  still returns it in its updates (they are computed from float state).

  Args:
    inner: any transformation (shardopt's or optax's).
    bits: 8 or 4.
    block_size: elements per block, a power of two; default 256 at 8 bits
      and 128 at 4 bits (4 bytes of scale per block).
    min_size: leaves with fewer elements stay in float (default 4096).
    nonnegative: ``f(path) -> bool`` over the leaf's path in ``inner``'s
      state (``jax.tree_util.keystr``): whether it gets the unsigned code.
      Default: its last field name is in ``NONNEGATIVE_FIELDS``.
    param_shardings: a ``NamedSharding`` per param, or None.
    shard_state_over: the ZeRO mesh axis the state is also sharded over.
    code: the code books (``shardopt/_src/quantization/codes.py``):
      ``"dynamic"`` as above, or ``"companded"`` (FlashOptim, Ortiz et al.
      2026): signed leaves as ``2x / (1 + |x|)`` rounded to ``2**(bits-1)-1``
      steps a side, non-negative leaves as the linear zero-free code of
      ``sqrt(v)`` at both widths; one division or root per element.

  Returns:
    A ``GradientTransformationExtraArgs`` with ``inner``'s updates computed
    from the decoded state.

  References:
    Dettmers, Lewis, Shleifer & Zettlemoyer, "8-bit Optimizers via
    Block-wise Quantization", ICLR 2022 (https://arxiv.org/abs/2110.02861);
    Li, Chen & Zhu, "Memory Efficient Optimizers with 4-bit States",
    NeurIPS 2023 (https://arxiv.org/abs/2309.01507); Gonzalez Ortiz, Gupta,
    Renard & Blalock, "FlashOptim: Optimizers for Memory Efficient
    Training", 2026 (https://arxiv.org/abs/2602.23349).
  """
  if bits not in (8, 4):
    raise ValueError(f"quantized_state: bits={bits}; expected 8 or 4.")
  block_size = block_size or _DEFAULT_BLOCK_SIZE[bits]
  if block_size < 2 or block_size & (block_size - 1):
    raise ValueError(f"quantized_state: block_size={block_size}; expected a "
                     "power of two >= 2 (e.g. 128 or 256).")
  if min_size < 0:
    raise ValueError(f"quantized_state: min_size={min_size}; expected >= 0.")
  if code not in codes.CODES:
    raise ValueError(f"quantized_state: code={code!r}; expected one of "
                     f"{codes.CODES}.")
  quantizer = _Quantizer(inner, bits, block_size, min_size, nonnegative,
                         param_shardings, shard_state_over, code)
  return base.GradientTransformationExtraArgs(quantizer.init, quantizer.update)


def describe_quantized_state(tx, params) -> QuantizedStateReport:
  """How ``quantized_state`` stores each float state leaf for ``params``.

  Args:
    tx: a transformation returned by ``quantized_state``.
    params: the params (arrays or ``jax.ShapeDtypeStruct``).

  Returns:
    A ``QuantizedStateReport``: per float leaf its code book and tile or
    why it stays in float (``fallbacks`` lists the leaves no tile fits).
  """
  quantizer = getattr(tx.init, "__self__", None)
  if not isinstance(quantizer, _Quantizer):
    raise TypeError("describe_quantized_state: tx was not built by "
                    "shardopt.quantized_state.")
  return quantizer.report(params)
