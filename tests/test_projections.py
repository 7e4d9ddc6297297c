"""shardopt.projections against optax.projections: the same values (rtol
1e-6), dtypes and shapes on random pytrees and arrays under jit and under
vmap, and eagerly: points already inside a set, radii and scales, ties, zeros,
bfloat16, integer and mixed-dtype leaves; the simplex and l1 derivatives;
and a sharded case on the 8-device mesh (Auto and Explicit axes)."""

import functools
import inspect

import jax
import jax.numpy as jnp
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P
import numpy as np
import optax
import pytest

import shardopt
from shardopt import projections
from tests.oracle import assert_trees_close, mixed_tree
from tests.test_docstrings import docstring_problems

_OURS, _THEIRS = projections, optax.projections



def _like(x, value):
  return jax.tree.map(lambda leaf: jnp.full_like(leaf, value), x)


# (name, projection(module, x, a), whether optax's takes any pytree). optax's
# box and hypercube take a single bound for a single array only.
_CASES = [
    ("non_negative", lambda m, x, a: m.projection_non_negative(x), True),
    ("box", lambda m, x, a: m.projection_box(x, _like(x, -0.5), _like(x, 0.7)), True),
    ("box_tree_bounds", lambda m, x, a: m.projection_box(
        x, jax.tree.map(lambda l: -jnp.abs(l), a), jax.tree.map(jnp.abs, a)), True),
    ("box_scalar_bounds", lambda m, x, a: m.projection_box(x, -0.5, 0.7), False),
    ("hypercube", lambda m, x, a: m.projection_hypercube(x), False),
    ("hypercube_scale", lambda m, x, a: m.projection_hypercube(x, 0.3), False),
    ("linf_ball", lambda m, x, a: m.projection_linf_ball(x), True),
    ("linf_ball_scale", lambda m, x, a: m.projection_linf_ball(x, 0.25), True),
    ("l2_ball", lambda m, x, a: m.projection_l2_ball(x), True),
    ("l2_ball_scale", lambda m, x, a: m.projection_l2_ball(x, 2.5), True),
    ("l2_ball_inside", lambda m, x, a: m.projection_l2_ball(x, 1e3), True),
    ("l2_sphere", lambda m, x, a: m.projection_l2_sphere(x), True),
    ("l2_sphere_scale", lambda m, x, a: m.projection_l2_sphere(x, 3.0), True),
    ("l1_ball", lambda m, x, a: m.projection_l1_ball(x), True),
    ("l1_ball_scale", lambda m, x, a: m.projection_l1_ball(x, 2.5), True),
    ("l1_ball_inside", lambda m, x, a: m.projection_l1_ball(x, 1e3), True),
    ("l1_sphere", lambda m, x, a: m.projection_l1_sphere(x), True),
    ("l1_sphere_scale", lambda m, x, a: m.projection_l1_sphere(x, 2.5), True),
    ("simplex", lambda m, x, a: m.projection_simplex(x), True),
    ("simplex_scale", lambda m, x, a: m.projection_simplex(x, 3.0), True),
    ("simplex_array_scale", lambda m, x, a: m.projection_simplex(x, jnp.float32(0.5)), True),
    ("vector", lambda m, x, a: m.projection_vector(x, a), True),
    ("hyperplane", lambda m, x, a: m.projection_hyperplane(x, a, 0.7), True),
    ("halfspace", lambda m, x, a: m.projection_halfspace(x, a, 0.7), True),
    ("halfspace_inside", lambda m, x, a: m.projection_halfspace(x, a, 1e3), True),
]
_IDS = [name for name, _, _ in _CASES]


def _stack(trees):
  return jax.tree.map(lambda *leaves: jnp.stack(leaves), *trees)


def _vector(seed, n=17, scale=1.0):
  return scale * jax.random.normal(jax.random.PRNGKey(seed), (n,))


_KINDS = ("vector", "scaled_vector", "tree", "small_tree", "batched_vectors", "batched_trees")


