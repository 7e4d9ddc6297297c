"""8-bit and 4-bit optimizer state, block-wise quantized and shard-local.

``quantized_state(tx, bits=8)`` stores the moments of ``tx`` (the state
fields its transformations declare as moments, ``shardopt._src.moments``)
that have their param's shape as ``QuantizedArray``s: ``uint8`` codes plus
one ``float32`` scale per block. ``update`` decodes them, runs ``tx.update``
in float and encodes the new moments with the same blocks. Everything else
(counters, iterates, copies of params, previous gradients, accumulators,
moments of another shape than their param such as factored statistics)
stays as ``tx`` keeps it. Which leaves are quantized,
in which blocks (tiles fitted inside one device's shard) and why the rest
stay in float: ``shardopt._src.quantization.decisions``; the report of it
(``describe_quantized_state``): ``shardopt._src.quantization.report``.
"""

import numbers

import jax

from shardopt._src import base
from shardopt._src import messages
from shardopt._src import moments
from shardopt._src import state_structure
from shardopt._src.quantization import codes
from shardopt._src.quantization import decisions as decisions_lib
from shardopt._src.quantization import quantized_array as qa
from shardopt._src.quantization import report as report_lib

__all__ = ["quantized_state"]

_DEFAULT_BLOCK_SIZE = {8: 256, 4: 128}


class _Quantizer:
  """The configuration and the init/update of ``quantized_state``."""

  def __init__(self, inner, bits: int, block_size: int, min_size: int,
               code: str, block_layout: str):
    self.inner = base.with_extra_args_support(inner)
    self.bits, self.block_size, self.min_size = bits, block_size, min_size
    self.code, self.block_layout = code, block_layout

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
      signed, bits = decisions_lib.moment_code(kinds[key], self.bits)
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
    decisions = decisions_lib.decide(self.inner.init, state, params, self.bits,
                                     self.block_size, self.min_size,
                                     self.block_layout)
    # A moment's initial value is usually a constant (zeros): behind the
    # barrier XLA quantizes it when init runs, where its constant folder
    # would evaluate every moment's quantization while compiling (slowly,
    # and longer the larger the model: benchmarks/results/quantized_state.md
    # times the compile).
    stored = [x if d is None or d.tile is None
              else qa.encode(jax.lax.optimization_barrier(x), d.tile, d.bits,
                             d.signed, self.code)
              for x, d in zip(leaves, decisions)]
    report_lib.record(self.bits, state, decisions, stored)
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
          "already stores quantized state (at "
          f"{messages.first_few(paths, 1)}): a quantized_state inside it "
          "(e.g. adamw(..., state_bits=8)) fixed its width. Quantize once: "
          "drop the inner state_bits (or quantized_state), or this wrapper.")

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


def quantized_state(
    inner: base.GradientTransformation,
    bits: int = 8,
    block_size: int | None = None,
    min_size: int = 4096,
    code: str = "companded",
    block_layout: str = "portable",
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

  Blocks and shards. When ``init`` sees the params' layout (traced with
  the params typed by it: ``shardopt.make_sharded_optimizer``,
  ``shardopt.state_shardings`` and ``shardopt.sharded_init`` do so, ZeRO
  included, and so does any ``init`` on a mesh with Explicit axes; or run
  on arrays placed on the mesh, as ``nnx.Optimizer`` runs it), each tile
  lies inside one device's shard of its moment, so the step needs no
  communication float state would not.
  ``block_layout="portable"`` (the default): where a tile of at least half
  ``block_size`` elements fits the moment's shard on every mesh of as many
  devices that splits the same dimensions, it is the largest such tile, the
  same on (2, 4), (4, 2) and (8, 1), so a checkpoint moves between those
  meshes bit for bit; else, as ``"fitted"``: a tile of ``block_size``
  elements inside this mesh's shard or, where none fits, the largest power
  of two down to 32 that does (a moment where none fits stays in float).
  Fitted tiles run longer along the last dimension where a mesh splits it
  less than the finest would: on CPU the update is faster
  (``benchmarks/results/block_layouts.md``). Without the layout (traced in
  a plain ``jit`` on an Auto mesh, or unsharded) tiles come from the global
  shape.
  ``update`` keeps the tiles the state has; ``checkpoints`` re-tiles a
  state restored onto a mesh whose tiles differ.

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
    block_layout: ``"portable"`` (blocks that fit every mesh of the device
      count where they can) or ``"fitted"`` (to this mesh's shards).

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
  if block_layout not in decisions_lib.BLOCK_LAYOUTS:
    raise ValueError(f"quantized_state: block_layout={block_layout!r}; "
                     f"expected one of {decisions_lib.BLOCK_LAYOUTS}.")
  quantizer = _Quantizer(inner, bits, block_size, min_size, code,
                         block_layout)
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
