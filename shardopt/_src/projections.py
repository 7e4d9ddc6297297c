"""Euclidean projections onto convex sets (optax's ``optax.projections``).

Each function returns the point of a set nearest (in the l2 norm over all
leaves) to a pytree. Elementwise projections (boxes, balls, half-spaces) act
leaf by leaf and keep each leaf's sharding. The simplex and l1 projections
need one threshold over all leaves: it is found from the leaves' values
gathered and sorted once, then applied to each leaf in place, so every leaf
keeps its own shape, dtype rule and sharding (optax ravels the whole tree
and unravels the result).
"""

from typing import Any

import jax
from jax import lax
import jax.numpy as jnp

from shardopt._src.tree_math import tree_add_scale
from shardopt._src.tree_math import tree_full_like
from shardopt._src.tree_math import tree_inner_product
from shardopt._src.tree_math import tree_mul
from shardopt._src.tree_math import tree_scale
from shardopt._src.tree_reductions import tree_norm
from shardopt._src.typed_layouts import whole

__all__ = [
    "projection_box",
    "projection_halfspace",
    "projection_hypercube",
    "projection_hyperplane",
    "projection_l1_ball",
    "projection_l1_sphere",
    "projection_l2_ball",
    "projection_l2_sphere",
    "projection_linf_ball",
    "projection_non_negative",
    "projection_simplex",
    "projection_vector",
]


def projection_non_negative(tree: Any) -> Any:
  r"""Projects onto the non-negative orthant: ``argmin_{p >= 0} ||x - p||``.

  Args:
    tree: the pytree ``x`` to project.

  Returns:
    ``max(x, 0)`` leafwise, a pytree of ``tree``'s structure.
  """
  return jax.tree.map(jax.nn.relu, tree)


def _per_leaf(bound: Any, tree: Any) -> Any:
  """``bound`` as a tree of ``tree``'s structure: a single value (a scalar,
  an array, None) applies to every leaf; a tree is used as it is."""
  if bound is None or jax.tree_util.treedef_is_leaf(jax.tree.structure(bound)):
    return jax.tree.map(lambda _: bound, tree)
  return bound


def projection_box(tree: Any, lower: Any, upper: Any) -> Any:
  r"""Projects onto a box: ``argmin_{lower <= p <= upper} ||x - p||``.

  Args:
    tree: the pytree ``x`` to project.
    lower: the lower bound, one value for every leaf or a pytree of
      ``tree``'s structure.
    upper: the upper bound, likewise.

  Returns:
    ``clip(x, lower, upper)`` leafwise, a pytree of ``tree``'s structure.
  """
  return jax.tree.map(jnp.clip, tree, _per_leaf(lower, tree), _per_leaf(upper, tree))


def projection_hypercube(tree: Any, scale: Any = 1) -> Any:
  r"""Projects onto the hypercube ``[0, scale]^n`` (the unit one by default).

  Args:
    tree: the pytree ``x`` to project.
    scale: the cube's side, one value or a pytree of ``tree``'s structure.

  Returns:
    ``clip(x, 0, scale)`` leafwise, a pytree of ``tree``'s structure.
  """
  return projection_box(tree, lower=0, upper=scale)


def _flat(leaves) -> jax.Array:
  """All leaves' values in one vector, whole on every device."""
  return jnp.concatenate([jnp.ravel(whole(leaf)) for leaf in leaves])


@jax.custom_jvp
def _unit_simplex(leaves: tuple) -> list:
  """The projection of the vector of all leaves onto the unit simplex,
  leaf by leaf: ``max(x - theta, 0)`` with the threshold ``theta`` from
  the sorted values (the largest ``k`` values with ``u_k > (S_k - 1) / k``,
  ``S_k`` their sum, are the support)."""
  u = jnp.sort(_flat(leaves))[::-1]
  partial_sums = jnp.cumsum(u)
  k = jnp.arange(u.shape[0]) + 1
  support_size = jnp.count_nonzero(1 / k + (u - partial_sums / k) > 0)
  top_sum = partial_sums[support_size - 1]
  return [jax.nn.relu(1 / support_size + (leaf - top_sum / support_size))
          for leaf in leaves]


