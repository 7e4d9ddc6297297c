"""shardopt.contrib.muon: optax's numbers, and Muon sharded on a (2, 4) mesh.

Sharded (FSDP x TP matrices P('data', 'model') and P('model', 'data')):
the step on Auto and on Explicit mesh axes equals the unsharded step; the
momentum is laid out like its param (plan and addressable_shards); the
vector goes to the AdamW fallback. Communication: the compiled programs'
collectives (partitioning.collectives) against the gather-first baseline of
benchmarks/muon_communication.py.
"""

import jax
import jax.numpy as jnp
from jax._src.core import ShardingTypeError  # not public
from jax.sharding import AxisType
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P
import numpy as np
import optax
import pytest

from benchmarks import muon_communication
import shardopt
from tests import oracle

_VARIANTS = [
    {},
    {"nesterov": False, "adaptive": True},
    pytest.param({"preconditioning": "aol", "ns_coeffs": "dion"},
                 marks=pytest.mark.default_codegen),
    {"preconditioning": "schatten", "ns_steps": 3, "beta": 0.9,
     "consistent_rms": 0.2, "weight_decay": 0.1},
    {"preconditioning": "spectral", "adam_learning_rate": 0.01,
     "adam_weight_decay": 0.1, "mu_dtype": jnp.bfloat16},
    {"ns_steps": 0},  # no iteration: the preconditioned momentum
]


@pytest.mark.parametrize("kwargs", _VARIANTS, ids=str)
def test_muon_matches_optax(kwargs):
  oracle.assert_matches_optax(shardopt.contrib.muon(0.1, **kwargs),
                              optax.contrib.muon(0.1, **kwargs), steps=8)


# Injected, ns_steps is a traced hyperparameter under jit. Per-step (k, 3)
# coefficients are cut to ns_steps in init, which needs it concrete (in
# optax too): those run eagerly only.
@pytest.mark.parametrize("kwargs,jit", [
    (kwargs, jit) for kwargs in (
        {}, {"ns_steps": 3, "preconditioning": "aol"},
        {"ns_steps": 2, "preconditioning": "schatten"}, {"ns_steps": 0})
    for jit in (True, False)] + [({"ns_coeffs": "dion"}, False)], ids=str)
def test_injected_muon_matches_optax(kwargs, jit):
  oracle.assert_matches_optax(
      shardopt.inject_hyperparams(shardopt.contrib.muon)(0.1, **kwargs),
      optax.inject_hyperparams(optax.contrib.muon)(0.1, **kwargs),
      steps=6, jit=jit)


def test_injected_ns_steps_can_change_between_steps():
  # One compiled update; the count is read from the state at each call.
  params = {"w": jax.random.normal(jax.random.PRNGKey(0), (4, 6))}
  got, want = [], []
  for lib, found in ((shardopt, got), (optax, want)):
    tx = lib.inject_hyperparams(lib.contrib.muon)(0.1)
    update, state = jax.jit(tx.update), tx.init(params)
    for n in (5, 1, 3):
      state.hyperparams["ns_steps"] = jnp.asarray(n)
      updates, state = update(params, state, params)
      found.append(updates)
  for g, w in zip(got, want):
    oracle.assert_trees_close(g, w)
  assert not np.allclose(got[0]["w"], got[1]["w"])


def test_none_leaves_pass_through_as_in_optax():
  params = {"w": jnp.arange(6.0).reshape(3, 2) / 10, "b": jnp.ones(3),
            "frozen": None}
  grads = {"w": jnp.ones((3, 2)), "b": jnp.full(3, 0.5), "frozen": None}
  ours, theirs = shardopt.contrib.muon(0.1), optax.contrib.muon(0.1)
  ours_state, theirs_state = ours.init(params), theirs.init(params)
  for _ in range(2):
    got, ours_state = jax.jit(ours.update)(grads, ours_state, params)
    want, theirs_state = jax.jit(theirs.update)(grads, theirs_state, params)
    assert got["frozen"] is None
    oracle.assert_trees_close(got, want)


def test_scale_by_muon_keeps_none_leaves():
  # optax's scale_by_muon rejects them; ours gives optax's update of the rest.
  grads = {"w": jnp.arange(6.0).reshape(3, 2) / 10}
  ours = shardopt.contrib.scale_by_muon()
  got, _ = ours.update({**grads, "frozen": None},
                       ours.init({**grads, "frozen": None}))
  theirs = optax.contrib.scale_by_muon(
      weight_dimension_numbers={"w": optax.contrib.MuonDimensionNumbers()})
  want, _ = theirs.update(grads, theirs.init(grads))
  assert got["frozen"] is None
  oracle.assert_trees_close({"w": got["w"]}, want)


