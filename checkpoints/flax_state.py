"""Flax training states created directly sharded, ready to save and restore.

``create_train_state`` (linen) and ``create_nnx_optimizer`` (nnx) run the param
and optimizer-state initialisation inside one jit whose outputs land on the
given shardings, so no device ever holds the whole state. The optimizer-state
shardings come from ``shardopt.sharding.plan_state_shardings`` (ZeRO with
``shard_state_over``) unless given, and ``tx`` is laid out as the sharded step
lays it out (``shardopt.sharding.with_update_layout``): ``init`` traced on the
params typed in their update layout, as that derivation was, so state whose
shape follows its layout (8-bit blocks) comes out as derived, and ``update``
given gradients and params in that layout, its updates returned in the
params'.
"""

from typing import Any, Callable
import warnings

import jax
from flax import nnx
from flax.training import train_state
from jax.sharding import NamedSharding, PartitionSpec

import shardopt
from checkpoints import layout

__all__ = ["create_nnx_optimizer", "create_train_state", "nnx_checkpoint_state", "nnx_load_state",
           "nnx_tx"]


def _laid_out(tx, abstract_params, param_shardings, shard_state_over, given=None):
  """``tx`` laid out as the sharded step lays it out
  (``shardopt.sharding.with_update_layout``) and its state's shardings: ``given``,
  or derived. ``given`` shardings that are shardopt's ZeRO plan over a mesh axis
  (``shardopt.state_shardings(..., shard_state_over=axis)``) lay the update out
  as ``shard_state_over=axis`` does."""
  if shard_state_over is None and given is not None:
    shard_state_over = _zero_axis_of(tx, abstract_params, param_shardings, given)
  plan = shardopt.sharding.plan_state_shardings(tx, abstract_params, param_shardings,
                                                shard_state_over=shard_state_over)
  plan.warn_zero_skipped(stacklevel=3)
  laid_out = shardopt.sharding.with_update_layout(tx, param_shardings, plan.update_shardings)
  return laid_out, plan.shardings if given is None else given


def _zero_axis_of(tx, abstract_params, param_shardings, given):
  """The mesh axis whose ZeRO plan has ``given``'s specs, leaf for leaf; None
  for none (no ZeRO, or shardings of the caller's own design)."""
  specs = lambda shardings: [s.spec for s in jax.tree.leaves(shardings)]
  for axis in _replicated(param_shardings).mesh.axis_names:
    with warnings.catch_warnings():  # the plans tried are not the one used
      warnings.simplefilter("ignore", shardopt.ReplicatedStateWarning)
      plan = shardopt.sharding.plan_state_shardings(tx, abstract_params, param_shardings,
                                                    shard_state_over=axis)
    if specs(plan.shardings) == specs(given):
      return axis
  return None


def _replicated(param_shardings) -> NamedSharding:
  first = jax.tree.leaves(param_shardings)[0]
  return NamedSharding(first.mesh, PartitionSpec())


