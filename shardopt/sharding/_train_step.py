"""The whole training step as one jitted program: loss, gradients, update.

``make_train_step(opt, loss_fn)`` compiles ``(params, state, batch[, key])
-> (new_params, new_state, loss)``. Inside, the gradients are computed in
the params' layout (the backward pass keeps it, as in the two-program step)
and the update runs and is applied through ``apply_in_layout``, like
``opt.update``.

* ``has_aux``: ``loss_fn`` returns ``(loss, aux)`` and the step returns
  ``(loss, aux)`` where the loss was, as ``jax.value_and_grad`` does (with
  microbatches, each aux leaf stacked over them: a leading dimension k).
* Extra arguments: ``tx.update`` receives those named in ``extra_args``
  of ``value`` (the loss), ``grad`` (the gradients), ``value_fn`` and
  ``obj_fn`` (the loss as a function of the params on this batch, computed
  as ``value`` was: same microbatches and keys; it takes params in any
  layout and lays them out in the params' own); the
  default, ``value``, ``grad`` and ``value_fn``, is what L-BFGS, the line
  searches and Polyak's step read (Sophia reads ``obj_fn``).
  Transformations that take none ignore them; one whose ``update`` refuses
  unknown keywords (optax's and shardopt's ``contrib.sam``) needs
  ``extra_args=()``.
* ``with_key``: the step takes a PRNG key (fresh per step, e.g.
  ``jax.random.fold_in(root, step)``) and passes it to
  ``loss_fn(params, batch, key)``, e.g. for dropout.
* ``microbatches=k``: the batch is split into ``k`` microbatches scanned
  inside the program, the gradients summed in an accumulator laid out like
  the ZeRO'd state (the params' update layout; float32 at least, for
  bfloat16 params too); loss and gradients are the
  means over the microbatches (equal to the one-batch step for a loss that
  is a mean over examples; the loss summed and returned in float32, the
  gradients returned in their params' dtype). Every batch leaf of rank >= 1 is split along its
  leading dimension: microbatch ``i`` takes rows ``i, i + k, i + 2k, ...``,
  so each stays split over the data axes with no data movement.
* Batch layout (``_batch``): by default each leaf's leading dimension over
  the data axes, scalars replicated; ``batch_spec`` states another rule.
* ``metrics``: ``metrics(grads, updates, new_params)`` computed inside the
  program (e.g. ``global_norms``), returned as a fourth output, so the
  norms people plot cost no host sync of their own.
* The step is traced under its params' mesh
  (``jax.sharding.use_abstract_mesh``), so a ``loss_fn`` that names
  ``PartitionSpec``s (``out_sharding=P(...)``, as Explicit axes need for
  some contractions) runs without a mesh context of the caller's, and the
  step may be called inside another ``jit``.
"""

from collections.abc import Callable
import dataclasses
import functools
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from shardopt._src import base
from shardopt._src.tree_math import global_norm
from shardopt.sharding._batch import BatchLayout
from shardopt.sharding._batch import batch_layout
from shardopt.sharding._boundary import explained_rejection
from shardopt.sharding._layouts import in_layout
from shardopt.sharding._layouts import mesh_of
from shardopt.sharding._layouts import under_mesh
from shardopt.sharding._layouts import apply_in_layout
from shardopt.sharding._liveness import check_live
from shardopt.sharding._memory import to_device
from shardopt.sharding._memory import to_home

__all__ = ["TrainStep", "global_norms", "make_train_step"]


def global_norms(grads, updates, new_params) -> dict[str, jax.Array]:
  """A ``metrics`` function: the global norms of the gradients (before any
  clipping ``tx`` does), of the updates applied and of the new params
  (``_scaled_norm``)."""
  return {"grad_norm": _scaled_norm(grads),
          "update_norm": _scaled_norm(updates),
          "param_norm": _scaled_norm(new_params)}


def _scaled_norm(tree) -> jax.Array:
  """The L2 norm of the leaves of ``tree`` together, summed in float32 at
  least (in bfloat16 a norm of 44 moves in steps of 0.25), the squares
  scaled by a power of two near the largest magnitude: finite wherever the
  norm is (plain float32 squares overflow from 1.8e19 and vanish below
  1e-19), the plain sum's value otherwise; inf or nan where a leaf holds
  one."""
  magnitudes = [jnp.abs(x) for x in jax.tree.leaves(tree)]
  magnitudes = [m.astype(jnp.promote_types(m.dtype, jnp.float32))
                for m in magnitudes]
  if not magnitudes:
    return jnp.zeros([], jnp.float32)
  largest = jnp.max(jnp.stack([jnp.max(m, initial=0) for m in magnitudes]))
  exponent = jnp.maximum(jnp.frexp(largest)[1], jnp.finfo(jnp.float32).minexp)
  total = sum(jnp.sum(jnp.square(jnp.ldexp(m, -exponent))) for m in magnitudes)
  return jnp.ldexp(jnp.sqrt(total), exponent)


