"""The catalogue: every public transformation and alias, in one list.

``ENTRIES`` names each public constructor with example arguments. The test
harness (tests/test_harness.py) proves every entry against optax and on a
sharded mesh, and tools/render_catalogue.py turns the list into the table of
docs/catalogue.md: the state each one keeps, how that state is sharded next
to a sharded param, and its reference. A new transformation is covered by
adding one ``Entry``. Regenerate the table with
``python tools/render_catalogue.py > docs/catalogue.md``.

Arguments that are themselves transformations or functions of the library
(an inner optimizer, a schedule) are written as ``Sub``/``Fn`` and built in
the library under test, so the same entry builds shardopt's transformation
and, for the oracle, optax's.
"""

import functools
from typing import Callable, NamedTuple

import jax
import jax.numpy as jnp

import shardopt

__all__ = ["ENTRIES", "Entry", "Fn", "Lib", "Sub", "build", "constructor"]


class Sub(NamedTuple):
  """``lib.<name>(**kwargs)``, built in the library under test."""

  name: str
  kwargs: dict = {}


class Fn(NamedTuple):
  """``lib.<name>`` (with ``kwargs`` bound), passed uncalled."""

  name: str
  kwargs: dict = {}


class Lib(NamedTuple):
  """``build(lib)``: an argument made from the library under test's own
  types (e.g. its ``contrib.MuonDimensionNumbers``)."""

  build: Callable


class Entry(NamedTuple):
  """One public constructor and the example arguments it is proven with.

  ``extra_args`` names the keyword arguments its update needs (``value``,
  ``grad``, ``value_fn`` or ``obj_fn``, the objective); ``finish`` turns the constructed
  object into the transformation (``MultiSteps``, ``inject_hyperparams``);
  ``oracle`` says whether optax has the same name and semantics;
  ``transformation`` is False for a constructor that is not an update rule
  (``measure_with_ema``: a measure for ``monitor``, whose updates are an EMA
  of a scalar), checked only for its state's sharding; ``descent`` that it
  expects a descent direction (``-grad``, as after
  ``sgd(1.0)``) rather than the gradient. ``namespace`` names the public
  sub-namespace that holds the constructor (``"contrib"``: ``lib.contrib``,
  in shardopt and optax alike); ``Sub``/``Fn`` arguments are always built
  from the top level.
  """

  name: str
  kwargs: dict = {}
  args: tuple = ()
  extra_args: tuple[str, ...] = ()
  finish: Callable | None = None
  oracle: bool = True
  variant: str = ""  # tells apart entries of one name
  descent: bool = False
  transformation: bool = True
  namespace: str = ""

  @property
  def qualname(self) -> str:
    """The name as written after ``lib.`` (``contrib.prodigy``)."""
    return f"{self.namespace}.{self.name}" if self.namespace else self.name

  @property
  def label(self) -> str:
    return f"{self.qualname} ({self.variant})" if self.variant else self.qualname


def _sum_of_squares(tree) -> jax.Array:
  return sum(jnp.sum(jnp.square(x)) for x in jax.tree.leaves(tree))


def _is_matrix(tree):
  return jax.tree.map(lambda x: jnp.ndim(x) >= 2, tree)


def _by_rank(tree):
  return jax.tree.map(lambda x: "matrix" if jnp.ndim(x) >= 2 else "other", tree)


def _every_other_step(step) -> jax.Array:
  return step % 2 == 0


def _double(updates, params=None):
  del params
  return jax.tree.map(lambda u: 2.0 * u, updates)


def _double_leaf(update, param=None):
  del param
  return 2.0 * update


def _decaying(count) -> jax.Array:
  return 0.1 / (1.0 + count)


def _muon_dims(lib):
  """updates -> the library's MuonDimensionNumbers() for every leaf."""
  dims = lib.contrib.MuonDimensionNumbers()
  return lambda updates: jax.tree.map(lambda _: dims, updates)


def _on_matrices(tx) -> shardopt.GradientTransformation:
  """``tx`` on the params of rank >= 2, the rest passed through."""
  return shardopt.partition({"matrix": tx, "other": shardopt.identity()},
                            _by_rank)


