"""bfloat16 params whose float32 master weight lives in the optimizer state.

``low_precision_params(tx, correction_bits=8)``: the user's params are
bfloat16 (the model computes in them) and the state keeps, per such param,
a *correction*: integer codes that restore the bits of the float32 master
weight the param lost when it was rounded. ``tx`` sees the
float32 master (param + correction) and float32 gradients; the updates
returned move each param exactly to the new master rounded to its dtype, so
``apply_updates`` (Flax ``TrainState.apply_gradients``, ``nnx.Optimizer``,
``opt.update``, ``opt.train_step``) needs nothing else. Params of float32 or
wider are their own master and keep no correction.

The correction of a param ``p`` is a code ``c`` of ``b`` bits (8 or 16),
``|c| <= 2**(b-1) - 1``, and the master is ``p + c * step``, where ``step``
is ``2**-b`` of the distance from ``p`` to its bfloat16 neighbour on the
side of the offset (toward or away from zero; at a power of two the
neighbour toward zero is half as far). It is FlashOptim's split (an int8
share of the rounding interval), with power-of-two steps:

* the master ``p + c * step`` is exact in float32 (no rounding, whatever
  the backend fuses), and every code rounds back to ``p``: the largest
  offset, ``(2**(b-1) - 1) / 2**b`` of the gap, stays inside ``p``'s
  rounding interval (FlashOptim's ``p + (c / 127) * ulp / 2`` reaches the
  interval's end at ``c = 127``, a tie that rounds to the even neighbour);
* 8 bits: the master within ``2**-9`` of the gap (``2**-8`` in the outer
  256th of the interval), about 16 significant bits; 16 bits: the float32
  master exactly (``2**-16`` of a bfloat16 gap is float32's spacing), except
  a master exactly halfway between two bfloat16 values, which loses its
  last bit.
  Params below ``2**-111`` in magnitude (``2**-103`` at 16 bits) keep no
  correction, and params of exactly that magnitude none toward zero (the
  neighbour there is half as far): the step would leave float32's normal
  range.

``correction_bits=0`` keeps none: ``tx`` still sees float32, but each step
starts from the rounded param (plain bfloat16 training, for comparison).

The update returned for a corrected param is ``float32(new) - float32(p)``
(float32: a bfloat16 difference cannot always be exact), and
``apply_updates`` lands exactly on ``new``, the new master rounded to the
param's dtype, whenever that difference is exact in float32: for values of
at least ``2**-110`` (float32 subnormals flush to zero on XLA:CPU), always
unless ``new`` is nonzero and below ``2**-15`` of ``p``. In that case
the param lands where ``apply_updates`` puts it and the correction is taken
against that value, so param + correction is still the master the next
step starts from, and it still rounds to the param.

Use it as the outermost transformation (a transformation after it would
change updates that are exact param moves). Its state class declares no
moments (``shardopt._src.moments``): ``quantized_state`` leaves the integer
codes alone, and ``tx`` may hold quantized state itself
(``adamw(..., state_bits=8)``). The codes have their param's shape and are
built with ``zeros_like``, so they are sharded like the param, ZeRO
included.
"""

from typing import Any
from typing import NamedTuple

import jax
from jax import lax
import jax.numpy as jnp
import numpy as np

from shardopt._src import base
from shardopt._src.tree_math import apply_updates
from shardopt._src.wrappers.masking import MaskedNode

__all__ = [
    "LowPrecisionParamsState",
    "correction_of",
    "decode_master",
    "low_precision_params",
]

_CODE_DTYPES = {8: jnp.int8, 16: jnp.int16}
_FLOAT32_MIN_EXPONENT = -126


class LowPrecisionParamsState(NamedTuple):
  """Per param, the correction codes (``MaskedNode`` for a param that keeps
  none), and the state of the inner transformation, built on the float32
  masters."""

  correction: Any
  inner_state: base.OptState


def _is_low_precision(x) -> bool:
  """A bfloat16 array: a param trained against a float32 master."""
  return hasattr(x, "dtype") and x.dtype == jnp.bfloat16


