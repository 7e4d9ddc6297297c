"""low_precision_state over the whole catalogue, through the sharded step.

Every catalogue transformation but ``quantized_state`` (the harness's
sharded-step cases, its strict xfails kept), wrapped in
``low_precision_state(tx)`` (bfloat16), runs 5 sharded steps with ZeRO over
'data' on the catalogue params. Truths, none of them the wrapper:

1. dtypes: the rule of ``low_precision_state``'s module docstring (a floating
   leaf that derives from a param, below a field its state class declares a
   moment, is stored low; every other leaf as ``tx`` builds it), with
   "derives from a param" read from the float optimizer's public sharding
   plan (``opt.plan.leaves[i].param``), the declarations from
   ``shardopt._src.moments`` and every other dtype from
   ``jax.eval_shape(tx.init, params)``; after init and after each step;
2. where a leaf is stored low, each step's move of the params within
   ``_TOLERANCE`` (2%, mean relative error) of ``tx``'s with float state,
   unsharded (``test_quantized_state._float_moves``). Where none is, 1 shows
   the wrapper stores nothing otherwise (and the unsharded reference would
   not do: Polyak SGD's sharded float step was 5.8% off its unsharded one at
   the fifth step, where the harness compares three);
3. the state in the shardings the sharded optimizer derives, and its bytes on
   the most loaded device (``addressable_shards``) at most the float-state
   sharded optimizer's (read from its shardings).

Axis types alternate by entry index to keep CI time down: Auto for even
indices, Explicit for odd ones.
"""

import collections
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding

import shardopt
from shardopt._src import moments
from tests import blocked_layout
from tests import catalogue
from tests import test_harness as harness
from tests import test_quantized_state as quantized

# bfloat16 keeps 8 significant bits (a relative rounding of at most 2**-9 per
# stored value); 5 steps of rounded state stay well within 2% on average.
_TOLERANCE = 0.02


def _cases():
  """(entry, axis kind) per transformation but ``quantized_state``, the
  harness's sharded-step cases (its strict xfails kept), kinds alternating."""
  entries = [e for e in catalogue.ENTRIES if e.qualname != "quantized_state"]
  cases = []
  for index, case in enumerate(harness._cases("sharded_step", entries)):
    kind = ("auto", "explicit")[index % 2]
    cases.append(pytest.param(*case.values, kind, marks=case.marks,
                              id=f"{case.id}-{kind}"))
  return cases


def _sharded(tx, host, shardings):
  with warnings.catch_warnings():
    warnings.simplefilter("ignore", shardopt.ReplicatedStateWarning)
    return shardopt.make_sharded_optimizer(
        tx, host, shardings, shard_state_over="data", donate=False)


def _expected_dtypes(float_opt, tx, host):
  """Per leaf of ``tx``'s state: bfloat16 where the leaf is floating, the
  float optimizer's plan says it derives from a param and its state class
  declares it a moment, else ``tx``'s dtype."""
  state = jax.eval_shape(tx.init, host)
  plans = float_opt.plan.leaves
  assert [p.path for p in plans] == [
      jax.tree_util.keystr(k) for k, _ in jax.tree_util.tree_leaves_with_path(state)]
  return jax.tree.structure(state), [
      jnp.dtype(jnp.bfloat16)
      if (jnp.issubdtype(x.dtype, jnp.floating) and p.param is not None
          and kind.kind is not None)
      else x.dtype
      for x, p, kind in zip(jax.tree.leaves(state), plans,
                            moments.leaf_kinds(state, host))]


def _assert_dtypes(state, expected, when):
  treedef, dtypes = expected
  assert jax.tree.structure(state) == treedef, when
  got = [x.dtype for x in jax.tree.leaves(state)]
  wrong = [(jax.tree_util.keystr(k), g, w) for (k, _), g, w in zip(
      jax.tree_util.tree_leaves_with_path(state), got, dtypes) if g != w]
  assert not wrong, (when, wrong)


def _most_loaded_planned_bytes(opt, host) -> int:
  """The float optimizer's state bytes on its most loaded device, from its
  shardings and ``tx.init``'s shapes (no program)."""
  per_device = collections.Counter()
  for leaf, sharding in zip(jax.tree.leaves(jax.eval_shape(opt.tx.init, host)),
                            jax.tree.leaves(opt.state_shardings)):
    for device, index in sharding.devices_indices_map(leaf.shape).items():
      size = np.prod([len(range(*i.indices(n))) for i, n in zip(index, leaf.shape)])
      per_device[device] += int(size) * leaf.dtype.itemsize
  return max(per_device.values(), default=0)


@pytest.mark.parametrize("entry,kind", _cases())
def test_every_optimizer_runs_with_bfloat16_state(entry, kind):
  """Truths 1-3 of the module docstring."""
  tx = catalogue.build(entry)
  host = quantized._catalogue_params()
  mesh = quantized._mesh(kind=kind)
  shardings = {k: NamedSharding(mesh, spec)
               for k, (_, spec) in quantized._CATALOGUE_LAYOUT.items()}
  float_opt = _sharded(tx, host, shardings)
  expected = _expected_dtypes(float_opt, tx, host)
  opt = _sharded(shardopt.low_precision_state(tx), host, shardings)
  moves = []
  with jax.sharding.set_mesh(mesh):
    params = jax.device_put(host, shardings)
    state = opt.init(params)
    _assert_dtypes(state, expected, "init")
    before = quantized._host_vector(params)
    for step in range(quantized._STEPS):
      grads, extra = quantized._step_inputs(entry, params)
      params, state = opt.update(grads, state, params, **extra)
      _assert_dtypes(state, expected, f"step {step}")
      after = quantized._host_vector(params)
      moves.append(after - before)
      before = after
  for leaf, sharding in zip(jax.tree.leaves(state),
                            jax.tree.leaves(opt.state_shardings)):
    assert leaf.sharding.is_equivalent_to(sharding, leaf.ndim)
  low_bytes = max(blocked_layout.bytes_per_device(state).values(), default=0)
  float_bytes = _most_loaded_planned_bytes(float_opt, host)
  assert low_bytes <= float_bytes
  if jnp.dtype(jnp.bfloat16) in expected[1]:
    want = quantized._float_moves(entry, tx, host)
    errors = [quantized._relative_error(g, w) for g, w in zip(moves, want)]
    assert max(errors) <= _TOLERANCE, [f"{e:.3g}" for e in errors]
