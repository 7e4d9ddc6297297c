"""shardopt.tree (optax.tree's names) and shardopt.tree_utils
(optax.tree_utils's) against optax: numbers, dtypes, random trees, lookups
by key in optimizer states, and the reductions on sharded trees."""

import inspect
import types
import warnings

import jax
import jax.numpy as jnp
from jax.sharding import AxisType
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P
import numpy as np
import optax
import pytest

import shardopt
from shardopt import tree
from shardopt import tree_utils
from tests import oracle

_X, _Y = oracle.mixed_tree(0), oracle.mixed_tree(1)
_Z = jax.tree.map(lambda a, b: a + 1j * b, _X, _Y)  # complex leaves
_POSITIVE = jax.tree.map(lambda a: jnp.abs(a) + 0.5, _Y)

# (name in optax.tree, positional args); kwargs follow where they matter.
CASES = [
    ("add", (_X, _Y)), ("add", (_X, _Y, _POSITIVE)), ("sub", (_X, _Y)),
    ("mul", (_X, _Y)), ("div", (_X, _POSITIVE)), ("scale", (0.3, _X)),
    ("add_scale", (_X, 0.3, _Y)), ("vdot", (_X, _Y)), ("vdot", (_Z, _Z)),
    ("sum", (_X,)), ("max", (_X,)), ("min", (_X,)), ("size", (_X,)),
    ("conj", (_Z,)), ("real", (_Z,)), ("norm", (_X,)), ("norm", (_Z,)),
    ("clip", (_X, -0.5, 0.5)), ("clip", (_X, None, 0.1)),
    ("batch_shape", (_X, (2, 3))), ("zeros_like", (_X,)), ("ones_like", (_X,)),
    ("full_like", (_X, 2.5)), ("cast", (_X, jnp.bfloat16)),
    ("cast_like", (_X, tree.cast(_Y, jnp.float16))),
    ("where", (jnp.asarray(False), _X, _Y)), ("allclose", (_X, _X)),
    ("allclose", (_X, _Y)), ("update_moment", (_X, _Y, 0.9, 2)),
    ("update_infinity_moment", (_X, _Y, 0.9, 1e-3)),
    ("update_moment_per_elem_norm", (_Z, _Y, 0.9, 2)),
    ("bias_correction", (_X, 0.9, 3)), ("unwrap_random_key_data",
                                        ({"k": jax.random.key(3), "x": _X},)),
]
_KWARGS = [
    ("sum", {"associative_reduction": True}), ("norm", {"ord": 1}),
    ("norm", {"ord": "inf"}), ("norm", {"ord": 2, "squared": True}),
    ("allclose", {"rtol": 10.0, "atol": 10.0}),
]


def _assert_same(got, want):
  assert jax.tree.structure(got) == jax.tree.structure(want)
  for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
    assert jnp.result_type(g) == jnp.result_type(w)
    np.testing.assert_allclose(np.asarray(g), np.asarray(w), rtol=1e-6)


@pytest.mark.parametrize("name,args", CASES,
                         ids=[f"{c[0]}-{i}" for i, c in enumerate(CASES)])
def test_matches_optax(name, args):
  _assert_same(getattr(tree, name)(*args), getattr(optax.tree, name)(*args))


@pytest.mark.parametrize("name,kwargs", _KWARGS)
def test_options_match_optax(name, kwargs):
  _assert_same(getattr(tree, name)(_Z if name == "norm" else _X,
                                   *(() if name != "allclose" else (_Y,)),
                                   **kwargs),
               getattr(optax.tree, name)(_Z if name == "norm" else _X,
                                         *(() if name != "allclose" else (_Y,)),
                                         **kwargs))


def test_tree_utils_spellings_are_the_same_functions():
  for name in (n for n in dir(optax.tree) if not n.startswith("_")):
    assert getattr(tree_utils, f"tree_{name}") is getattr(tree, name), name


def test_tree_vdot_keeps_the_real_part_vdot_is_complex():
  np.testing.assert_allclose(tree.vdot(_Z, _Y), optax.tree.vdot(_Z, _Y),
                             rtol=1e-6)
  np.testing.assert_allclose(tree.tree_vdot(_Z, _Y),
                             np.real(optax.tree.vdot(_Z, _Y)), rtol=1e-6)


@pytest.mark.parametrize("handler", [None, "promote", "highest", "lowest"])
def test_dtype_matches_optax(handler):
  same = {"a": jnp.ones(2), "b": jnp.zeros(3)}
  mixed = {"a": jnp.ones(2, jnp.bfloat16), "b": jnp.ones(3, jnp.float32)}
  assert tree.dtype(same, handler) == optax.tree.dtype(same, handler)
  if handler is None:
    with pytest.raises(ValueError, match=r"\['b'\] is float32"):
      tree.dtype(mixed)
  else:
    assert tree.dtype(mixed, handler) == optax.tree.dtype(mixed, handler)