def _check_dtypes(params) -> None:
  """Raises for a floating param narrower than float32 other than bfloat16
  (float16's range and 11-bit significand are not what the codes fit)."""
  for path, p in jax.tree_util.tree_flatten_with_path(params)[0]:
    if (hasattr(p, "dtype") and jnp.issubdtype(p.dtype, jnp.floating)
        and jnp.finfo(p.dtype).bits < 32 and not _is_low_precision(p)):
      raise ValueError(
          f"low_precision_params: params{jax.tree_util.keystr(path)} is "
          f"{p.dtype}; expected bfloat16 (trained against a float32 master) "
          "or float32 and wider (their own master). Cast it to one of them.")


def _check_state_fits(params, correction, bits: int) -> None:
  """Raises for a param whose dtype is not the one the state was built for:
  a bfloat16 param with no correction (a state built on float32 params), a
  correction for a param that is no longer bfloat16 (``correction_bits=0``
  keeps none for any param), or codes of another width than ``bits``."""

  def check(path, p, code):
    where = f"low_precision_params: params{jax.tree_util.keystr(path)}"
    kept = not isinstance(code, MaskedNode)
    if kept != _is_low_precision(p):
      built = "bfloat16" if kept else "float32 or wider"
      raise ValueError(
          f"{where} is {p.dtype}, but the state was built for a {built} param "
          "there. Build the state with init on the params you train.")
    if kept and code.dtype != _CODE_DTYPES[bits]:
      raise ValueError(
          f"{where}: the state holds {code.dtype} correction codes, but this "
          f"transformation has correction_bits={bits} "
          f"({jnp.dtype(_CODE_DTYPES[bits])} codes). Use the correction_bits "
          "the state was built with, or build a new state with init.")

  jax.tree_util.tree_map_with_path(check, params, correction)


def _power_of_two(k):
  """``2.0**k`` in float32 for integer ``k`` in [-126, 127], built from bits."""
  return lax.bitcast_convert_type((k + 127) << 23, jnp.float32)


def _fields(param):
  """(sign, exponent field, mantissa field) of ``param``'s bits, int32."""
  info = jnp.finfo(param.dtype)
  raw = lax.bitcast_convert_type(param, jnp.dtype(f"uint{info.bits}"))
  raw = raw.astype(jnp.int32)
  sign = (raw >> (info.bits - 1)) & 1
  exponent = (raw >> info.nmant) & ((1 << info.nexp) - 1)
  return sign, exponent, raw & ((1 << info.nmant) - 1)


def _step_exponent(param, toward_zero, bits: int):
  """``k`` such that ``2**k`` is ``2**-bits`` of the gap from ``param`` to
  its neighbour (toward zero where ``toward_zero``)."""
  info = jnp.finfo(param.dtype)
  _, exponent, mantissa = _fields(param)
  bias = 1 - info.minexp
  k = jnp.maximum(exponent, 1) - bias - info.nmant - bits
  halved = toward_zero & (mantissa == 0) & (exponent > 1)
  return k - halved.astype(jnp.int32)


def _toward_zero(param, direction):
  """Whether an offset of sign ``direction`` from ``param`` points to zero."""
  sign, _, _ = _fields(param)
  return jnp.where(sign == 1, direction > 0, direction < 0)


def decode_master(param, code, bits: int):
  """The float32 master ``param + code * step`` (exact in float32)."""
  k = _step_exponent(param, _toward_zero(param, code), bits)
  usable = k >= _FLOAT32_MIN_EXPONENT
  step = jnp.where(usable, _power_of_two(jnp.where(usable, k, 0)), 0.0)
  return param.astype(jnp.float32) + code.astype(jnp.float32) * step


def correction_of(master, param, bits: int):
  """The code of ``bits`` bits that brings ``param`` nearest to ``master``
  (float32): ``round((master - param) / step)``, clipped to
  ``+-(2**(bits-1) - 1)``; 0 where ``master`` is not finite or the step
  leaves float32's normal range."""
  offset = master - param.astype(jnp.float32)
  k = _step_exponent(param, _toward_zero(param, offset), bits)
  usable = (k >= _FLOAT32_MIN_EXPONENT) & jnp.isfinite(offset)
  inverse = _power_of_two(jnp.where(usable, -k, 0))
  limit = 2 ** (bits - 1) - 1
  code = jnp.clip(jnp.round(offset * inverse), -limit, limit)
  return jnp.where(usable, code, 0).astype(_CODE_DTYPES[bits])