@_unit_simplex.defjvp
def _unit_simplex_jvp(primals, tangents):
  """On the support ``s`` the projection moves with the input less the
  input's mean motion over ``s``; off it, not at all."""
  (leaves,), (leaf_tangents,) = primals, tangents
  projected = _unit_simplex(leaves)
  support = [p > 0 for p in projected]
  flat_support = _flat(support)
  mean_motion = (jnp.dot(flat_support, _flat(leaf_tangents))
                 / jnp.count_nonzero(flat_support))
  moved = [(s * t - mean_motion * s).astype(p.dtype)
           for s, t, p in zip(support, leaf_tangents, projected)]
  return projected, moved


def projection_simplex(tree: Any, scale: jax.typing.ArrayLike = 1) -> Any:
  r"""Projects onto the simplex ``{p >= 0, sum(p) = scale}`` (over all
  leaves; the probability simplex by default).

  The sort-based algorithm of Held et al. (1974) and Duchi et al. (2008),
  with a closed-form derivative (differentiable by ``jax.jvp`` and
  ``jax.grad``).

  Args:
    tree: the pytree ``x`` to project.
    scale: the value the projection sums to.

  Returns:
    A pytree of ``tree``'s structure. Its leaves' dtype is optax's: a tree
    of one dtype gets the computation's (float32 for bfloat16 or integer
    leaves), a tree of mixed dtypes each leaf's own.

  Raises:
    TypeError: for a tree of mixed dtypes whose computation leaves their
      common dtype (integer leaves only), as optax's unravelling does.

  References:
    Duchi et al., `Efficient Projections onto the l1-Ball for Learning in
    High Dimensions <https://dl.acm.org/doi/10.1145/1390156.1390191>`_,
    ICML 2008

    Condat, `Fast projection onto the simplex and the l1 ball
    <https://doi.org/10.1007/s10107-015-0946-4>`_, Math. Programming 2016
  """
  leaves, treedef = jax.tree.flatten(tree)
  if not leaves:  # nothing to project (optax's raises an IndexError)
    return tree
  leaves = [jnp.asarray(leaf) for leaf in leaves]
  dtypes = [leaf.dtype for leaf in leaves]
  common = jnp.result_type(*dtypes)
  scaled = tuple(leaf.astype(common) / scale for leaf in leaves)
  projected = [scale * p for p in _unit_simplex(scaled)]
  if len(set(dtypes)) > 1:
    if projected[0].dtype != common:
      raise TypeError(f"projection_simplex: leaves of dtypes {sorted(map(str, set(dtypes)))}"
                      f" give a {projected[0].dtype} projection, not their common"
                      f" {common}")
    projected = [p.astype(dtype) for p, dtype in zip(projected, dtypes)]
  return jax.tree.unflatten(treedef, projected)


def projection_l1_sphere(tree: Any, scale: jax.typing.ArrayLike = 1) -> Any:
  r"""Projects onto the l1 sphere ``{y : ||y||_1 = scale}``: the signs of
  ``x`` times the projection of ``|x|`` onto the simplex of sum ``scale``.

  Args:
    tree: the pytree ``x`` to project.
    scale: the sphere's radius.

  Returns:
    A pytree of ``tree``'s structure (dtypes as ``projection_simplex``'s).

  References:
    Duchi et al., `Efficient Projections onto the l1-Ball for Learning in
    High Dimensions <https://dl.acm.org/doi/10.1145/1390156.1390191>`_,
    ICML 2008
  """
  magnitudes = projection_simplex(jax.tree.map(jnp.abs, tree), scale)
  return tree_mul(jax.tree.map(jnp.sign, tree), magnitudes)