def test_dtype_rejects_an_unknown_handler():
  with pytest.raises(ValueError, match="mixed_dtype_handler='widest'"):
    tree.dtype(_X, "widest")


def test_random_trees_match_optax():
  key = jax.random.PRNGKey(4)
  _assert_same(tree.split_key_like(key, _X), optax.tree.split_key_like(key, _X))
  for sampler in (jax.random.normal, jax.random.uniform):
    _assert_same(tree.random_like(key, _X, sampler),
                 optax.tree.random_like(key, _X, sampler))
  _assert_same(tree.random_like(key, _X, dtype=jnp.bfloat16),
               optax.tree.random_like(key, _X, dtype=jnp.bfloat16))


def _state():
  tx = optax.chain(optax.inject_hyperparams(optax.adam)(learning_rate=0.1),
                   optax.scale_by_adam(), optax.add_decayed_weights(0.1))
  return tx.init(_X)


@pytest.mark.parametrize("key", ["count", "learning_rate", "mu",
                                 "ScaleByAdamState", "missing"])
def test_get_all_with_path_matches_optax(key):
  got = tree.get_all_with_path(_state(), key)
  want = optax.tree.get_all_with_path(_state(), key)
  assert [jax.tree_util.keystr(p) for p, _ in got] == [
      jax.tree_util.keystr(p) for p, _ in want]
  _assert_same([v for _, v in got], [v for _, v in want])


def test_get_with_a_filter_and_set_match_optax():
  state = _state()
  in_hyperparams = lambda path, _: not any(
      isinstance(k, optax.tree_utils.NamedTupleKey)
      and k.tuple_name == "ScaleByAdamState" for k in path)
  ours_filter = lambda path, _: not any(
      isinstance(k, tree_utils.NamedTupleKey)
      and k.tuple_name == "ScaleByAdamState" for k in path)
  with pytest.raises(KeyError, match="several values under 'count'"):
    tree.get(state, "count")
  assert tree.get(state, "nothing", default=7) == 7
  _assert_same(tree.get(state, "mu", filtering=lambda p, _: len(p) > 3),
               optax.tree.get(state, "mu", filtering=lambda p, _: len(p) > 3))
  new_count = jnp.asarray(5, jnp.int32)
  _assert_same(tree.set(state, ours_filter, count=new_count),
               optax.tree.set(state, in_hyperparams, count=new_count))
  _assert_same(tree.set(state, learning_rate=jnp.asarray(0.5)),
               optax.tree.set(state, learning_rate=jnp.asarray(0.5)))
  with pytest.raises(KeyError, match="no value under 'nothing'"):
    tree.set(state, nothing=1)


def test_named_tuple_key_prints_like_optax():
  assert str(tree_utils.NamedTupleKey("ScaleByAdamState", "mu")) == str(
      optax.tree_utils.NamedTupleKey("ScaleByAdamState", "mu"))


def _sharded(axis_type, seed):
  kind = getattr(AxisType, axis_type)
  mesh = jax.make_mesh((2, 4), ("data", "model"), axis_types=(kind, kind))
  specs = {"w": P("data", "model"), "b": P("model"), "s": P()}
  keys = jax.random.split(jax.random.PRNGKey(seed), 3)
  shapes = {"w": (8, 12), "b": (12,), "s": ()}
  return mesh, {n: jax.device_put(jax.random.normal(k, shapes[n]),
                                  NamedSharding(mesh, specs[n]))
                for k, n in zip(keys, shapes)}


@pytest.mark.parametrize("axis_type", ["Explicit", "Auto"])
@pytest.mark.parametrize("name", ["vdot", "norm", "sum", "max", "allclose"])
def test_reductions_on_a_sharded_tree_match_optax_unsharded(axis_type, name):
  mesh, x = _sharded(axis_type, 0)
  _, y = _sharded(axis_type, 1)
  args = (x, y) if name in ("vdot", "allclose") else (x,)
  want = getattr(optax.tree, name)(*jax.device_get(args))
  with jax.set_mesh(mesh):
    got = jax.jit(getattr(tree, name))(*args)
  np.testing.assert_allclose(got, want, rtol=1e-6)
  assert got.sharding.is_fully_replicated


@pytest.mark.parametrize("ord", [None, 1, "inf"])
def test_norm_runs_eagerly_on_explicit_axes_without_a_mesh_context(ord):
  # A real leaf's norm builds no imaginary part: jax makes it on one device,
  # which an eager call on Explicit axes refused (optax's still does).
  _, x = _sharded("Explicit", 0)
  want = optax.tree.norm(jax.device_get(x), ord=ord)
  np.testing.assert_allclose(tree.norm(x, ord=ord), want, rtol=1e-6)
  np.testing.assert_allclose(tree.norm(x, ord=ord, squared=True), want ** 2, rtol=1e-6)