@dataclasses.dataclass(frozen=True, eq=False)
class TrainStep:
  """``(params, state, batch[, key]) -> (new_params, new_state, loss[,
  metrics])``, one jitted program (``jitted``: the ``jax.jit`` function,
  same signature). Each batch leaf is placed in its layout (``layout``)
  before the call. Params or a state of another tree than
  ``param_shardings`` / ``state_shardings`` get an error naming where; with
  ``donated`` (the params and state consumed), so does one array passed at
  two places of them or of the batch."""

  jitted: Any
  layout: BatchLayout
  with_key: bool
  param_shardings: Any
  state_shardings: Any
  donated: bool
  params_like: Any = None  # the params' shapes, for errors (None: not checked)

  def _arguments(self, params, state, batch, key):
    if self.with_key != (key is not None):
      raise TypeError(
          "train_step was built with with_key=True: pass the step's PRNG key "
          "as the fourth argument" if self.with_key else
          "train_step got a key but was built without with_key=True")
    check_live("train_step", ("params", "state") if self.donated else (),
               params=params, state=state, batch=batch)
    batch = jax.device_put(batch, self.layout.shardings(batch))
    return (params, state, batch) + ((key,) if self.with_key else ())

  def __call__(self, params, state, batch, key=None):
    arguments = self._arguments(params, state, batch, key)
    with explained_rejection(self.param_shardings, params,
                             self.state_shardings, state, params_like=self.params_like):
      return self.jitted(*arguments)

  def lower(self, params, state, batch, key=None):
    return self.jitted.lower(*self._arguments(params, state, batch, key))


def _accumulator_dtype(dtype):
  """Gradients of low-precision params are summed in float32 at least."""
  return jnp.promote_types(dtype, jnp.float32)