def projection_l1_ball(tree: Any, scale: jax.typing.ArrayLike = 1) -> Any:
  r"""Projects onto the l1 ball ``{y : ||y||_1 <= scale}``: points inside
  stay, others go to the sphere (``projection_l1_sphere``).

  Args:
    tree: the pytree ``x`` to project.
    scale: the ball's radius.

  Returns:
    A pytree of ``tree``'s structure, in ``projection_l1_sphere``'s dtypes
    (optax's refuses bfloat16 leaves, whose sphere is float32).

  References:
    Duchi et al., `Efficient Projections onto the l1-Ball for Learning in
    High Dimensions <https://dl.acm.org/doi/10.1145/1390156.1390191>`_,
    ICML 2008

    Condat, `Fast projection onto the simplex and the l1 ball
    <https://doi.org/10.1007/s10107-015-0946-4>`_, Math. Programming 2016
  """
  def to_sphere(t):
    return projection_l1_sphere(t, scale)

  sphere_types = jax.eval_shape(to_sphere, tree)

  def stay(t):
    return jax.tree.map(lambda x, s: jnp.asarray(x).astype(s.dtype), t, sphere_types)

  return lax.cond(tree_norm(tree, ord=1) <= scale, stay, to_sphere, tree)


def projection_l2_sphere(tree: Any, scale: jax.typing.ArrayLike = 1) -> Any:
  r"""Projects onto the l2 sphere ``{y : ||y||_2 = scale}``: ``x`` rescaled
  to norm ``scale`` (NaN for ``x = 0``, as optax's).

  Args:
    tree: the pytree ``x`` to project.
    scale: the sphere's radius.

  Returns:
    ``scale / ||x|| * x``, a pytree of ``tree``'s structure.
  """
  return tree_scale(scale / tree_norm(tree), tree)


def projection_l2_ball(tree: Any, scale: jax.typing.ArrayLike = 1) -> Any:
  r"""Projects onto the l2 ball ``{y : ||y||_2 <= scale}``: points inside
  stay, others are rescaled to norm ``scale``.

  Args:
    tree: the pytree ``x`` to project.
    scale: the ball's radius.

  Returns:
    ``scale / max(||x||, scale) * x``, a pytree of ``tree``'s structure.
  """
  squared_norm = tree_norm(tree, squared=True)
  return tree_scale(scale / jnp.sqrt(jnp.maximum(squared_norm, scale**2)), tree)


def projection_linf_ball(tree: Any, scale: jax.typing.ArrayLike = 1) -> Any:
  r"""Projects onto the l-infinity ball ``{y : max |y_i| <= scale}``.

  Args:
    tree: the pytree ``x`` to project.
    scale: the ball's radius (filled into each leaf's dtype, as optax's).

  Returns:
    ``clip(x, -scale, scale)`` leafwise, a pytree of ``tree``'s structure.
  """
  return projection_box(tree, lower=tree_full_like(tree, -scale),
                        upper=tree_full_like(tree, scale))


def projection_vector(x: Any, a: Any) -> Any:
  r"""Projects onto the line spanned by ``a``: ``<x, a> / <a, a> * a``.

  Args:
    x: the pytree to project.
    a: the pytree spanning the line, of ``x``'s structure.

  Returns:
    A pytree of ``a``'s structure.
  """
  return tree_scale(tree_inner_product(x, a) / tree_inner_product(a, a), a)


def _signed_distance(x: Any, a: Any, b: jax.typing.ArrayLike) -> jax.Array:
  """How far (in units of ``a``) ``x`` must move along ``a`` to reach
  ``<a, y> = b``."""
  return (b - tree_inner_product(x, a)) / tree_inner_product(a, a)


def projection_hyperplane(x: Any, a: Any, b: jax.typing.ArrayLike) -> Any:
  r"""Projects onto the hyperplane ``{y : <a, y> = b}``.

  Args:
    x: the pytree to project.
    a: the hyperplane's normal, a pytree of ``x``'s structure.
    b: the hyperplane's offset, a scalar.

  Returns:
    ``x + (b - <a, x>) / <a, a> * a``, a pytree of ``x``'s structure.
  """
  return tree_add_scale(x, _signed_distance(x, a, b), a)


def projection_halfspace(x: Any, a: Any, b: jax.typing.ArrayLike) -> Any:
  r"""Projects onto the half-space ``{y : <a, y> <= b}``: points inside
  stay, others go to its boundary hyperplane.

  Args:
    x: the pytree to project.
    a: the half-space's outward normal, a pytree of ``x``'s structure.
    b: the half-space's offset, a scalar.

  Returns:
    ``x + min((b - <a, x>) / <a, a>, 0) * a``, a pytree of ``x``'s
    structure.
  """
  return tree_add_scale(x, jnp.clip(_signed_distance(x, a, b), max=0), a)
