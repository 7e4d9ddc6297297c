"""Shared checks of blocked matrix optimizers (Shampoo, SOAP) on the (2, 4) mesh.

A transformer-shaped tree laid out FSDP x TP (d_model over 'data'; vocab,
heads and mlp over 'model'; norms replicated), the state's bytes on each
device read from ``addressable_shards``, and the sharded step against the
unsharded one.
"""

import collections
import contextlib
import faulthandler
import warnings

import jax
import jax.numpy as jnp
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P
import numpy as np

import shardopt

D_MODEL, HEADS, HEAD_DIM, MLP, VOCAB = 64, 4, 16, 256, 256

_ATTN = {name: ((D_MODEL, HEADS, HEAD_DIM), P("data", "model", None))
         for name in ("query", "key", "value")}
LAYOUT = {
    "embed": ((VOCAB, D_MODEL), P("model", "data")),
    "layers_0": {
        "attn": {**_ATTN, "out": ((HEADS, HEAD_DIM, D_MODEL),
                                  P("model", None, "data"))},
        "mlp": {"wi": ((D_MODEL, MLP), P("data", "model")),
                "wo": ((MLP, D_MODEL), P("model", "data"))},
        "ln_1": ((D_MODEL,), P()), "ln_2": ((D_MODEL,), P()),
    },
    "ln_f": ((D_MODEL,), P()),
    "lm_head": ((D_MODEL, VOCAB), P("data", "model")),
}


@contextlib.contextmanager
def exit_after(seconds: float):
  """Ends the test process, printing every thread's stack, if the block runs
  longer than ``seconds``: per-block eigh on 8 simulated CPU devices has
  been seen to deadlock (JAX-NOTES), and a hang must fail, not stall CI."""
  faulthandler.dump_traceback_later(seconds, exit=True)
  try:
    yield
  finally:
    faulthandler.cancel_dump_traceback_later()


def _is_entry(x) -> bool:
  return isinstance(x, tuple) and len(x) == 2 and isinstance(x[1], P)


# Hand-checkable sizes for the NumPy references of tests/test_shampoo.py and
# tests/test_soap.py, with block_size=3: (4, 6) in blocks of (2, 3), (2, 4, 4)
# in blocks of (2, 2, 2), and (5, 8) in blocks of (3, 3) whose last ones are
# short (the optimizers zero-pad them to 3; the references cut them short).
# Every block's statistics have at most one zero eigenvalue at step 1, so
# each eigenbasis is unique up to signs.
SHAPES = {"w": (4, 6), "t": (2, 4, 4), "u": (5, 8), "v": (4,), "s": ()}
BLOCKS = {"w": (2, 3), "t": (2, 2, 2), "u": (3, 3)}
STEPS = 10