@functools.cache
def _inputs(kind):
  """(x, a) by kind: vectors and pytrees, alone and batched for vmap."""
  make = {
      "vector": lambda: (_vector(0), _vector(1)),
      "scaled_vector": lambda: (_vector(2, scale=3.0), _vector(3)),
      "tree": lambda: (mixed_tree(0), mixed_tree(1)),
      "small_tree": lambda: (mixed_tree(2, scale=0.05), mixed_tree(3)),
      "batched_vectors": lambda: (_stack([_vector(s, 7) for s in range(3)]),
                                  _stack([_vector(s, 7) for s in range(3, 6)])),
      "batched_trees": lambda: (_stack([mixed_tree(s, scale=0.3) for s in range(3)]),
                                _stack([mixed_tree(s) for s in range(3, 6)])),
  }
  return make[kind]()


@functools.cache
def _jitted_results(module, kind):
  """Every case's projection of ``_inputs(kind)`` by ``module`` in one
  jitted program (vmapped over the leading axis for the batched kinds)."""
  trees = "tree" in kind
  def all_cases(x, a):
    return {name: project(module, x, a) for name, project, takes_trees in _CASES
            if takes_trees or not trees}
  fn = jax.vmap(all_cases) if kind.startswith("batched") else all_cases
  return jax.jit(fn)(*_inputs(kind))


@pytest.mark.parametrize("name,project,takes_trees", _CASES, ids=_IDS)
def test_matches_optax_under_jit_and_under_vmap(name, project, takes_trees):
  # (Eagerly: the edge-case tests below.)
  kinds = [kind for kind in _KINDS if takes_trees or "tree" not in kind]
  for kind in kinds:
    assert_trees_close(_jitted_results(_OURS, kind)[name], _jitted_results(_THEIRS, kind)[name])


def test_points_already_inside_stay_where_they_are():
  x = jnp.array([0.1, -0.2, 0.3])
  on_simplex = jnp.array([0.2, 0.5, 0.3])
  for ours, theirs, point in [
      (_OURS.projection_l1_ball(x), _THEIRS.projection_l1_ball(x), x),
      (_OURS.projection_l2_ball(x), _THEIRS.projection_l2_ball(x), x),
      (_OURS.projection_linf_ball(x, 0.3), _THEIRS.projection_linf_ball(x, 0.3), x),
      (_OURS.projection_box(x, -1.0, 1.0), _THEIRS.projection_box(x, -1.0, 1.0), x),
      (_OURS.projection_halfspace(x, x, 1.0), _THEIRS.projection_halfspace(x, x, 1.0), x),
      (_OURS.projection_simplex(on_simplex), _THEIRS.projection_simplex(on_simplex),
       on_simplex),
  ]:
    assert_trees_close(ours, theirs)
    np.testing.assert_allclose(ours, point, rtol=1e-6)


@pytest.mark.parametrize("x", [
    [1.0, 1.0, 1.0, 1.0], [2.0, 2.0, 0.0, 0.0], [0.5, 0.5, -1.0], [3.0, 3.0, 3.0, -3.0],
    [0.0, 0.0, 0.0], [1.0, -1.0, 1.0, -1.0], [0.25, 0.25, 0.25, 0.25],
], ids=lambda x: str(x))
def test_ties_and_zeros(x):
  x = jnp.array(x)
  for name in ("projection_simplex", "projection_l1_sphere", "projection_l1_ball"):
    for scale in (1.0, 0.5, 4.0):
      assert_trees_close(getattr(_OURS, name)(x, scale), getattr(_THEIRS, name)(x, scale))
  if not jnp.any(x):  # all tied at 0: the simplex's centre
    np.testing.assert_allclose(_OURS.projection_simplex(x), 1 / x.size, rtol=1e-6)


def test_degenerate_inputs_give_optaxs_nans():
  zeros, ones = jnp.zeros(3), jnp.ones(3)
  for ours, theirs in [
      (_OURS.projection_l2_sphere(zeros), _THEIRS.projection_l2_sphere(zeros)),
      (_OURS.projection_vector(ones, zeros), _THEIRS.projection_vector(ones, zeros)),
      (_OURS.projection_hyperplane(ones, zeros, 1.0),
       _THEIRS.projection_hyperplane(ones, zeros, 1.0)),
  ]:
    assert np.all(np.isnan(ours))
    assert_trees_close(ours, theirs)


_BF16 = jnp.array([0.75, -2.5, 1.0, 0.125, 3.0], jnp.bfloat16)


