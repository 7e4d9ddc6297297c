"""8-bit and 4-bit optimizer state, block-wise quantized and shard-local.

``quantized_state(tx, bits=8)`` stores the moments of ``tx`` (the state
fields its transformations declare as moments, ``shardopt._src.moments``)
that have their param's shape as ``QuantizedArray``s: ``uint8`` codes plus
one ``float32`` scale per block. ``update`` decodes them, runs ``tx.update``
in float and encodes the new moments with the same blocks. Everything else
(counters, iterates, copies of params, previous gradients, accumulators,
factored statistics) stays as ``tx`` keeps it; ``describe_quantized_state``
lists every float leaf with what happened to it and why.

Blocks are tiles of the global array fitted, when ``init`` is traced with
the params typed by their layout (as ``shardopt.make_sharded_optimizer``
and ``shardopt.state_shardings`` do, ZeRO included), inside one device's
shard of the moment: quantizing and decoding then need no communication.
Where a block of at least half ``block_size`` fits the shard of every mesh
of as many devices that splits the same dimensions, the blocks are fitted
to all of them, so a checkpoint moved between such meshes keeps its blocks.
Which param a moment belongs to comes from the stand-in trace of
``shardopt._src.ownership``, the same the sharding layer uses.
"""

import contextlib
import contextvars
import numbers
from typing import Any
from typing import NamedTuple

import jax
import jax.numpy as jnp

from shardopt._src import base
from shardopt._src import moments
from shardopt._src import ownership
from shardopt._src import state_structure
from shardopt._src import typed_layouts
from shardopt._src.quantization import blocks
from shardopt._src.quantization import codes
from shardopt._src.quantization import quantized_array as qa
from shardopt._src.quantization.quantized_array import QuantizedArray
from shardopt._src.quantization.report import QuantizedLeaf
from shardopt._src.quantization.report import QuantizedStateReport

__all__ = [
    "QuantizedArray",
    "QuantizedLeaf",
    "QuantizedStateReport",
    "describe_quantized_state",
    "quantized_state",
]

_DEFAULT_BLOCK_SIZE = {8: 256, 4: 128}
_SMALLEST_BLOCK = 32

# While ``describe_quantized_state`` traces ``init``: each quantizer adds
# ``(bits, rows)`` of its report.
_REPORT: contextvars.ContextVar[list | None] = contextvars.ContextVar(
    "quantized_state_report", default=None)


class _Decision(NamedTuple):
  """How one float state leaf is stored: ``tile`` (None: kept) and
  ``bits``, and why it is kept or wider than asked (else "")."""

  tile: tuple[int, ...] | None
  signed: bool
  reason: str
  bits: int


def _largest_tile(shape, most: int, least: int, fit):
  """The tile of the largest power-of-two fraction of ``most`` elements, at
  least ``least``, whose lengths divide ``fit``; None if there is none."""
  size = most
  while size >= least:
    tile = blocks.choose_tile(shape, size, fit)
    if tile is not None:
      return tile
    size //= 2
  return None


def _is_float(x) -> bool:
  return hasattr(x, "dtype") and jnp.issubdtype(x.dtype, jnp.floating)