def create_train_state(apply_fn: Callable, init_params: Callable[[], Any], tx, param_shardings: Any, *,
                       opt_state_shardings: Any = None,
                       shard_state_over: str | None = None) -> train_state.TrainState:
  """A linen ``TrainState`` whose params and opt_state are created on their shardings.

  The state's ``tx`` is ``tx`` laid out as the sharded step lays it out
  (``shardopt.sharding.with_update_layout``): ``apply_gradients``, in the
  user's ``jit``, hands ``tx.update`` the gradients and params in their update
  layout and returns the new params in ``param_shardings``, on Auto and
  Explicit axes, with or without ZeRO.

  Args:
    apply_fn: the model's apply function (static in the state).
    init_params: ``() -> params``, e.g. ``lambda: model.init(rng, x)["params"]``;
      traced inside the jit, so params are never materialised unsharded.
    tx: the gradient transformation (a shardopt or optax one).
    param_shardings: a tree of ``NamedSharding`` matching the params.
    opt_state_shardings: the optimizer state's shardings; derived with
      ``shardopt.sharding.plan_state_shardings`` when None. Shardings that are
      its ZeRO plan over an axis (``shardopt.state_shardings(...,
      shard_state_over=axis)``) act as ``shard_state_over=axis``.
    shard_state_over: the ZeRO mesh axis (as in
      ``shardopt.make_sharded_optimizer``): the state of every large param
      split over it as well.
  """
  abstract_params = jax.eval_shape(init_params)
  laid_out_tx, opt_state_shardings = _laid_out(tx, abstract_params, param_shardings,
                                                shard_state_over, opt_state_shardings)

  def init():
    return train_state.TrainState.create(apply_fn=apply_fn, params=init_params(), tx=laid_out_tx)

  abstract = jax.eval_shape(init)
  shardings = abstract.replace(step=_replicated(param_shardings), params=param_shardings,
                               opt_state=opt_state_shardings)
  return jax.jit(init, out_shardings=shardings)()


def _lay_out_variables(tree, shardings: list, what: str) -> None:
  """Lays each ``nnx.Variable`` of ``tree`` out in its sharding, in place, in the tree's own
  order (``nnx.state(model)`` holds the model's own Variables; ``optimizer.opt_state`` keeps
  ``tx.init``'s structure, the order ``shardings`` are derived in, where ``nnx.state`` would
  sort a state's fields by name)."""
  variables = jax.tree.leaves(tree, is_leaf=lambda x: isinstance(x, nnx.Variable))
  if len(variables) != len(shardings):
    raise ValueError(f"{what}: {len(shardings)} shardings for {len(variables)} leaves; give one sharding per "
                     "leaf (the optimizer state's are derived for this tx when not given).")
  for variable, sharding in zip(variables, shardings):
    variable.set_value(shardopt.sharding.in_layout(variable.get_value(), sharding))  # Auto or Explicit


def nnx_tx(tx) -> shardopt.GradientTransformationExtraArgs:
  """``tx`` for ``nnx.Optimizer``: its ``init`` sees the params' arrays, not their Variables.

  ``nnx.Optimizer`` calls ``tx.init(nnx.state(model, wrt))``. A state built by mapping
  over those params puts each param's statistics in a copy of its ``nnx.Variable``, and
  a Variable holding a tree instead of an array (8-bit codes and scales, Shampoo's and
  SOAP's blocks, SM3's covers) comes back from the first ``update`` as a plain mapping
  (the transformations read either, ``shardopt/_src/state_structure.py``). Traced on the
  arrays, every state array gets its own Variable and the state keeps one structure from
  the start, the one ``nnx_checkpoint_state`` saves and a restore fills.
  ``create_nnx_optimizer`` applies it.
  """
  tx = shardopt.with_extra_args_support(tx)
  return shardopt.GradientTransformationExtraArgs(lambda params: tx.init(nnx.as_pure(params)),
                                                  tx.update)