@pytest.mark.parametrize("name,args", [
    ("projection_non_negative", ()), ("projection_linf_ball", (0.5,)),
    ("projection_linf_ball", (jnp.float32(0.5),)), ("projection_box", (-0.5, 1.5)),
    ("projection_box", (jnp.float32(-0.5), 1.5)), ("projection_hypercube", ()),
    ("projection_l2_ball", ()), ("projection_l2_ball", (jnp.float32(1.0),)),
    ("projection_l2_sphere", (2.0,)), ("projection_l1_sphere", ()),
    ("projection_l1_sphere", (0.5,)), ("projection_simplex", ()),
    ("projection_simplex", (jnp.float32(2.0),)), ("projection_vector", (_BF16[::-1],)),
    ("projection_hyperplane", (_BF16[::-1], 1.0)),
    ("projection_hyperplane", (_BF16[::-1], jnp.float32(1.0))),
    ("projection_halfspace", (_BF16[::-1], 1.0)),
])
def test_bfloat16_inputs_give_optaxs_dtypes_and_values(name, args):
  # optax's simplex and l1 projections of bfloat16 leaves are float32; its
  # elementwise ones keep bfloat16 unless a float32 argument promotes them.
  assert_trees_close(getattr(_OURS, name)(_BF16, *args), getattr(_THEIRS, name)(_BF16, *args),
               rtol=1e-6)


def test_bfloat16_l1_ball_takes_the_spheres_dtype_where_optax_raises():
  # optax's lax.cond refuses branches of different dtypes (bfloat16 inside,
  # float32 on the sphere); shardopt's answers in the sphere's float32.
  with pytest.raises(TypeError, match="cond branches"):
    _THEIRS.projection_l1_ball(_BF16)
  assert_trees_close(_OURS.projection_l1_ball(_BF16), _THEIRS.projection_l1_sphere(_BF16))
  inside = _BF16 / 100
  assert_trees_close(_OURS.projection_l1_ball(inside), inside.astype(jnp.float32))


def test_integer_and_mixed_dtype_leaves():
  ints = jnp.array([3, -1, 0, 2])
  for name, args in [("projection_non_negative", ()), ("projection_linf_ball", (0.5,)),
                     ("projection_linf_ball", (2,)), ("projection_box", (0, 2)),
                     ("projection_simplex", ()), ("projection_l1_sphere", (2,))]:
    assert_trees_close(getattr(_OURS, name)(ints, *args), getattr(_THEIRS, name)(ints, *args))
  mixed = {"a": _BF16, "b": jnp.array([0.3, -0.7], jnp.float32), "c": 0.5}
  for name in ("projection_simplex", "projection_l1_sphere", "projection_l1_ball",
               "projection_l2_ball", "projection_linf_ball"):
    assert_trees_close(getattr(_OURS, name)(mixed), getattr(_THEIRS, name)(mixed))
  with pytest.raises(TypeError):  # int8 and int32 leaves: a float projection
    _OURS.projection_simplex({"a": ints.astype(jnp.int8), "b": ints})


def test_single_bounds_apply_to_every_leaf_of_a_tree():
  # optax's box and hypercube take a single bound for one array only
  # (jax.tree.map of a scalar over a dict raises); shardopt's apply it to
  # every leaf: the same as optax's leaf by leaf.
  x, scales = mixed_tree(0), jax.tree.map(lambda l: jnp.abs(l) + 0.1, mixed_tree(1))
  with pytest.raises(ValueError):
    _THEIRS.projection_box(x, -0.5, 0.7)
  leafwise = lambda f, *trees: jax.tree.map(f, x, *trees)
  assert_trees_close(_OURS.projection_box(x, -0.5, 0.7),
               leafwise(lambda l: _THEIRS.projection_box(l, -0.5, 0.7)))
  assert_trees_close(_OURS.projection_hypercube(x),
               leafwise(_THEIRS.projection_hypercube))
  assert_trees_close(_OURS.projection_hypercube(x, scales),
               leafwise(_THEIRS.projection_hypercube, scales))
  assert_trees_close(_OURS.projection_box(x, None, 0.5), leafwise(lambda l: jnp.minimum(l, 0.5)))
  assert _OURS.projection_simplex({}) == {}


