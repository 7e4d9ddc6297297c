"""The declarations of which state fields are moments: optax's table.

Truths: optax's own modules (every class and field the table names exists
there), and the catalogue's optax builds (every class of the table is kept
by one of them, so ``test_quantized_state.py``'s
``test_optax_transformations_run_quantized_by_the_table`` runs it quantized
against optax's float state, where a wrong sign shows: SM3's momentum,
declared non-negative, moved its update 27-38% at 8 bits).
"""

import importlib
from typing import NamedTuple

import jax
import jax.numpy as jnp
import optax
import pytest

import shardopt
from shardopt._src import moments
from tests import catalogue


def _optax_class(key: str) -> type:
  module, name = key.rsplit(".", 1)
  return getattr(importlib.import_module(module), name)


@pytest.mark.parametrize("key", sorted(moments.OPTAX_MOMENTS))
def test_the_table_names_optax_classes_and_their_fields(key):
  cls = _optax_class(key)
  declared = moments.declared_moments(cls)
  assert declared is moments.OPTAX_MOMENTS[key]
  assert set(declared) <= set(cls._fields), (key, cls._fields)
  floors = moments.declared_min_bits(cls)
  assert set(floors) <= set(declared), (key, floors)
  assert set(floors.values()) <= {4, 8}


def test_every_floor_is_of_a_class_in_the_table():
  assert set(moments.OPTAX_MIN_BITS) <= set(moments.OPTAX_MOMENTS)


@pytest.mark.parametrize("key", sorted(moments.OPTAX_KEPT))
def test_kept_fields_are_optax_fields_and_no_moments(key):
  """A kept field (centred RMSProp's averages) names a field of optax's
  class, is no declared moment and gives its reason to every leaf below."""
  cls = _optax_class(key)
  kept = moments.declared_kept(cls)
  assert kept is moments.OPTAX_KEPT[key]
  assert set(kept) <= set(cls._fields), (key, cls._fields)
  assert not set(kept) & set(moments.declared_moments(cls) or {})
  state = cls(**{f: {"w": jnp.zeros((4, 8))} if f in kept else jnp.zeros((), jnp.int32)
                 for f in cls._fields})
  kinds = moments.leaf_kinds(state, {"w": jnp.zeros((4, 8))})
  assert [k.kept for k in kinds if k.field.split(".")[1] in kept] == list(kept.values())
  assert all(k.kind is None for k in kinds)


def _node_classes(node) -> set[str]:
  """The "module.QualifiedName" of every NamedTuple node in a pytree."""
  found = set()
  if isinstance(node, tuple) and hasattr(type(node), "_fields"):
    found.add(f"{type(node).__module__}.{type(node).__qualname__}")
  children = moments._children(node)  # the walk leaf_kinds makes
  if len(children) == 1 and children[0] is node:
    return found
  return found.union(*map(_node_classes, children))


def test_every_class_in_the_table_is_kept_by_a_catalogue_optax_build():
  params = {"w": jnp.zeros((32, 64)), "k": jnp.zeros((4, 16, 32)),
            "b": jnp.zeros((32,))}
  kept = set()
  for entry in catalogue.ENTRIES:
    if entry.oracle and entry.transformation:
      tx = catalogue.build(entry, optax)
      kept |= _node_classes(jax.eval_shape(tx.init, params))
  assert set(moments.OPTAX_MOMENTS) <= kept, sorted(
      set(moments.OPTAX_MOMENTS) - kept)


def test_optax_sm3_momentum_is_signed_and_its_covers_are_kept():
  params = {"w": jnp.ones((64, 128))}
  report = shardopt.describe_quantized_state(
      shardopt.quantized_state(optax.sm3(0.1)), params)
  stored = {l.path: l.stored for l in report.leaves}
  assert stored["[0].nu['w']"] == "companded-signed-8"
  assert stored["[0].mu['w'][0]"] == "float32"


class _Layer(NamedTuple):
  kernel: jax.Array
  bias: jax.Array


@moments.declare_moments(m=moments.SIGNED)
class _PerParamState(NamedTuple):
  m: jax.Array
  x: jax.Array


class _OuterState(NamedTuple):  # declares no moment
  acc: _Layer
  per_param: _Layer


@pytest.mark.parametrize("as_tuple", [False, True], ids=["dict", "NamedTuple"])
def test_a_params_namedtuple_is_a_container_not_a_state_class(as_tuple):
  """Below an undeclared field, the params' own NamedTuple keeps the
  field's name; a state class inside it (one per param) is still read."""
  kernel, bias = jnp.zeros((2, 3)), jnp.zeros((3,))
  params = _Layer(kernel, bias) if as_tuple else {"kernel": kernel,
                                                  "bias": bias}
  state = _OuterState(
      acc=params, per_param=jax.tree.map(lambda p: _PerParamState(p, p),
                                         params))
  acc = moments.LeafKind(None, "_OuterState.acc")
  m = moments.LeafKind(moments.SIGNED, "_PerParamState.m")
  x = moments.LeafKind(None, "_PerParamState.x")
  assert moments.leaf_kinds(state, params) == [acc, acc, m, x, m, x]


@moments.declare_moments(kept={"inner": "of another space"})
class _ProjectedState(NamedTuple):
  inner: _PerParamState
  m: jax.Array


def test_below_a_kept_field_no_leaf_is_a_moment_and_each_says_why():
  p = jnp.zeros((2, 3))
  state = _ProjectedState(inner=_PerParamState(p, p), m=p)
  kept = moments.LeafKind(None, "_ProjectedState.inner", 0, "of another space")
  assert moments.leaf_kinds(state, p) == [kept, kept, moments.LeafKind(None, "_ProjectedState.m")]
  with pytest.raises(ValueError, match="no field"):
    moments.declare_moments(kept={"missing": "why"})(_PerParamState)


def test_galores_projected_moments_are_kept_at_any_rank():
  # At a rank reaching the param's shorter side the projected moments have
  # the param's shape; they are still the projected gradient's, kept.
  params = {"h": jnp.ones((64, 64))}
  for rank in (2, 128):
    report = shardopt.describe_quantized_state(
        shardopt.quantized_state(shardopt.contrib.galore(1e-2, rank=rank), bits=4), params)
    base = [l for l in report.leaves if ".base_optimizer_state." in l.path]
    assert base and all(l.tile is None for l in base)
    assert all(l.reason == "moments of the projected gradient, not of the param"
               " (GaLoreState.base_optimizer_state)" for l in base), base
