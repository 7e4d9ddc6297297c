"""Restoring with a changed optimizer: everything but the optimizer state is read,
and the optimizer state is created fresh. Only done when asked for explicitly."""

from typing import Any

import jax

__all__ = ["OPTIMIZER_CHANGED", "fresh_opt_state", "is_optimizer_leaf", "split_optimizer"]

OPTIMIZER_CHANGED = ("error", "reinit")


def is_optimizer_leaf(name: str, opt_state_key: str) -> bool:
  """Whether a leaf name lies under a path component called ``opt_state_key``."""
  return opt_state_key in name.split(".")


def _can_init(target: Any, opt_state_key: str) -> bool:
  return getattr(target, "tx", None) is not None and hasattr(target, "params") and hasattr(target, opt_state_key)


def split_optimizer(target: Any, pairs: list, opt_state_key: str) -> tuple[list, list]:
  """``(optimizer pairs, other pairs)``; checks a fresh state can be had.

  A TrainState-like target (``tx``, ``params``) gets ``tx.init(params)``;
  any other target must hold concrete fresh optimizer-state arrays.
  """
  opt = [(n, x) for n, x in pairs if is_optimizer_leaf(n, opt_state_key)]
  rest = [(n, x) for n, x in pairs if not is_optimizer_leaf(n, opt_state_key)]
  if not opt:
    raise ValueError(f"optimizer_changed='reinit' but the target has no leaves under {opt_state_key!r}.")
  abstract = [n for n, x in opt if isinstance(x, jax.ShapeDtypeStruct)]
  if abstract and not _can_init(target, opt_state_key):
    raise ValueError(
        "optimizer_changed='reinit' needs a fresh optimizer state: give a target holding concrete "
        f"optimizer-state arrays (abstract here: {abstract[:3]}...), or a TrainState with its tx.")
  return opt, rest


def fresh_opt_state(state: Any, target: Any, opt_state_key: str) -> Any:
  """``state`` with its optimizer state created by ``target.tx.init`` from the restored params.

  The new state lands directly on the target's optimizer-state shardings.
  Targets without a ``tx`` already hold their fresh state and are returned as is.
  """
  if not _can_init(target, opt_state_key):
    return state
  shardings = jax.tree.map(lambda x: x.sharding, getattr(target, opt_state_key))
  new = jax.jit(target.tx.init, out_shardings=shardings)(state.params)
  return state.replace(**{opt_state_key: new})