class _Quantizer:
  """The configuration and the init/update of ``quantized_state``."""

  def __init__(self, inner, bits: int, block_size: int, min_size: int,
               code: str):
    self.inner = base.with_extra_args_support(inner)
    self.bits, self.block_size, self.min_size = bits, block_size, min_size
    self.code = code

  def _tile(self, leaf) -> tuple[tuple[int, ...] | None, str]:
    """The tile of a moment, or why none: the largest of at most
    ``block_size`` elements inside its shard on every mesh of as many
    devices that splits the same dimensions (a checkpoint moved between
    them keeps its blocks), where one of at least half ``block_size`` is;
    else the largest, down to ``_SMALLEST_BLOCK``, inside this mesh's
    shard."""
    portable = _largest_tile(leaf.shape, self.block_size,
                             max(self.block_size // 2, 1),
                             typed_layouts.finest_shard_shape(leaf))
    if portable is not None:
      return portable, ""
    fit = typed_layouts.shard_shape(leaf)
    smallest = min(_SMALLEST_BLOCK, self.block_size)
    tile = _largest_tile(leaf.shape, self.block_size, smallest, fit)
    if tile is not None:
      return tile, ""
    return None, (f"no tile of {smallest} to {self.block_size} elements "
                  f"divides its shard {fit}")

  def decide(self, state, params) -> list[_Decision | None]:
    """Per leaf of ``inner``'s state: how it is stored (None: not a float
    array, nothing to report; a float scalar is kept and reported)."""
    kinds = moments.leaf_kinds(state, params)
    owners = ownership.state_owners(self.inner.init, params, state)
    param_shapes = [tuple(p.shape) for p in jax.tree.leaves(params)]
    decisions = []
    for leaf, kind, owner in zip(jax.tree.leaves(state), kinds, owners):
      if not _is_float(leaf):
        decisions.append(None)
        continue
      signed, bits = self._code(kind)
      if kind.kind is None:
        reason = (f"{kind.kept} ({kind.field})" if kind.kept else
                  f"not a declared moment ({kind.field or 'no state class'})")
      elif owner is None or tuple(leaf.shape) != param_shapes[owner]:
        reason = f"a moment not shaped like its param ({kind.field})"
      elif not leaf.shape:
        reason = f"a scalar moment ({kind.field}): no block to quantize"
      elif leaf.size < self.min_size:
        reason = f"{leaf.size} elements < min_size={self.min_size}"
      else:
        tile, reason = self._tile(leaf)
        if tile is not None and bits > self.bits:
          reason = f"{bits} bits: {kind.field} declares min_bits={bits}"
        decisions.append(_Decision(tile, signed, reason, bits))
        continue
      decisions.append(_Decision(None, signed, reason, self.bits))
    return decisions

  def _code(self, kind: moments.LeafKind) -> tuple[bool, int]:
    """A declared moment's code: signed (else non-negative) and its width,
    at least the ``min_bits`` it declares."""
    return kind.kind != moments.NONNEGATIVE, max(self.bits, kind.min_bits)

  def _conformed(self, state, template, params):
    """``state`` as this wrapper stores it where a holder of the state
    rebuilt its ``QuantizedArray``s as mappings of their codes and scales
    (``state_structure``: flax's ``nnx.Optimizer``), each one's metadata
    from the moment it stores (``template``: ``inner``'s state built from
    ``params``); ``state`` itself otherwise."""
    is_leaf = qa.is_quantized
    if (jax.tree.structure(state, is_leaf=is_leaf)
        == jax.tree.structure(template, is_leaf=is_leaf)):
      return state
    stored = state_structure.leaves_by_path(state)
    paths = [state_structure.path_names(path) for path, _ in
             jax.tree_util.tree_flatten_with_path(template)[0]]
    kinds = dict(zip(paths, moments.leaf_kinds(template, params)))

    def as_stored(path, leaf):
      key = state_structure.path_names(path)
      if is_leaf(leaf) or key + ("codes",) not in stored:
        return leaf
      signed, bits = self._code(kinds[key])
      return qa.QuantizedArray(stored[key + ("codes",)],
                               stored[key + ("scales",)], tuple(leaf.shape),
                               bits, signed, self.code)

    like = jax.tree_util.tree_map_with_path(as_stored, template,
                                            is_leaf=is_leaf)
    return state_structure.conform(state, like)

  def init(self, params):
    state = self.inner.init(params)
    self._refuse_quantized(state)
    leaves, treedef = jax.tree.flatten(state)
    decisions = self.decide(state, params)
    # A moment's initial value is usually a constant (zeros): behind the
    # barrier XLA quantizes it when init runs, where its constant folder
    # would evaluate every moment's quantization while compiling (slowly,
    # and longer the larger the model: benchmarks/results/quantized_state.md
    # times the compile).
    stored = [x if d is None or d.tile is None
              else qa.encode(jax.lax.optimization_barrier(x), d.tile, d.bits,
                             d.signed, self.code)
              for x, d in zip(leaves, decisions)]
    report = _REPORT.get()
    if report is not None:
      report.append((self.bits, self._rows(state, decisions, stored)))
    return jax.tree.unflatten(treedef, stored)

  def _refuse_quantized(self, state) -> None:
    """Raises where ``inner``'s own state already holds quantized leaves
    (a ``quantized_state`` inside it): they would keep their width whatever
    this wrapper's ``bits``, and each would be described twice."""
    paths = [jax.tree_util.keystr(path) for path, x in
             jax.tree_util.tree_flatten_with_path(
                 state, is_leaf=qa.is_quantized)[0] if qa.is_quantized(x)]
    if paths:
      raise ValueError(
          f"quantized_state(bits={self.bits}): the transformation it wraps "
          f"already stores quantized state (at {paths[0]}"
          f"{f' and {len(paths) - 1} more' if len(paths) > 1 else ''}): a "
          "quantized_state inside it (e.g. adamw(..., state_bits=8)) fixed "
          "its width. Quantize once: drop the inner state_bits (or "
          "quantized_state), or this wrapper.")

  def update(self, updates, state, params=None, **extra_args):
    # Every ``QuantizedArray`` is this wrapper's (``init`` refuses an inner
    # state that holds any): decoded to the dtype ``inner.init`` gives its
    # moment from the params (without params, from the gradients: their tree
    # and shapes), and encoded back in its tiles.
    seen = updates if params is None else params
    template = jax.eval_shape(self.inner.init, seen)
    state = self._conformed(state, template, seen)
    float_state = jax.tree.map(
        lambda x, t: qa.decode(x, t.dtype) if qa.is_quantized(x) else x,
        state, template, is_leaf=qa.is_quantized)
    new_updates, new_state = self.inner.update(
        updates, float_state, params, **extra_args)
    new_state = jax.tree.map(
        lambda old, new: qa.requantize(new, old) if qa.is_quantized(old)
        else new, state, new_state, is_leaf=qa.is_quantized)
    return new_updates, new_state

  def _rows(self, state, decisions, stored) -> list[QuantizedLeaf]:
    paths = [jax.tree_util.keystr(p) for p, _ in
             jax.tree_util.tree_flatten_with_path(state)[0]]
    rows = []
    for path, leaf, d, kept in zip(paths, jax.tree.leaves(state), decisions,
                                   stored):
      if d is None:
        continue
      if d.tile is None:
        rows.append(QuantizedLeaf(path, tuple(leaf.shape), str(leaf.dtype),
                                  None, leaf.size * leaf.dtype.itemsize,
                                  d.reason))
      else:
        rows.append(QuantizedLeaf(
            path, tuple(leaf.shape), kept.book.name, d.tile,
            kept.codes.size + kept.scales.size * kept.scales.dtype.itemsize,
            d.reason))
    return rows


def quantized_state(
    inner: base.GradientTransformation,
    bits: int = 8,
    block_size: int | None = None,
    min_size: int = 4096,
    code: str = "companded",
) -> base.GradientTransformationExtraArgs:
  """Stores the moments of ``inner`` in 8 or 4 bits.

  Each moment (a state field that ``inner``'s transformations declare as
  one) with its param's shape and at least ``min_size`` elements is kept as
  a ``QuantizedArray``: per block (a tile of the global array) one
  ``float32`` absmax scale, and per element the ``uint8`` index of the
  nearest value of a code book (at 4 bits two indices per byte). ``update``
  decodes, runs ``inner.update`` in the state's float dtype and encodes the
  new moments in the same blocks.

  Codes (``code``). ``"dynamic"``: signed moments (first moments, momentum
  traces) use the dynamic code of Dettmers et al.: one decade per level,
  finer near 1, exact 0 and 1 (at 8 bits magnitudes down to 1e-6 of the
  block's absmax; at 4 bits 15 values down to 1e-2, the dynamic-exponent
  code Li et al. use for the first moment). Non-negative moments (second
  moments) use the unsigned dynamic code at 8 bits and, at 4 bits, the
  linear code without zero of Li et al., applied to ``sqrt(v)``: a positive
  value never gets a zero code, so ``1 / sqrt(v)`` cannot explode.
  ``"companded"`` (the default): signed moments in FlashOptim's code,
  ``2x / (1 + |x|)`` rounded to ``2**(bits-1)-1`` steps a side (one
  division per element); non-negative moments as unsigned minifloats of
  ``v`` over its block's largest (8-bit e5m3: 8 steps per octave down to
  ``2**-31``; 4-bit: the nearest power of two down to ``2**-15``), whose
  error is relative to each value, so ``1 / sqrt(v)`` is as accurate for a
  block's small values as for its large ones. On AdamW's LM demo companded
  gives the lower held-out loss of the two at both widths and the faster
  update (``benchmarks/results/quantized_state.md``). The sign is
  declared with the moment (``shardopt._src.moments``), never read from the
  values or a name, and so is a floor on the width: a moment whose state
  class declares ``min_bits=8`` (the momentum sum of
  ``contrib.simplified_ademamix``, Adadelta's average of squared steps,
  ``contrib.soap``'s first moment: 41%, 25% and 56% off their float-state
  updates at 4 bits; through the table, the second moment of optax's
  AdaBelief class, which also holds optax's AcProp) is stored at 8 bits
  under ``bits=4``, and the report says so. A state field may declare that
  the moments below it are not of the params' elements (``contrib.galore``'s
  base optimizer's, of the projected gradient): they stay in float at any
  rank, with that reason.

  Blocks and shards. When ``init`` is traced with the params typed by their
  layout (``shardopt.make_sharded_optimizer``, ``shardopt.state_shardings``
  and ``shardopt.sharded_init`` do so, ZeRO included; so does any ``init``
  on a mesh with Explicit axes), each tile lies inside one device's shard of
  its moment, so the step needs no communication float state would not. A
  tile has ``block_size`` elements, or, where no such tile fits the shard,
  the largest power of two down to 32 that does; a moment where none fits
  stays in float. Traced without layout (plain ``jit`` on an Auto mesh, or
  unsharded) tiles come from the global shape. ``update`` keeps the tiles
  the state has; ``checkpoints`` re-tiles a state restored onto a mesh
  whose tiles differ.

  One width per leaf: ``inner`` must not hold a ``quantized_state`` itself
  (``adamw(..., state_bits=8)``); ``init`` raises naming its first
  quantized leaf.

  Non-finite values: the scale is the largest finite ``|x|`` of the block,
  ``+-inf`` is stored as ``+-scale`` and ``nan`` as the code nearest zero,
  so the rest of the block keeps its values.

  Args:
    inner: any transformation (shardopt's, or optax's: see
      ``shardopt._src.moments.OPTAX_MOMENTS``).
    bits: 8 or 4.
    block_size: elements per block, a power of two; None (default): 256 at
      8 bits and 128 at 4 bits (4 bytes of scale per block).
    min_size: moments with fewer elements stay in float (default 4096).
    code: the code family, ``"companded"`` or ``"dynamic"``
      (``shardopt/_src/quantization/codes.py``).

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
  bits, block_size, min_size = (
      _python_int(name, value) for name, value in (
          ("bits", bits), ("block_size", block_size), ("min_size", min_size)))
  if bits not in (8, 4):
    raise ValueError(f"quantized_state: bits={bits}; expected 8 or 4.")
  if block_size is None:
    block_size = _DEFAULT_BLOCK_SIZE[bits]
  if block_size < 2 or block_size & (block_size - 1):
    raise ValueError(f"quantized_state: block_size={block_size}; expected a "
                     "power of two >= 2 (e.g. 128 or 256).")
  if min_size < 0:
    raise ValueError(f"quantized_state: min_size={min_size}; expected >= 0.")
  if code not in codes.CODES:
    raise ValueError(f"quantized_state: code={code!r}; expected one of "
                     f"{codes.CODES}.")
  quantizer = _Quantizer(inner, bits, block_size, min_size, code)
  return base.GradientTransformationExtraArgs(quantizer.init, quantizer.update)


def _python_int(name: str, value) -> int | None:
  """``value`` (None allowed) as a Python ``int``: it sets the state's
  structure, so it cannot be an array (e.g. one ``inject_hyperparams`` made
  of a number it was given)."""
  if value is None:
    return None
  if isinstance(value, numbers.Integral) and not isinstance(value, bool):
    return int(value)
  raise TypeError(
      f"quantized_state: {name} must be a Python int, got"
      f" {type(value).__name__} {value!r}: it fixes the state's layout and"
      " cannot change between steps. Under inject_hyperparams, name it in"
      " static_args, e.g. inject_hyperparams(adamw,"
      " static_args=('state_bits',)).")


@contextlib.contextmanager
def collecting_reports():
  """A list that every ``quantized_state`` whose ``init`` is traced inside
  this context adds ``(bits, rows)`` of its report to (a cached trace adds
  nothing: trace a new function)."""
  reports: list[tuple[int, list[QuantizedLeaf]]] = []
  token = _REPORT.set(reports)
  try:
    yield reports
  finally:
    _REPORT.reset(token)


def fallbacks(reports) -> tuple[QuantizedLeaf, ...]:
  """The moments that ``collecting_reports``' ``reports`` keep in float
  because no block fits their shard."""
  return tuple(row for _, rows in reports
               for row in QuantizedStateReport(0, tuple(rows)).fallbacks)


def describe_quantized_state(tx, params, param_shardings: Any = None
                             ) -> QuantizedStateReport:
  """How every ``quantized_state`` inside ``tx`` stores each float leaf.

  Args:
    tx: a transformation that is, or contains, ``quantized_state``
      (``adam(..., state_bits=8)``, ``masked(quantized_state(...))``, ...).
    params: the params (arrays or ``jax.ShapeDtypeStruct``).
    param_shardings: the layout the state is fitted to, a ``NamedSharding``
      per param (for a sharded optimizer, its ``plan.update_shardings``:
      the params' layout with ZeRO's axis added); None: unsharded.

  Returns:
    A ``QuantizedStateReport``: per float leaf of each quantized inner
    state, its code book and tile, or why it stays in float.
  """
  init = lambda p: tx.init(p)  # a new function: never a cached trace
  with collecting_reports() as reports:
    if param_shardings is None:
      jax.eval_shape(init, params)
    else:
      leaves = jax.tree.leaves(param_shardings)
      if not leaves:
        raise ValueError("describe_quantized_state: param_shardings has no "
                         "leaves.")
      typed_layouts.eval_shape_typed(
          init, params, jax.tree.map(lambda s: s.spec, param_shardings),
          leaves[0].mesh)
  if not reports:
    raise TypeError("describe_quantized_state: tx holds no "
                    "shardopt.quantized_state.")
  return QuantizedStateReport(
      reports[0][0], tuple(row for _, rows in reports for row in rows))