def test_random_like_keeps_the_target_shardings_on_an_explicit_mesh():
  mesh, x = _sharded("Explicit", 0)
  with jax.set_mesh(mesh):
    got = tree.random_like(jax.random.PRNGKey(2), x)
  for leaf, target in zip(jax.tree.leaves(got), jax.tree.leaves(x)):
    assert leaf.sharding.is_equivalent_to(target.sharding, leaf.ndim)
  _assert_same(jax.device_get(got), optax.tree.random_like(
      jax.random.PRNGKey(2), jax.device_get(x)))


def test_shardopt_tree_keeps_its_names():
  for name in ("tree_add", "tree_vdot", "tree_sum", "tree_cast", "tree_where",
               "tree_zeros_like", "tree_map_params", "apply_updates",
               "bias_correction", "global_norm", "update_moment"):
    assert callable(getattr(shardopt.tree, name)), name


def _optax_functions():
  """(namespace, name) of every public function and class of optax.tree and
  optax.tree_utils."""
  return [(ns, n) for ns in ("tree", "tree_utils")
          for n in dir(getattr(optax, ns))
          if not n.startswith("_")
          and callable(getattr(getattr(optax, ns), n))
          and not isinstance(getattr(getattr(optax, ns), n), types.ModuleType)]


def _signature(fn):
  return [(p.name, p.kind, p.default)
          for p in inspect.signature(fn).parameters.values()]


@pytest.mark.parametrize("namespace,name", _optax_functions())
def test_signature_matches_optax(namespace, name):
  # Names, kinds (keyword-only, *args) and defaults, so keyword calls that
  # work on optax's work on ours.
  assert _signature(getattr(getattr(shardopt, namespace), name)) == \
      _signature(getattr(getattr(optax, namespace), name))


@pytest.mark.parametrize("name,kwargs", [
    ("add", dict(tree_x=_X, tree_y=_Y)), ("sub", dict(tree_x=_X, tree_y=_Y)),
    ("mul", dict(tree_x=_X, tree_y=_Y)),
    ("div", dict(tree_x=_X, tree_y=_POSITIVE)),
    ("vdot", dict(tree_x=_Z, tree_y=_Y)),
    ("add_scale", dict(tree_x=_X, scalar=0.3, tree_y=_Y)),
    ("cast_like", dict(tree=_X, other_tree=tree.cast(_Y, jnp.bfloat16))),
    ("where", dict(condition=jnp.asarray(True), tree_x=_X, tree_y=_Y)),
])
def test_keyword_calls_match_optax(name, kwargs):
  _assert_same(getattr(tree_utils, f"tree_{name}")(**kwargs),
               getattr(optax.tree_utils, f"tree_{name}")(**kwargs))
  _assert_same(getattr(tree, name)(**kwargs), getattr(optax.tree, name)(**kwargs))


@pytest.mark.parametrize("name,args", [
    ("tree_l1_norm", (_Z,)), ("tree_l2_norm", (_Z,)), ("tree_linf_norm", (_Z,)),
    ("tree_scalar_mul", (0.3, _X)), ("tree_add_scalar_mul", (_X, 0.3, _Y)),
])
def test_deprecated_names_warn_and_match_optax(name, args):
  with pytest.warns(DeprecationWarning, match=f"tree_utils.{name} is deprecated"):
    ours = getattr(tree_utils, name)
  with warnings.catch_warnings():
    warnings.simplefilter("ignore", DeprecationWarning)
    theirs = getattr(optax.tree_utils, name)
  assert _signature(ours) == _signature(theirs)
  _assert_same(ours(*args), theirs(*args))
  if "norm" in name:
    _assert_same(ours(*args, squared=True), theirs(*args, squared=True))


def test_an_unknown_name_is_still_an_attribute_error():
  with pytest.raises(AttributeError, match="tree_l3_norm"):
    tree_utils.tree_l3_norm  # pylint: disable=pointless-statement


def test_tree_add_counts_boolean_leaves_as_optax_does():
  """Boolean leaves add as counts, int32, as optax's sum from 0 (they were or-ed: [True, False])."""
  flags = {"a": jnp.array([True, False]), "b": jnp.float16(1.5)}
  for trees in ((flags, flags), (flags, flags, flags)):
    ours, theirs = shardopt.tree_utils.tree_add(*trees), optax.tree_utils.tree_add(*trees)
    for a, b in zip(jax.tree.leaves(ours), jax.tree.leaves(theirs)):
      assert a.dtype == b.dtype
      np.testing.assert_array_equal(a, b)
  assert shardopt.tree_utils.tree_add(flags, flags)["a"].tolist() == [2, 0]