def _on_bfloat16_params(tx) -> shardopt.GradientTransformationExtraArgs:
  """``tx`` fed the harness's float32 params and gradients rounded to
  bfloat16, the params ``low_precision_params`` trains (its updates, exact
  moves of the bfloat16 params, are then applied to the float32 ones)."""
  to_bf16 = lambda tree: jax.tree.map(lambda x: x.astype(jnp.bfloat16), tree)

  def update_fn(updates, state, params=None, **extra_args):
    return tx.update(to_bf16(updates), state, to_bf16(params), **extra_args)

  return shardopt.GradientTransformationExtraArgs(
      lambda params: tx.init(to_bf16(params)), update_fn)


def _on_synced_params(lookahead_tx) -> shardopt.GradientTransformation:
  """A lookahead driven by plain params, its slow params equal to the fast
  ones at every step: the fast half of its updates. (tests/test_lookahead.py
  proves the pair with slow params of their own.)"""

  def update_fn(updates, state, params=None):
    pair, state = lookahead_tx.update(updates, state,
                                      shardopt.LookaheadParams.init_synced(params))
    return pair.fast, state

  return shardopt.GradientTransformation(lookahead_tx.init, update_fn)


_ADAM = Sub("scale_by_adam")
_SGD = Sub("sgd", {"learning_rate": 0.1})
_LINESEARCH = ("value", "grad", "value_fn")
_LR = {"learning_rate": 0.1}

