"""Stacked (scanned) layers: the stacked preset, the scanned demo model, and
Adafactor / SM3 state on stacked params, equal to optax and sharded."""

import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec as P
import numpy as np
import optax
import pytest

from launch.model import ModelConfig
from launch.model import Transformer
from launch.model import next_token_loss
import partitioning
import shardopt

STEPS = 5


def _stacked_shapes():
  return partitioning.decoder_param_shapes(64, 32, 2, 64, 4, stacked=True)


def test_stacked_preset_keeps_the_layer_dimension_unsharded():
  specs = partitioning.match_partition_rules(
      partitioning.decoder_rules("fsdp_tp", stacked=True), _stacked_shapes())
  layers = specs["layers"]
  assert layers["attn"]["query"]["kernel"] == P(None, "fsdp", "model", None)
  assert layers["attn"]["out"]["kernel"] == P(None, "model", None, "fsdp")
  assert layers["mlp"]["wi"]["kernel"] == P(None, "fsdp", "model")
  assert layers["mlp"]["wo"]["kernel"] == P(None, "model", "fsdp")
  assert layers["ln_1"]["scale"] == P(None, "fsdp")
  assert specs["embed"]["embedding"] == P("model", "fsdp")
  assert specs["ln_f"]["scale"] == P()
  tp = partitioning.match_partition_rules(
      partitioning.decoder_rules("tp", stacked=True), _stacked_shapes())
  assert tp["layers"]["ln_2"]["scale"] == P(None, None)
  mesh = partitioning.make_abstract_mesh({"fsdp": 2, "model": 4})
  partitioning.validate_specs(_stacked_shapes(), specs, mesh)


def test_scanned_model_computes_the_unrolled_models_loss():
  cfg = ModelConfig(vocab=64, d_model=16, heads=2, head_dim=8, mlp=32, layers=3)
  tokens = jax.random.randint(jax.random.PRNGKey(1), (2, 9), 0, 64)
  unrolled = Transformer(cfg)
  params = jax.jit(unrolled.init)(jax.random.PRNGKey(0), tokens[:, :-1])["params"]
  per_layer = [params.pop(f"layers_{i}") for i in range(cfg.layers)]
  stacked = dict(params, layers=jax.tree.map(lambda *x: jnp.stack(x), *per_layer))
  scanned = Transformer(ModelConfig(**{**cfg.__dict__, "scan_layers": True}))
  loss = lambda model: jax.jit(lambda p, t: next_token_loss(model, p, t))
  want = loss(unrolled)({**params, **{
      f"layers_{i}": p for i, p in enumerate(per_layer)}}, tokens)
  got = loss(scanned)(stacked, tokens)
  np.testing.assert_allclose(got, want, rtol=1e-5)
  shapes = jax.eval_shape(scanned.init, jax.random.PRNGKey(0), tokens)["params"]
  assert shapes["layers"]["attn"]["query"]["kernel"].shape == (3, 16, 2, 8)


def _grads(params, step):
  keys = jax.random.split(jax.random.PRNGKey(100 + step), len(jax.tree.leaves(params)))
  noise = jax.tree.unflatten(jax.tree.structure(params), [
      jax.random.normal(k, p.shape) for k, p in zip(keys, jax.tree.leaves(params))])
  return jax.tree.map(lambda p, n: 0.5 * p + 0.1 * n, params, noise)


@pytest.mark.parametrize("name", ["adafactor", "sm3"])
def test_factored_and_cover_state_on_stacked_params(name):
  kwargs = {"min_dim_size_to_factor": 8} if name == "adafactor" else {}
  shapes = _stacked_shapes()
  mesh = partitioning.make_mesh({"data": 2, "model": 4})
  specs = partitioning.match_partition_rules(
      partitioning.decoder_rules("tp", model_axis="model", stacked=True), shapes)
  shardings = partitioning.named_shardings(mesh, specs)
  keys = jax.random.split(jax.random.PRNGKey(0), len(jax.tree.leaves(shapes)))
  params = jax.tree.unflatten(jax.tree.structure(shapes), [
      jax.random.normal(k, s.shape) for k, s in zip(keys, jax.tree.leaves(shapes))])
  opt = shardopt.make_sharded_optimizer(
      getattr(shardopt, name)(1e-2, **kwargs), params, shardings,
      shard_state_over="data", min_shard_bytes=0)

  # Adafactor factors a stacked (L, d, f) kernel over its last two dims: one
  # (L, d) and one (L, f) statistic, the layer dim unsharded; SM3 keeps one
  # cover per dim.
  plan = {l.path: l for l in opt.plan.leaves}
  wi = [l for l in opt.plan.leaves if l.param == "['layers']['mlp']['wi']['kernel']"]
  if name == "adafactor":
    assert sorted(l.shape for l in wi if len(l.shape) == 2) == [(2, 32), (2, 64)]
  else:
    assert sorted(l.shape for l in wi if len(l.shape) == 1) == [(2,), (32,), (64,)]
  for leaf in wi:
    if len(leaf.shape) >= 2:
      assert leaf.spec[0] is None, leaf
    if np.prod(leaf.shape) >= 32:  # statistics, not (1,) placeholders
      assert leaf.device_bytes * 2 <= np.prod(leaf.shape) * 4, leaf
  assert any(l.zero.startswith("dim ") for l in wi), plan

  state = opt.init(jax.device_put(jax.tree.map(jnp.copy, params), shardings))
  got = jax.device_put(jax.tree.map(jnp.copy, params), shardings)
  reference = getattr(optax, name)(1e-2, **kwargs)
  want, want_state = params, reference.init(params)
  update = jax.jit(reference.update)
  for step in range(STEPS):
    got, state = opt.update(jax.device_put(_grads(params, step), shardings), state, got)
    updates, want_state = update(_grads(params, step), want_state, want)
    want = optax.apply_updates(want, updates)
  for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
    np.testing.assert_allclose(np.asarray(g), np.asarray(w), rtol=1e-5, atol=1e-6)
  for leaf, planned in zip(jax.tree.leaves(state), opt.plan.leaves):
    assert {s.data.nbytes for s in leaf.addressable_shards} == {planned.device_bytes}