def blocks(shape, block):
  """(block index, slices of the param) of every block, the last ones along
  a dimension cut short at its end."""
  for idx in np.ndindex(*[-(-d // b) for d, b in zip(shape, block)]):
    yield idx, tuple(slice(i * b, min((i + 1) * b, d))
                     for i, b, d in zip(idx, block, shape))


def params_and_grads(seed: int = 0):
  """Float32 params of SHAPES and STEPS gradients, from a NumPy generator."""
  rng = np.random.default_rng(seed)
  params = {k: rng.standard_normal(s).astype(np.float32) for k, s in SHAPES.items()}
  grads = [{k: rng.standard_normal(s).astype(np.float32) for k, s in SHAPES.items()}
           for _ in range(STEPS)]
  return params, grads


def mode_product(x, m, i):
  """x x_i m: multiplies dimension i of x by the matrix m."""
  return np.moveaxis(np.tensordot(m, x, axes=(1, i)), 0, i)


def run_steps(tx, params, grads):
  """The updates of ``tx`` (update jitted) at each step of ``grads``."""
  state, params = tx.init(params), jax.tree.map(jnp.asarray, params)
  update = jax.jit(tx.update)
  history = []
  for g in grads:
    updates, state = update(g, state, params)
    params = shardopt.apply_updates(params, updates)
    history.append(updates)
  return history


def assert_steps_close(got, want, rtol):
  """Each step's updates within ``rtol`` of the reference's element plus
  ``rtol`` of the largest magnitude of its leaf at that step."""
  for step, (g, w) in enumerate(zip(got, want), start=1):
    for k in w:
      scale = float(np.max(np.abs(w[k]), initial=0.0))
      np.testing.assert_allclose(np.asarray(g[k]), w[k], rtol=rtol,
                                 atol=rtol * scale, err_msg=f"step {step} {k}")


def mesh():
  return jax.make_mesh((2, 4), ("data", "model"),
                       axis_types=(jax.sharding.AxisType.Auto,) * 2)


def transformer_params(the_mesh, seed: int = 0):
  """(params placed in their shardings, shardings) of the tree above."""
  shardings = jax.tree.map(lambda e: NamedSharding(the_mesh, e[1]), LAYOUT,
                           is_leaf=_is_entry)
  shapes = jax.tree.map(lambda e: e[0], LAYOUT, is_leaf=_is_entry)
  leaves, treedef = jax.tree.flatten(shapes, is_leaf=lambda x: isinstance(x, tuple))
  keys = jax.random.split(jax.random.PRNGKey(seed), len(leaves))
  params = jax.tree.unflatten(
      treedef, [0.1 * jax.random.normal(k, s) for k, s in zip(keys, leaves)])
  return jax.device_put(params, shardings), shardings


def plan_without_warnings(tx, params, shardings):
  """The state plan; any ``ReplicatedStateWarning`` fails the test."""
  with warnings.catch_warnings():
    warnings.simplefilter("error", shardopt.ReplicatedStateWarning)
    return shardopt.plan_state_shardings(tx, params, shardings)


def bytes_per_device(tree) -> dict:
  """Bytes of ``tree``'s arrays on each device, from their addressable shards."""
  per_device = collections.Counter()
  for leaf in jax.tree.leaves(tree):
    for shard in leaf.addressable_shards:
      per_device[shard.device] += shard.data.nbytes
  return per_device


def state_bytes_over_ideal(tx) -> tuple[float, int, int]:
  """(most bytes on a device / (total / devices), that most, the total) of
  ``tx``'s sharded state for the transformer tree."""
  the_mesh = mesh()
  params, shardings = transformer_params(the_mesh)
  plan = plan_without_warnings(tx, params, shardings)
  state = shardopt.sharded_init(tx, shardings, plan.shardings)(params)
  total = sum(leaf.nbytes for leaf in jax.tree.leaves(state))
  most = max(bytes_per_device(state).values())
  return most / (total / the_mesh.size), most, total


def assert_sharded_step_matches(tx, steps: int = 3, tol: float = 1e-5):
  """``steps`` sharded steps equal the unsharded ones on the transformer tree,
  each element within ``tol`` of its leaf's largest magnitude."""
  the_mesh = mesh()
  params, shardings = transformer_params(the_mesh)
  plan = plan_without_warnings(tx, params, shardings)
  opt = shardopt.make_sharded_optimizer(tx, params, shardings, donate=False)
  host = jax.device_get(params)
  sharded = (params, opt.init(params))
  plain = (host, jax.jit(tx.init)(host))
  update = jax.jit(tx.update)
  for step in range(steps):
    grads = jax.tree.map(lambda p, step=step: p * p - 0.01 * step + 0.02,
                         plain[0])
    sharded = opt.update(jax.device_put(grads, shardings), *sharded[::-1])
    updates, state = update(grads, plain[1], plain[0])
    plain = (shardopt.apply_updates(plain[0], updates), state)
  for leaf, expected in zip(jax.tree.leaves(sharded[1]),
                            jax.tree.leaves(plan.shardings)):
    assert leaf.sharding.is_equivalent_to(expected, leaf.ndim)
  for (path, got), want in zip(jax.tree_util.tree_flatten_with_path(sharded)[0],
                               jax.tree.leaves(plain)):
    want = np.asarray(want)
    np.testing.assert_allclose(
        np.asarray(got), want, rtol=tol,
        atol=tol * float(np.max(np.abs(want), initial=0.0)),
        err_msg=jax.tree_util.keystr(path))