def _dims_for(lib):
  """3-D and 4-D params as stacks of matrices; vectors and scalars: None."""
  return lambda params: jax.tree.map(
      lambda p: lib.contrib.MuonDimensionNumbers(-2, -1) if p.ndim >= 2
      else None, params)


def test_weight_dimension_numbers_match_optax():
  oracle.assert_matches_optax(
      shardopt.contrib.muon(0.1, muon_weight_dimension_numbers=_dims_for(
          shardopt)),
      optax.contrib.muon(0.1, muon_weight_dimension_numbers=_dims_for(optax)),
      steps=8)


def test_orthogonalised_update_has_unit_singular_values():
  """Five quintic steps put every singular value of a Gaussian matrix's
  orthogonalised momentum within (0.5, 1.5), the band Jordan's coefficients
  are tuned for."""
  g = {"w": jax.random.normal(jax.random.PRNGKey(0), (8, 32))}
  tx = shardopt.contrib.scale_by_muon()
  update, _ = tx.update(g, tx.init(g))
  singular = np.linalg.svd(np.asarray(update["w"]), compute_uv=False)
  assert singular.min() > 0.5 and singular.max() < 1.5, singular


@pytest.mark.parametrize("kwargs,message", [
    ({"ns_coeffs": "polar"}, "preset"),
    ({"ns_coeffs": ((1.0, 2.0, 3.0),) * 6}, "at most ns_steps rows"),
    ({"ns_coeffs": (1.0, 2.0)}, "shape"),
])
def test_bad_coefficients_are_named(kwargs, message):
  with pytest.raises(ValueError, match=message):
    tx = shardopt.contrib.muon(0.1, **kwargs)
    tx.init({"w": jnp.ones((4, 6))})


def test_bad_dimension_numbers_are_named():
  dims = shardopt.contrib.MuonDimensionNumbers(0, 0)
  tx = shardopt.contrib.muon(0.1, muon_weight_dimension_numbers={"k": dims})
  params = {"k": jnp.ones((2, 3, 4))}
  with pytest.raises(ValueError, match="overlap"):
    tx.update(params, tx.init(params), params)


# --- sharded on the (2, 4) mesh ---------------------------------------------

_LAYOUT = {
    "fsdp_tp": ((16, 32), P("data", "model")),
    "tp_fsdp": ((32, 16), P("model", "data")),
    "bias": ((32,), P("model")),
}


def _mesh(kind):
  return jax.make_mesh((2, 4), ("data", "model"), axis_types=(kind,) * 2)


def _host_params():
  return {k: jax.random.normal(jax.random.PRNGKey(i), shape)
          for i, (k, (shape, _)) in enumerate(_LAYOUT.items())}


def _steps(tx, params, state, steps=3):
  """``steps`` jitted steps on the objective sum(p^2 / 2)."""

  @jax.jit
  def step(p, s):
    updates, s = tx.update(p, s, p)  # the gradient of sum(p^2 / 2) is p
    return shardopt.apply_updates(p, updates), s

  for _ in range(steps):
    params, state = step(params, state)
  return params, state


def _assert_close_to_leaf_scale(got, want, tol=1e-6):
  for (path, g), w in zip(jax.tree_util.tree_flatten_with_path(got)[0],
                          jax.tree.leaves(want)):
    g, w = np.asarray(g, np.float32), np.asarray(w, np.float32)
    np.testing.assert_allclose(g, w, rtol=tol, atol=tol * np.abs(w).max(),
                               err_msg=jax.tree_util.keystr(path))


@pytest.mark.parametrize("kind", [AxisType.Auto, AxisType.Explicit],
                         ids=["auto", "explicit"])
def test_sharded_muon_equals_unsharded(kind):
  mesh = _mesh(kind)
  tx = shardopt.contrib.muon(0.1)
  host = _host_params()
  shardings = {k: NamedSharding(mesh, spec) for k, (_, spec) in
               _LAYOUT.items()}
  plan = shardopt.plan_state_shardings(tx, host, shardings)
  params = jax.device_put(host, shardings)
  got = _steps(tx, params, shardopt.sharded_init(tx, shardings,
                                                 plan.shardings)(params))
  want = _steps(tx, host, tx.init(host))
  _assert_close_to_leaf_scale(got, want)
  for name, leaf in got[0].items():
    assert leaf.sharding.is_equivalent_to(shardings[name], leaf.ndim)