ENTRIES: tuple[Entry, ...] = (
    # Building blocks (optax.transforms).
    Entry("identity"),
    Entry("set_to_zero"),
    Entry("stateless", {"f": _double}),
    Entry("stateless_with_tree_map", {"f": _double_leaf}),
    Entry("with_extra_args_support", {"tx": Sub("scale", {"step_size": 2.0})}),
    Entry("scale", {"step_size": -0.5}),
    Entry("scale_by_learning_rate", _LR),
    Entry("scale_by_schedule", {"step_size_fn": Sub(
        "exponential_decay", {"init_value": 1.0, "transition_steps": 3,
                              "decay_rate": 0.9})}),
    Entry("trace", {"decay": 0.9, "nesterov": True}),
    Entry("ema", {"decay": 0.8}),
    Entry("clip", {"max_delta": 0.3}),
    Entry("clip_by_block_rms", {"threshold": 0.3}),
    Entry("clip_by_global_norm", {"max_norm": 1.0}),
    Entry("adaptive_grad_clip", {"clipping": 0.1}),
    Entry("add_decayed_weights", {"weight_decay": 0.1, "mask": _is_matrix}),
    Entry("add_noise", {"eta": 0.01, "gamma": 0.55, "key": 3}),
    Entry("apply_every", {"k": 3}),
    Entry("centralize"),
    Entry("normalize_by_update_norm", {"scale_factor": 2.0}),
    Entry("keep_params_nonnegative"),
    Entry("zero_nans"),
    Entry("scale_by_adam", {"nesterov": True}),
    Entry("scale_by_radam"),
    Entry("scale_by_rms", {"decay": 0.9}),
    Entry("scale_by_stddev", {"decay": 0.9}),
    # initial_scale: at step 1 the bias-corrected variance is g**2 - g**2,
    # rounding noise that 1 / sqrt(.) turns into 7% between programs.
    Entry("scale_by_stddev", {"decay": 0.9, "bias_correction": True,
                              "initial_scale": 1.0}, variant="bias_correction"),
    Entry("scale_by_rss"),
    Entry("scale_by_adadelta"),
    Entry("scale_by_adan"),
    Entry("scale_by_adamax"),
    Entry("scale_by_amsgrad"),
    Entry("scale_by_belief"),
    Entry("scale_by_yogi"),
    Entry("scale_by_novograd"),
    Entry("scale_by_lion"),
    Entry("scale_by_sign"),
    Entry("scale_by_rprop", _LR),
    Entry("scale_by_sm3"),
    Entry("scale_by_factored_rms", {"min_dim_size_to_factor": 4}),
    Entry("scale_by_param_block_norm"),
    Entry("scale_by_param_block_rms"),
    Entry("scale_by_trust_ratio"),
    Entry("scale_by_optimistic_gradient"),
    Entry("scale_by_distance_over_gradients"),
    Entry("scale_by_polyak", extra_args=("value",)),
    Entry("scale_by_lbfgs", {"memory_size": 4}),
    Entry("scale_by_backtracking_linesearch", {"max_backtracking_steps": 15},
          extra_args=_LINESEARCH, descent=True),
    Entry("scale_by_zoom_linesearch", {"max_linesearch_steps": 15},
          extra_args=_LINESEARCH, descent=True),
    Entry("snapshot", {"measure_name": "sq_norm", "measure": _sum_of_squares}),
    Entry("measure_with_ema", {"measure": _sum_of_squares, "decay": 0.9},
          transformation=False),
    Entry("monitor", {"measures": {"sq_norm": _sum_of_squares, "ema": Sub(
        "measure_with_ema", {"measure": _sum_of_squares, "decay": 0.9})}}),
    # Combinators and wrappers, each with a small inner transformation.
    Entry("chain", args=(Sub("clip", {"max_delta": 1.0}), _ADAM)),
    Entry("named_chain", args=(("clip", Sub("clip", {"max_delta": 1.0})),
                               ("adam", _ADAM))),
    Entry("partition", {"transforms": {"matrix": _ADAM, "other": _SGD},
                        "param_labels": _by_rank}),
    Entry("multi_transform", {"transforms": {"matrix": _ADAM, "other": _SGD},
                              "param_labels": _by_rank}),
    Entry("masked", {"inner": _ADAM, "mask": _is_matrix}),
    Entry("freeze", {"mask": _is_matrix}),
    Entry("selective_transform", {"optimizer": _SGD, "freeze_mask": _is_matrix}),
    Entry("conditionally_mask", {"inner": _ADAM,
                                 "should_transform_fn": _every_other_step}),
    Entry("conditionally_transform", {
        "inner": _ADAM, "should_transform_fn": _every_other_step}),
    Entry("apply_if_finite", {"inner": _ADAM, "max_consecutive_errors": 2}),
    Entry("MultiSteps", {"opt": _ADAM, "every_k_schedule": 3},
          finish=lambda ms: ms.gradient_transformation()),
    Entry("MultiSteps", {"opt": _ADAM, "every_k_schedule": 2,
                         "should_skip_update_fn": Fn("skip_not_finite")},
          finish=lambda ms: ms.gradient_transformation(),
          variant="skip_not_finite"),
    Entry("MultiSteps", {"opt": _ADAM, "every_k_schedule": 2,
                         "should_skip_update_fn": Fn(
                             "skip_large_updates", {"max_squared_norm": 20.0})},
          finish=lambda ms: ms.gradient_transformation(),
          variant="skip_large_updates"),
    Entry("inject_hyperparams", {"inner_factory": Fn("adam")},
          finish=lambda factory: factory(learning_rate=0.1)),
    Entry("inject_stateful_hyperparams", {"inner_factory": Fn("adam")},
          finish=lambda factory: factory(learning_rate=_decaying)),
    Entry("flatten", {"inner": _ADAM}),
    Entry("lookahead", {"fast_optimizer": _ADAM, "sync_period": 2,
                        "slow_step_size": 0.5}, finish=_on_synced_params),
    Entry("low_precision_state", {"inner": _ADAM, "dtype": jnp.bfloat16},
          oracle=False),
    Entry("low_precision_params", {"inner": _ADAM, "correction_bits": 8},
          finish=_on_bfloat16_params, oracle=False),
    # Quantized moments of the harness's 512-element param: tiles of 16.
    Entry("quantized_state", {"inner": _ADAM, "bits": 8, "block_size": 16,
                              "min_size": 128}, oracle=False, variant="8-bit"),
    Entry("quantized_state", {"inner": _ADAM, "bits": 4, "block_size": 16,
                              "min_size": 128}, oracle=False, variant="4-bit"),
    *(Entry("quantized_state", {"inner": Sub("adamw", {
        "learning_rate": 0.1, "weight_decay": 0.01}), "bits": bits,
        "block_size": 16, "min_size": 128}, oracle=False,
            variant=f"adamw, {bits}-bit") for bits in (8, 4)),
    # Optimizers (optax's aliases).
    Entry("sgd", {"learning_rate": 0.1, "momentum": 0.9, "nesterov": True}),
    Entry("adam", _LR),
    Entry("adamw", {"learning_rate": 0.1, "weight_decay": 0.01}),
    Entry("nadam", _LR),
    Entry("nadamw", _LR),
    Entry("adamax", _LR),
    Entry("adamaxw", _LR),
    Entry("amsgrad", _LR),
    Entry("adabelief", _LR),
    Entry("adadelta", _LR),
    Entry("adan", _LR),
    Entry("adagrad", _LR),
    Entry("adafactor", {"learning_rate": 0.1, "min_dim_size_to_factor": 4}),
    Entry("lamb", _LR),
    Entry("lars", _LR),
    Entry("lion", _LR),
    Entry("novograd", _LR),
    Entry("radam", _LR),
    Entry("rmsprop", {"learning_rate": 0.1, "momentum": 0.9, "centered": True}),
    Entry("rprop", _LR),
    Entry("sm3", _LR),
    Entry("yogi", _LR),
    Entry("fromage", _LR),
    Entry("noisy_sgd", {"learning_rate": 0.1, "key": 5}),
    Entry("sign_sgd", _LR),
    Entry("signum", _LR),
    Entry("optimistic_gradient_descent", _LR),
    Entry("optimistic_adam", _LR),
    Entry("optimistic_adam_v2", _LR),
    Entry("polyak_sgd", extra_args=("value",)),
    Entry("lbfgs", {"memory_size": 4}, extra_args=_LINESEARCH),
    # trax's optimizers with trax's semantics: optax has no counterpart.
    Entry("trax_adam", oracle=False),
    Entry("trax_momentum", oracle=False),
    Entry("trax_rmsprop", oracle=False),
    Entry("trax_adafactor", oracle=False),
    Entry("trax_sm3", oracle=False),
    # optax.contrib, first half (shardopt.contrib).
    *(Entry(name, kwargs, namespace="contrib", extra_args=extra)
      for name, kwargs, extra in (
          ("scale_by_acprop", {}, ()),
          ("acprop", _LR, ()),
          ("scale_by_ademamix", {"b3": 0.99}, ()),
          ("ademamix", {"learning_rate": 0.1, "b3": 0.99}, ()),
          ("scale_by_simplified_ademamix", {"alpha": 2.0}, ()),
          ("simplified_ademamix", {"learning_rate": 0.1, "alpha": 2.0}, ()),
          ("scale_by_adopt", {"b2": 0.99}, ()),
          ("adopt", {"learning_rate": 0.1, "nesterov": True}, ()),
          ("scale_by_cocob", {}, ()),
          ("cocob", {"weight_decay": 0.01}, ()),
          ("dadapt_adamw", {"weight_decay": 0.01}, ()),
          ("dog", {"weight_decay": 0.01}, ()),
          ("dowg", {"weight_decay": 0.01}, ()),
          ("scale_by_madgrad", {"learning_rate": 0.1}, ()),
          ("madgrad", {"learning_rate": 0.1, "weight_decay": 0.01}, ()),
          ("mechanize", {"base_optimizer": _SGD}, ()),
          ("momo", {"learning_rate": 0.1, "adapt_lower_bound": True}, ("value",)),
          ("momo_adam", {"learning_rate": 0.1, "adapt_lower_bound": True},
           ("value",)),
          ("prodigy", {"weight_decay": 0.01}, ()),
      )),
    # optax.contrib, second half (shardopt.contrib).
    *(Entry(name, kwargs, namespace="contrib", extra_args=extra)
      for name, kwargs, extra in (
          ("muon", _LR, ()),
          ("galore", {"learning_rate": 0.1, "rank": 2, "update_proj_gap": 3},
           ()),
          ("scale_by_galore", {"rank": 2, "update_proj_gap": 3}, ()),
          ("sam", {"optimizer": _SGD, "adv_optimizer": Sub(
              "sgd", {"learning_rate": 0.05})}, ()),
          ("normalize", {}, ()),
          ("schedule_free", {"base_optimizer": Sub(
              "adam", {"learning_rate": 0.1, "b1": 0.0}),
                             "learning_rate": 0.1}, ()),
          ("schedule_free_adamw", {"learning_rate": 0.1, "warmup_steps": 3,
                                   "weight_decay": 0.01}, ()),
          ("schedule_free_sgd", {"learning_rate": 0.1, "weight_decay": 0.01},
           ()),
          ("sophia", {"learning_rate": 0.1, "update_interval": 2},
           ("obj_fn",)),
          ("hutchinson_estimator_diag_hessian", {}, ("obj_fn",)),
          ("split_real_and_imaginary", {"inner": _ADAM}, ()),
          ("differentially_private_aggregate", {
              "l2_norm_clip": 1.0, "noise_multiplier": 0.1, "key": 3}, ()),
          ("dpsgd", {"learning_rate": 0.1, "l2_norm_clip": 1.0,
                     "noise_multiplier": 0.1, "seed": 3, "momentum": 0.9}, ()),
          ("reduce_on_plateau", {"patience": 2, "rtol": 0.5, "cooldown": 1,
                                 "accumulation_size": 2}, ("value",)),
      )),
    Entry("scale_by_muon", {"weight_dimension_numbers": Lib(_muon_dims)},
          namespace="contrib", finish=_on_matrices),
    # Blocked Shampoo and SOAP (shardopt.contrib): optax has neither; each is
    # proven against a NumPy reference in tests/test_shampoo.py, test_soap.py.
    # Refreshes at steps 1 and 3 of the harness's sharded steps. Shampoo's
    # eps 1e-2: the harness computes the gradients inside the sharded and the
    # plain program, 1 ulp apart, and compares the states; an inverse root
    # moves its small eigenvalues' part by about (that rounding / eps) / 4,
    # so at eps 1e-4 the preconditioners of its 4 x 4 statistics were 3.4e-5
    # of their scale apart after 3 steps (default 1e-6: 1.4e-4 with the eigh
    # root on the CI machine's CPU, 7.6e-6 with the Newton root compiled at
    # LLVM's -O0). Given the same gradients, the steps are bit-equal on
    # any mesh (tests/test_blocked_any_mesh.py).
    *(Entry(name, {**kwargs, "block_size": 4, "precondition_frequency": 2},
            namespace="contrib", oracle=False, variant=variant)
      for name, kwargs, variant in (
          ("shampoo", {**_LR, "eps": 1e-2}, ""),
          ("scale_by_shampoo", {"eps": 1e-2}, ""),
          ("scale_by_shampoo", {"eps": 1e-2, "inverse_root_method": "newton",
                                "grafting": "adagrad"}, "newton, adagrad"),
          ("soap", _LR, ""),
          ("scale_by_soap", {}, ""),
      )),
)


