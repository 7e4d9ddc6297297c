"""Second-order quantities of a loss (optax's ``optax.second_order``,
deprecated in optax 0.2.7 and removed in 0.2.9): Hessian-vector products,
the Hessian's diagonal and the observed Fisher information's diagonal.

Each function warns on every call, as optax's does; ``hessian_diag`` goes
through ``hvp`` and so warns for both, as optax's.
"""

from collections.abc import Callable
from typing import Any

import jax
from jax import flatten_util
import jax.numpy as jnp

from shardopt._src.deprecations import warn_on_call

__all__ = ["fisher_diag", "hessian_diag", "hvp"]

_REMOVED_IN = "0.2.9"
LossFn = Callable[[Any, jax.Array, jax.Array], jax.Array]


def _flat(tree: Any) -> jax.Array:
  return flatten_util.ravel_pytree(tree)[0]


@warn_on_call("shardopt.second_order.hvp", _REMOVED_IN)
def hvp(loss: LossFn, v: jax.Array, params: Any, inputs: jax.Array,
        targets: jax.Array) -> jax.Array:
  """The Hessian of ``loss`` at ``params`` times ``v``, by forward-over-
  reverse differentiation (one gradient's JVP; the Hessian is never formed).

  Deprecated (as in optax 0.2.8; optax removes it in 0.2.9).

  Args:
    loss: ``loss(params, inputs, targets)``, a scalar.
    v: a vector of the size of ``params`` raveled.
    params: the point, a pytree.
    inputs: the inputs ``loss`` is evaluated at.
    targets: the targets ``loss`` is evaluated at.

  Returns:
    ``H v``, a pytree of ``params``' structure.

  References:
    Pearlmutter, `Fast Exact Multiplication by the Hessian
    <https://doi.org/10.1162/neco.1994.6.1.147>`_, Neural Computation 1994
  """
  _, unravel = flatten_util.ravel_pytree(params)
  gradient = jax.grad(lambda p: loss(p, inputs, targets))
  return jax.jvp(gradient, [params], [unravel(v)])[1]


@warn_on_call("shardopt.second_order.hessian_diag", _REMOVED_IN)
def hessian_diag(loss: LossFn, params: Any, inputs: jax.Array,
                 targets: jax.Array) -> jax.Array:
  """The diagonal of the Hessian of ``loss`` at ``params``: ``e_i . H e_i``
  for every unit vector, one ``hvp`` each (vmapped).

  Deprecated (as in optax 0.2.8; optax removes it in 0.2.9).

  Args:
    loss: ``loss(params, inputs, targets)``, a scalar.
    params: the point, a pytree.
    inputs: the inputs ``loss`` is evaluated at.
    targets: the targets ``loss`` is evaluated at.

  Returns:
    A vector of the size of ``params`` raveled.

  References:
    Pearlmutter, `Fast Exact Multiplication by the Hessian
    <https://doi.org/10.1162/neco.1994.6.1.147>`_, Neural Computation 1994
  """
  flat = _flat(params)

  def diagonal_entry(unit):
    return jnp.vdot(unit, _flat(hvp(loss, unit, params, inputs, targets)))

  # Unit vectors in the raveled params' dtype (optax's are float32, which
  # bfloat16 params refuse as tangents).
  return jax.vmap(diagonal_entry)(jnp.eye(flat.size, dtype=flat.dtype))


@warn_on_call("shardopt.second_order.fisher_diag", _REMOVED_IN)
def fisher_diag(negative_log_likelihood: LossFn, params: Any, inputs: jax.Array,
                targets: jax.Array) -> jax.Array:
  """The diagonal of the observed Fisher information: the squared gradient
  of the negative log-likelihood.

  Deprecated (as in optax 0.2.8; optax removes it in 0.2.9).

  Args:
    negative_log_likelihood: ``nll(params, inputs, targets)``, a scalar.
    params: the point, a pytree.
    inputs: the inputs ``negative_log_likelihood`` is evaluated at.
    targets: the targets ``negative_log_likelihood`` is evaluated at.

  Returns:
    A vector of the size of ``params`` raveled.
  """
  return jnp.square(_flat(jax.grad(negative_log_likelihood)(params, inputs, targets)))