def test_optax_muon_fails_on_explicit_axes_where_ours_runs():
  """The README's claim: optax's Gram matmul over a sharded contraction is
  ambiguous on Explicit axes (jax.make_mesh's default)."""
  mesh = _mesh(AxisType.Explicit)
  params = {"w": jax.device_put(jnp.ones((16, 32)),
                                NamedSharding(mesh, P("data", "model")))}
  tx = optax.contrib.muon(0.1)
  with pytest.raises(ShardingTypeError):
    jax.jit(tx.update)(params, tx.init(params), params)


def test_momentum_follows_param_sharding_and_vectors_fall_back_to_adam():
  mesh = _mesh(AxisType.Auto)
  tx = shardopt.contrib.muon(0.1)
  host = _host_params()
  shardings = {k: NamedSharding(mesh, spec) for k, (_, spec) in
               _LAYOUT.items()}
  plan = shardopt.plan_state_shardings(tx, host, shardings)
  specs = {leaf.path: leaf.spec for leaf in plan.leaves}
  muon_mu = ".inner_states['muon'].inner_state[0].mu"
  assert specs[f"{muon_mu}['fsdp_tp']"] == P("data", "model")
  assert specs[f"{muon_mu}['tp_fsdp']"] == P("model", "data")
  assert not any(path.startswith(f"{muon_mu}['bias']") for path in specs)
  adam_moments = [p for p in specs if p.startswith(".inner_states['adam']")
                  and p.endswith("['bias']")]
  assert len(adam_moments) == 2  # AdamW's mu and nu, for the vector only
  assert all(specs[p] == P("model") for p in adam_moments)

  params = jax.device_put(host, shardings)
  state = shardopt.sharded_init(tx, shardings, plan.shardings)(params)
  momentum = state.inner_states["muon"].inner_state[0].mu["fsdp_tp"]
  assert {s.data.shape for s in momentum.addressable_shards} == {(8, 8)}
  assert len({s.device for s in momentum.addressable_shards}) == 8

  updates, _ = jax.jit(tx.update)(params, state, params)
  adamw = shardopt.adamw(0.1, eps=1e-8, weight_decay=0.0, nesterov=True)
  want, _ = adamw.update(host["bias"], adamw.init(host["bias"]), host["bias"])
  np.testing.assert_allclose(np.asarray(updates["bias"]), np.asarray(want),
                             rtol=1e-6)


# --- what the compiled step communicates ------------------------------------

def _explicit_sent_bytes(m, n, ns_steps=5, data=2, model=4) -> float:
  """Bytes one device sends in the Explicit program, m <= n, rows over
  'data', columns over 'model' (ring algorithms): one all-gather of the row
  blocks (result m x n / model), one all-reduce of the Frobenius norm's
  scalar and one of the (m, m) Gram matrix per iteration over 'model'."""
  all_reduce = lambda size: 2 * (model - 1) / model * 4 * size
  return ((data - 1) / data * 4 * m * n / model + all_reduce(1)
          + ns_steps * all_reduce(m * m))


@pytest.mark.parametrize("shape,spec", [
    ((64, 1024), P("data", "model")),
    ((128, 256), P("data", "model")),
    ((1024, 64), P("model", "data")),
], ids=["wide16", "wide2", "tall16"])
def test_communication_against_gather_first(shape, spec):
  """Measured on compiled HLO: the Explicit program sends exactly one row
  all-gather plus one (m, m) Gram all-reduce per iteration (and the norm's
  scalar); that is fewer bytes than gathering the whole matrix first only
  when the matrix is wide enough (n >= 10 m on this mesh), more otherwise.
  XLA's own partitioning (Auto) sends more than both but does the fewest
  FLOPs per device; both sharded programs do fewer FLOPs than gather-first."""
  runs = {name: muon_communication.Step(name, mesh, shape, spec)
          for name, mesh in muon_communication.meshes().items()}
  explicit, auto, gathered = (runs["explicit"], runs["auto"],
                              runs["gather-first"])
  m, n = sorted(shape)
  assert {k: v["count"] for k, v in explicit.summary.items()} == {
      "all-gather": 1, "all-reduce": 6}
  assert explicit.sent == pytest.approx(_explicit_sent_bytes(m, n))
  assert gathered.sent == pytest.approx(7 / 8 * 4 * m * n)
  assert (explicit.sent < gathered.sent) == (n >= 10 * m)
  assert explicit.sent < auto.sent
  assert auto.flops < explicit.flops < gathered.flops / 2