def _resolve(value, lib):
  """``value`` with every ``Sub``/``Fn`` built from ``lib``."""
  if isinstance(value, Sub):
    return getattr(lib, value.name)(**_resolve(value.kwargs, lib))
  if isinstance(value, Fn):
    fn = getattr(lib, value.name)
    return functools.partial(fn, **value.kwargs) if value.kwargs else fn
  if isinstance(value, Lib):
    return value.build(lib)
  if isinstance(value, dict):
    return {k: _resolve(v, lib) for k, v in value.items()}
  if isinstance(value, (tuple, list)):
    return type(value)(_resolve(v, lib) for v in value)
  return value


def constructor(entry: Entry, lib=None):
  """``lib.<namespace>.<name>`` of ``entry`` (default lib: shardopt), or
  None where ``lib`` lacks it."""
  lib = shardopt if lib is None else lib
  home = getattr(lib, entry.namespace, None) if entry.namespace else lib
  return getattr(home, entry.name, None)


def build(entry: Entry, lib=None):
  """The transformation of ``entry`` built from ``lib`` (default shardopt)."""
  lib = shardopt if lib is None else lib
  made = constructor(entry, lib)(*_resolve(entry.args, lib),
                                 **_resolve(entry.kwargs, lib))
  return entry.finish(made) if entry.finish else made