@pytest.mark.parametrize("name", ["projection_simplex", "projection_l1_sphere",
                                  "projection_l1_ball"])
def test_derivatives_match_optax(name):
  x = jax.random.normal(jax.random.PRNGKey(4), (9,))
  jacobian = lambda m: jax.jit(jax.jacobian(lambda v: getattr(m, name)(v, 2.0)))
  assert_trees_close(jacobian(_OURS)(x), jacobian(_THEIRS)(x))
  # Through a pytree, by jvp and by grad.
  tree, direction = mixed_tree(5), mixed_tree(6)
  jvp = lambda m: jax.jit(lambda t, d: jax.jvp(getattr(m, name), (t,), (d,)))
  assert_trees_close(jvp(_OURS)(tree, direction), jvp(_THEIRS)(tree, direction))
  loss = lambda m: lambda t: shardopt.tree.vdot(getattr(m, name)(t), direction)
  assert_trees_close(jax.jit(jax.grad(loss(_OURS)))(tree), jax.jit(jax.grad(loss(_THEIRS)))(tree))


_SHARDED_CASES = ("non_negative", "box", "linf_ball", "l2_ball", "l2_sphere", "l1_ball",
                  "l1_sphere", "simplex", "vector", "hyperplane", "halfspace")


def test_sharded_equals_unsharded_and_keeps_the_input_sharding():
  # Auto axes: every projection keeps each leaf's sharding where optax's
  # does, and the simplex and l1 ones also where optax's (which ravels the
  # tree, then replicates it) does not. Explicit axes: optax's l1, simplex
  # and inner-product projections raise ShardingTypeError; shardopt's run
  # and keep every leaf's sharding.
  specs = {"w": P("data", "model"), "b": P("model"), "s": P()}
  def make(seed):
    keys = jax.random.split(jax.random.PRNGKey(seed), 3)
    return {"w": jax.random.normal(keys[0], (8, 12)), "b": jax.random.normal(keys[1], (8,)),
            "s": jax.random.normal(keys[2], ())}
  x, a = make(0), make(1)
  cases = {name: project for name, project, _ in _CASES if name in _SHARDED_CASES}
  all_cases = lambda module: jax.jit(
      lambda x, a: {name: project(module, x, a) for name, project in cases.items()})
  unsharded = all_cases(_OURS)(x, a)
  assert_trees_close(unsharded, all_cases(_THEIRS)(x, a))
  for kind in (jax.sharding.AxisType.Auto, jax.sharding.AxisType.Explicit):
    mesh = jax.make_mesh((2, 4), ("data", "model"), axis_types=(kind, kind))
    put = lambda t: jax.tree.map(
        lambda leaf, spec: jax.device_put(leaf, NamedSharding(mesh, spec)), t, specs)
    sharded_x, sharded_a = put(x), put(a)
    ours = all_cases(_OURS)(sharded_x, sharded_a)
    assert_trees_close(ours, unsharded)
    kept = {name: {k: out[k].sharding.spec == specs[k] for k in specs}
            for name, out in ours.items()}
    if kind == jax.sharding.AxisType.Explicit:
      assert all(all(leaves.values()) for leaves in kept.values()), kept
      continue
    theirs = all_cases(_THEIRS)(sharded_x, sharded_a)
    for name, out in theirs.items():
      theirs_kept = {k: out[k].sharding.spec == specs[k] for k in specs}
      assert all(kept[name][k] for k in specs if theirs_kept[k]), (name, kept, theirs_kept)
    for name in ("simplex", "l1_sphere", "l1_ball"):
      assert all(kept[name].values()), (name, kept[name])


@pytest.mark.parametrize("name", _OURS.__all__)
def test_signature_and_docstring(name):
  ours, theirs = getattr(_OURS, name), getattr(_THEIRS, name)
  strip = lambda f: [(p.name, p.default, p.kind) for p in inspect.signature(f).parameters.values()]
  assert strip(ours) == strip(theirs)
  references = name in ("projection_simplex", "projection_l1_sphere", "projection_l1_ball")
  assert docstring_problems(ours, references=references) == []
  assert set(_OURS.__all__) == {n for n in dir(_THEIRS) if not n.startswith("_")}