def _split_microbatches(x, k: int):
  """``(B, ...)`` -> ``(k, B / k, ...)``, microbatch ``i`` = rows ``i::k``."""
  if not jnp.ndim(x):
    return jnp.broadcast_to(x, (k,))
  grouped = x.reshape(x.shape[0] // k, k, *x.shape[1:])
  return jnp.moveaxis(grouped, 1, 0)


def _microbatch(parts, i, key):
  """Microbatch ``i`` of the split batch and its key, ``fold_in(key, i)``."""
  return (jax.tree.map(lambda x: x[i], parts),
          None if key is None else jax.random.fold_in(key, i))


def _loss_and_grads(loss_fn, has_aux, with_key, params, batch, key):
  """``((loss, aux), grads)`` of one (micro)batch; aux None without it."""
  args = (params, batch) + ((key,) if with_key else ())
  out, grads = jax.value_and_grad(loss_fn, has_aux=has_aux)(*args)
  return (out if has_aux else (out, None)), grads


_EXTRA_ARGS = ("value", "grad", "value_fn", "obj_fn")


def make_train_step(opt, loss_fn: Callable, *, has_aux: bool = False,
                    with_key: bool = False, microbatches: int = 1,
                    batch_spec: Any = None,
                    data_axes: str | tuple[str, ...] | None = None,
                    extra_args: tuple[str, ...] = ("value", "grad", "value_fn"),
                    metrics: Callable | None = None) -> TrainStep:
  """The training step of a ``ShardedOptimizer`` as one jitted program.

  Args:
    opt: the ``ShardedOptimizer``.
    loss_fn: ``loss_fn(params, batch) -> loss`` (``(loss, aux)`` with
      ``has_aux``; ``loss_fn(params, batch, key)`` with ``with_key``).
    has_aux: ``loss_fn`` returns ``(loss, aux)``; the step returns it.
    with_key: the step takes a PRNG key and passes it to ``loss_fn`` (each
      microbatch gets ``jax.random.fold_in(key, i)``).
    microbatches: the number of microbatches the batch is split into and
      accumulated over in the one program (1: none).
    batch_spec: how batch leaves are laid out: None (the leading dimension
      over ``data_axes``, scalars replicated), a ``PartitionSpec`` tree (a
      prefix of the batch), or ``rule(path, shape) -> PartitionSpec``.
    data_axes: the mesh axes the default rule splits batches over; default
      the ZeRO axis if one was given, else ``'data'``.
    extra_args: the extra keyword arguments ``tx.update`` receives, among
      ``value``, ``grad``, ``value_fn`` and ``obj_fn``.
    metrics: ``metrics(grads, updates, new_params) -> pytree`` of values to
      return as well (e.g. ``global_norms``); replicated.

  Returns:
    A ``TrainStep``: ``(params, state, batch[, key]) -> (new_params,
    new_state, loss)`` (``loss`` is ``(loss, aux)`` with ``has_aux``; a
    fourth output, the metrics, with ``metrics``), params and state donated
    with ``opt.donate``. Everything comes back on device; the loss and
    metrics replicated.
  """
  unknown = sorted(set(extra_args) - set(_EXTRA_ARGS))
  if unknown:
    raise ValueError(f"train_step: extra_args {unknown} are not among "
                     f"{_EXTRA_ARGS}.")
  if (isinstance(microbatches, bool) or not isinstance(microbatches, (int, np.integer))
      or microbatches < 1):
    raise ValueError(f"train_step: microbatches={microbatches!r}; expected an "
                     "integer >= 1.")
  microbatches = int(microbatches)
  mesh = mesh_of(opt.param_shardings)
  layout = batch_layout(mesh, batch_spec, data_axes, opt.plan.axis,
                        microbatches)
  tx = base.with_extra_args_support(opt.tx)
  param_shardings, update_shardings = opt.param_shardings, opt.update_shardings
  loss_and_grads = functools.partial(_loss_and_grads, loss_fn, has_aux,
                                     with_key)
  loss_only = functools.partial(_loss_only, loss_fn, has_aux, with_key)

  def gradients(params, batch, key):
    if microbatches == 1:
      (loss, aux), grads = loss_and_grads(params, batch, key)
      return loss, aux, in_layout(grads, param_shardings)
    parts = jax.tree.map(lambda x: _split_microbatches(x, microbatches), batch)
    zeros = in_layout(jax.tree.map(
        lambda p: jnp.zeros_like(p, _accumulator_dtype(p.dtype)), params),
        update_shardings)

    def accumulate(total, i):
      (loss, aux), grads = loss_and_grads(params, *_microbatch(parts, i, key))
      grads = in_layout(in_layout(grads, param_shardings), update_shardings)
      return (jax.tree.map(lambda t, g: t + g.astype(t.dtype), total[0], grads),
              total[1] + loss.astype(jnp.float32)), aux

    (total, loss_sum), aux = jax.lax.scan(
        accumulate, (zeros, jnp.zeros((), jnp.float32)),
        jnp.arange(microbatches))
    grads = jax.tree.map(lambda g, p: (g / microbatches).astype(p.dtype),
                         total, params)
    return loss_sum / microbatches, aux, grads

  def value_of(params, batch, key):
    """The loss ``gradients`` returns, as a function of the params: a line
    search compares its values with that loss. ``tx.update`` calls it on
    params in their update layout: back to the params' own, or on Explicit
    axes the ZeRO axis meets the batch's inside the loss."""
    params = in_layout(params, param_shardings)
    if microbatches == 1:
      return loss_only(params, batch, key)
    parts = jax.tree.map(lambda x: _split_microbatches(x, microbatches), batch)
    add = lambda total, i: (total + loss_only(
        params, *_microbatch(parts, i, key)).astype(jnp.float32), None)
    total, _ = jax.lax.scan(add, jnp.zeros((), jnp.float32),
                            jnp.arange(microbatches))
    return total / microbatches

  def step(params, state, batch, key=None):
    loss, aux, grads = gradients(params, batch, key)
    value_fn = lambda p: value_of(p, batch, key)
    offered = {"value": loss, "grad": grads, "value_fn": value_fn,
               "obj_fn": value_fn}
    new_params, updates, new_state = apply_in_layout(
        tx, grads, to_device(state, opt.state_shardings), params,
        update_shardings, param_shardings,
        **{name: offered[name] for name in extra_args})
    new_state = to_home(new_state, opt.state_shardings)
    out = (new_params, new_state, (loss, aux) if has_aux else loss)
    if metrics is not None:
      # The params as returned: without the barrier XLA may drop the rounding
      # to bfloat16 where the metrics widen them again.
      returned = jax.lax.optimization_barrier(new_params)
      out += (metrics(in_layout(grads, param_shardings), updates, returned),)
    return out

  replicated = NamedSharding(mesh, P())
  loss_out = (replicated, None) if has_aux else replicated
  in_shardings = (param_shardings, opt.state_shardings, None) + (
      (replicated,) if with_key else ())
  out_shardings = (param_shardings, opt.state_shardings, loss_out) + (
      (replicated,) if metrics is not None else ())
  return TrainStep(jax.jit(
      under_mesh(step, mesh), in_shardings=in_shardings,
      out_shardings=out_shardings,
      donate_argnums=(0, 1) if opt.donate else (),
      keep_unused=True), layout, with_key, param_shardings, opt.state_shardings,
      opt.donate, opt.update.params_like)


def _loss_only(loss_fn, has_aux, with_key, params, batch, key):
  out = loss_fn(params, batch, *((key,) if with_key else ()))
  return out[0] if has_aux else out