def create_nnx_optimizer(model_fn: Callable[[], nnx.Module], tx, param_shardings: Any, *, wrt=nnx.Param,
                         opt_state_shardings: Any = None,
                         shard_state_over: str | None = None) -> tuple[nnx.Module, nnx.Optimizer]:
  """``(model, nnx.Optimizer)`` with params and optimizer state created on their shardings.

  ``param_shardings`` matches ``nnx.to_pure_dict(nnx.state(model, wrt))`` (or is
  that ``nnx.State``, e.g. from ``partitioning.specs_from_flax_metadata`` of the
  model's annotations); other model variables and the optimizer step are
  replicated. The model is created under the shardings' mesh (``jax.set_mesh``),
  as variables annotated with ``nnx.with_partitioning`` need. The optimizer state's
  shardings are those of ``tx.init`` on the pure-dict params, in leaf order;
  ``shard_state_over`` splits it over a ZeRO axis as ``create_train_state``
  does, and the optimizer's ``tx`` is laid out as there.
  """
  if isinstance(param_shardings, nnx.State):
    param_shardings = nnx.to_pure_dict(param_shardings)
  replicated = _replicated(param_shardings)
  # Under the mesh: variables annotated with nnx.with_partitioning, and an Explicit mesh's
  # layouts while tracing, need it.
  with jax.set_mesh(replicated.mesh):
    abstract_params = nnx.to_pure_dict(nnx.state(nnx.eval_shape(model_fn), wrt))
    laid_out_tx, opt_state_shardings = _laid_out(tx, abstract_params, param_shardings,
                                                  shard_state_over, opt_state_shardings)
    tx = nnx_tx(laid_out_tx)

    @nnx.jit
    def init():
      model = model_fn()
      _lay_out_variables(nnx.state(model, wrt), jax.tree.leaves(param_shardings), "params")
      rest = nnx.state(model, nnx.Not(wrt))
      _lay_out_variables(rest, [replicated] * len(jax.tree.leaves(rest)), "model variables")
      optimizer = nnx.Optimizer(model, tx, wrt=wrt)
      _lay_out_variables(optimizer.opt_state, jax.tree.leaves(opt_state_shardings), "optimizer state")
      _lay_out_variables(optimizer.step, [replicated], "optimizer step")
      return model, optimizer

    return init()


def nnx_checkpoint_state(model: nnx.Module, optimizer: nnx.Optimizer) -> dict:
  """``{"model": nnx.state(model), "optimizer": nnx.state(optimizer)}``: what to save.

  Restore into the same form built from a freshly created model and
  optimizer (or its ``nnx.eval_shape``), then ``nnx_load_state`` it back.
  Quantized optimizer state (kept whole by ``nnx_tx``) stays
  ``shardopt.QuantizedArray``s of its codes and scales, which ``nnx.state``
  would make plain mappings: restored onto a mesh with other blocks, or
  where the target keeps them in float (and float ones where it keeps
  codes), they are re-tiled (``checkpoints/retile.py``).
  """
  flat = jax.tree_util.tree_flatten_with_path(optimizer.opt_state, is_leaf=_is_quantized)[0]
  quantized = {layout.leaf_name(("opt_state", *path)): node for path, node in flat
               if _is_quantized(node)}
  return {"model": nnx.state(model),
          "optimizer": _with_quantized(nnx.state(optimizer), (), quantized)}


def _is_quantized(x) -> bool:
  return isinstance(x, shardopt.QuantizedArray)


def _with_quantized(node, path: tuple, quantized: dict):
  """``node`` (an ``nnx.State`` at ``path``) with the mapping at each leaf name of
  ``quantized`` replaced by a ``QuantizedArray`` of its codes' and scales' values."""
  like = quantized.get(layout.leaf_name(path))
  if like is not None:
    return shardopt.QuantizedArray(node["codes"].get_value(), node["scales"].get_value(),
                                   like.shape, like.bits, like.signed, like.code)
  if isinstance(node, nnx.State):
    return nnx.State({k: _with_quantized(v, path + (k,), quantized) for k, v in node.items()})
  return node


def _quantized_as_mappings(node):
  """Inverse of ``_with_quantized``: what ``nnx.update`` takes."""
  if _is_quantized(node):
    return nnx.State({"codes": node.codes, "scales": node.scales})
  if isinstance(node, nnx.State):
    return nnx.State({k: _quantized_as_mappings(v) for k, v in node.items()})
  return node


def nnx_load_state(model: nnx.Module, optimizer: nnx.Optimizer, state: dict) -> None:
  """Puts a restored ``nnx_checkpoint_state`` tree into ``model`` and ``optimizer`` in place."""
  nnx.update(model, state["model"])
  nnx.update(optimizer, _quantized_as_mappings(state["optimizer"]))