def _zero_correction(param, bits: int):
  if bits and _is_low_precision(param):
    return jnp.zeros_like(param, dtype=_CODE_DTYPES[bits])
  return MaskedNode()


def _master(param, code, bits: int):
  if not _is_low_precision(param):
    return param
  if isinstance(code, MaskedNode):
    return param.astype(jnp.float32)
  return decode_master(param, code, bits)


def _move(param, new_master):
  """The update that ``apply_updates`` turns into ``new_master`` rounded to
  ``param``'s dtype (float32, exact whenever that difference is)."""
  target = new_master.astype(param.dtype)
  return target.astype(jnp.float32) - param.astype(jnp.float32)


def _new_correction(param, update, new_master, bits: int):
  """The code of ``new_master`` against the param ``apply_updates`` lands on."""
  landed = apply_updates(param, update)
  return correction_of(new_master, landed, bits)


def low_precision_params(
    inner: base.GradientTransformation, correction_bits: int = 8
) -> base.GradientTransformationExtraArgs:
  """Trains bfloat16 params against a float32 master weight kept as a
  correction in the optimizer state.

  Args:
    inner: any transformation (shardopt's or optax's); it sees float32
      master params and float32 gradients.
    correction_bits: 8 (int8 codes: the master to about 16 significant
      bits), 16 (int16 codes: the float32 master exactly, but for
      masters halfway between two bfloat16 values), or 0 (no
      correction: each step starts from the rounded param).

  Returns:
    A ``GradientTransformationExtraArgs`` whose state is a
    ``LowPrecisionParamsState`` and whose updates move each bfloat16 param
    to its new master rounded to bfloat16 (float32 updates; float32 params
    get ``inner``'s updates). ``update`` needs the params. Other floating
    params narrower than float32 (float16) are an error naming the param.

  References:
    Micikevicius et al., "Mixed Precision Training", ICLR 2018
    (https://arxiv.org/abs/1710.03740); Gonzalez Ortiz, Gupta, Renard &
    Blalock, "FlashOptim: Optimizers for Memory Efficient Training", 2026
    (https://arxiv.org/abs/2602.23349).
  """
  if (isinstance(correction_bits, bool) or
      not isinstance(correction_bits, (int, np.integer)) or
      correction_bits not in (0, 8, 16)):
    raise ValueError(f"low_precision_params: correction_bits={correction_bits!r};"
                     " expected 8, 16 or 0 (no correction).")
  bits = int(correction_bits)
  inner = base.with_extra_args_support(inner)

  def init_fn(params):
    _check_dtypes(params)
    masters = jax.tree.map(
        lambda p: p.astype(jnp.float32) if _is_low_precision(p) else p, params)
    return LowPrecisionParamsState(
        jax.tree.map(lambda p: _zero_correction(p, bits), params),
        inner.init(masters))

  def update_fn(updates, state, params=None, **extra_args):
    if params is None:
      raise ValueError("low_precision_params: update needs the params (the "
                       "master weight is param + correction).")
    _check_dtypes(params)
    if bits:
      _check_state_fits(params, state.correction, bits)
    masters = jax.tree.map(lambda p, c: _master(p, c, bits), params,
                           state.correction)
    grads = jax.tree.map(
        lambda g, p: g.astype(jnp.float32) if _is_low_precision(p) else g,
        updates, params)
    inner_updates, inner_state = inner.update(grads, state.inner_state,
                                              masters, **extra_args)
    new_masters = apply_updates(masters, inner_updates)
    moves = jax.tree.map(
        lambda p, u, m: _move(p, m) if _is_low_precision(p) else u,
        params, inner_updates, new_masters)
    correction = jax.tree.map(
        lambda p, c, u, m: c if isinstance(c, MaskedNode)
        else _new_correction(p, u, m, bits),
        params, state.correction, moves, new_masters)
    return moves, LowPrecisionParamsState(correction, inner_state)

  return base.GradientTransformationExtraArgs(init_fn, update_fn)
