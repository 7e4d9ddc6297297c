"""The harness: every entry of tests/catalogue.py proven three ways.

(a) equal to optax's transformation of the same name, same arguments, on
    oracle.mixed_tree(): 20 steps jitted and 8 eager;
(b) its state shardings, derived on a (2, 4) ('data', 'model') mesh, leave no
    state leaf larger than its param's shard replicated while the param is
    sharded (and no mirror less sharded than its param);
(c) the sharded step equals the unsharded jitted step, over 3 steps from
    the same initial state, through ``opt.update`` and ``opt.train_step``,
    on Auto and on Explicit (2, 4) axes, each with and without ZeRO over
    'data', and with ZeRO on a mesh of both kinds ('data' Explicit, 'model'
    Auto): each element within 1e-5 of its value or of the largest
    magnitude in its leaf (sharded norms and sums add in another order, so
    an element that is a small difference of large terms may differ by more
    than 1e-5 of itself, but not of its leaf); the state ends in its planned
    shardings.

(d) with ZeRO over 'data' on that mesh, params replicated over 'data': the
    state's bytes on the most loaded device (read from its shards, equal to
    the plan's count) are at most 0.55x the plan's count without ZeRO (a
    count tests/test_step.py checks against the shards) for every entry
    whose state holds an array at least as large as a param, and every leaf
    >= min_shard_bytes that ZeRO
    left unsharded is listed in the plan with its reason and warned about.

(e) optax's own build of every entry that optax has, given to the sharded
    step with ZeRO over 'data', equals optax's unsharded jitted step as (c)
    does (``opt.update``, 3 steps, 1e-5 of the leaf), on Auto and Explicit
    axes.
(f) ``tx.update`` in a jitted step of the user's on arrays typed on
    Explicit (2, 4) axes, and on 'data' Explicit with 'model' Auto (the
    sharded step runs it with the axes Auto), equals the unsharded step as
    (c) does.

Known failures are listed, each with the exception it raises and its reason,
in EXCEPTIONS only; they run as strict xfails of exactly that exception, so an
exception that no longer fails, or fails otherwise, is reported. An entry that
is not a transformation (``Entry.transformation``) is checked by (b) and (d)
only.
"""

import importlib.util
import inspect
import pathlib
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P
from jax._src.core import ShardingTypeError  # not public; flatten's xfail

import shardopt
from tests import catalogue
from tests import oracle

# (label, check) -> (the exception the check raises for that entry, why);
# check is one of "optax", "sharding", "sharded_step", "zero",
# "optax_sharded_step", "explicit_typed".
_OPTAX_SM3_SCALARS = (
    "optax's SM3 raises IndexError on a scalar param (its per-axis covers of "
    "a 0-d param are an empty list) and oracle.mixed_tree() has one; "
    "tests/test_sm3.py compares with optax on that tree with the scalar as a "
    "(1,) vector")
_PER_EXAMPLE = (
    "its updates are per-example gradients (the batch on axis 0 of every "
    "leaf); the harness's gradients of oracle.mixed_tree share no batch "
    "axis, so per_example_global_norm_clip raises ValueError; "
    "tests/test_contrib_privacy.py proves it against optax on per-example "
    "gradients, and sharded over the batch equal to unsharded")
EXCEPTIONS: dict[tuple[str, str], str] = {
    **{(f"contrib.{name}", check): (ValueError, _PER_EXAMPLE)
       for name in ("differentially_private_aggregate", "dpsgd")
       for check in ("optax", "sharded_step", "optax_sharded_step",
                     "explicit_typed")},
    **{(name, check): (IndexError, _OPTAX_SM3_SCALARS)
       for name in ("scale_by_sm3", "sm3")
       for check in ("optax", "optax_sharded_step")},
    ("monitor", "optax_sharded_step"): (ValueError,
        "optax's monitor starts with no measurements (init: {}) and adds "
        "them at the first update, so its state changes structure, which a "
        "jitted step with fixed state shardings cannot return; shardopt's "
        "monitor keeps one structure from init on"),
    ("flatten", "optax_sharded_step"): (ShardingTypeError,
        "optax's flatten reshapes each param into a vector in init, which "
        "JAX's sharding types refuse for a split param while the state's "
        "layout is derived from init; shardopt's flatten says the "
        "vector's layout (replicated)"),
    ("flatten", "sharding"): (AssertionError,
        "flatten concatenates every param into one vector, so the inner "
        "state is laid out for that vector, not for any param: replicated. "
        "That is what flatten is (its docstring says to use it for small, "
        "unsharded trees); tests/test_flatten.py proves it against optax"),
    ("flatten", "zero"): (AssertionError,
        "flatten's state is one vector of all 16449 param elements: an odd "
        "length, so no dimension divides over 'data' and ZeRO cannot split "
        "it; the plan lists it with that reason and warns (checked by "
        "test_zero_lists_every_large_leaf_it_leaves_out)"),
}
# Checks that hold under XLA:CPU's default emitters only (conftest): L-BFGS
# matches optax to 1e-6 there; under the elemental emitter a last-bit
# difference in its two-loop recursion grows past that within 5 steps.
DEFAULT_CODEGEN = {("scale_by_lbfgs", "optax")}

_ROOT = pathlib.Path(__file__).resolve().parent.parent
_DOC = _ROOT / "docs" / "catalogue.md"
_RENDERER = _ROOT / "tools" / "render_catalogue.py"
_SHARDED_STEPS = 3
_STEP_TOLERANCE = 1e-5


def _cases(check, entries=catalogue.ENTRIES):
  cases = []
  for entry in entries:
    if check not in ("sharding", "zero", "zero_reasons") and not entry.transformation:
      continue
    raises, reason = EXCEPTIONS.get((entry.label, check), (None, ""))
    marks = ([pytest.mark.xfail(strict=True, raises=raises, reason=reason)]
             if raises else [])
    if (entry.label, check) in DEFAULT_CODEGEN:
      marks.append(pytest.mark.default_codegen)
    cases.append(pytest.param(entry, id=entry.label.replace(" (", ":")
                              .rstrip(")"), marks=marks))
  return cases


def _build(entry, lib=shardopt):
  return catalogue.build(entry, lib)


def _objective(params) -> jax.Array:
  """Bounded below, not quadratic: f = sum(p^2 / 4 + sin(3 p) / 10)."""
  return sum(jnp.sum(0.25 * p * p + 0.1 * jnp.sin(3.0 * p))
             for p in jax.tree.leaves(params))


def _objective_step(tx, entry):
  """``(params, state) -> (new_params, new_state, updates)``: one step on
  the objective's gradient, with the extra args the entry asks for."""

  def step(params, state):
    value, grad = jax.value_and_grad(_objective)(params)
    extra = {"value": value, "grad": grad, "value_fn": _objective,
             "obj_fn": _objective}
    kwargs = {name: extra[name] for name in entry.extra_args}
    direction = jax.tree.map(jnp.negative, grad) if entry.descent else grad
    updates, state = tx.update(direction, state, params, **kwargs)
    return shardopt.apply_updates(params, updates), state, updates

  return step


def _run_objective(tx, entry, params, steps, *, jit):
  step = _objective_step(tx, entry)
  step = jax.jit(step) if jit else step
  state = (jax.jit(tx.init) if jit else tx.init)(params)
  history = []
  for _ in range(steps):
    params, state, updates = step(params, state)
    history.append(updates)
  return history


# --- (a) equal to optax -----------------------------------------------------

# optax gives a scalar param a (1,) update here; shardopt keeps its shape.
_OPTAX_RESHAPES_SCALAR_UPDATES = {"scale_by_distance_over_gradients"}


@pytest.mark.parametrize("jit", [True, False], ids=["jit", "eager"])
@pytest.mark.parametrize(
    "entry", _cases("optax", [e for e in catalogue.ENTRIES if e.oracle]))
def test_matches_optax(entry, jit):
  # Eager runs op by op (seconds per step for the line searches); its steps
  # reach every entry's periodic branch (MultiSteps' k, lookahead's sync,
  # the plateau's patience), jit's 20 steps the longer horizon.
  steps = 20 if jit else 8
  ours, theirs = _build(entry), catalogue.build(entry, optax)
  if entry.name in _OPTAX_RESHAPES_SCALAR_UPDATES:
    theirs = oracle.updates_shaped_like_grads(theirs)
  if not entry.extra_args:
    oracle.assert_matches_optax(ours, theirs, steps=steps, jit=jit)
    return
  params = oracle.mixed_tree()
  got = _run_objective(ours, entry, params, steps, jit=jit)
  want = _run_objective(theirs, entry, params, steps, jit=jit)
  for step, (g, w) in enumerate(zip(got, want)):
    try:
      oracle.assert_trees_close(g, w)
    except AssertionError as err:
      raise AssertionError(f"step {step}: {err}") from None


def _state_classes(state) -> list[tuple[str, str, tuple[str, ...]]]:
  """``(path, class name, fields)`` of each NamedTuple node of ``state``."""
  nodes = []

  def visit(node, path):
    if isinstance(node, tuple) and hasattr(type(node), "_fields"):
      nodes.append((path, type(node).__name__, node._fields))
    children = jax.tree_util.tree_flatten_with_path(
        node, is_leaf=lambda x: x is not node)[0]
    for key, child in children:
      if child is not node:
        visit(child, path + jax.tree_util.keystr(key))

  visit(state, "")
  return nodes


@pytest.mark.parametrize(
    "entry", _cases("optax_classes", [e for e in catalogue.ENTRIES if e.oracle]))
def test_state_classes_are_optax_s(entry):
  """Users reach into the state by class and field (``state[0].mu``,
  ``isinstance``, ``tree_utils.tree_get``): every NamedTuple node has
  optax's class name and fields at optax's path."""
  params = oracle.mixed_tree()
  ours = _state_classes(jax.eval_shape(_build(entry).init, params))
  theirs = _state_classes(
      jax.eval_shape(catalogue.build(entry, optax).init, params))
  assert ours == theirs


# --- (b), (c) on the (2, 4) mesh --------------------------------------------

_LAYOUT = {  # param name -> (shape, spec); every dim divides the mesh
    "w": ((8, 16), P("data", "model")),
    "b": ((16,), P("model")),
    "k": ((4, 8, 16), P(None, "data", "model")),
    "s": ((), P()),
}


def _mesh():
  return jax.make_mesh((2, 4), ("data", "model"),
                       axis_types=(jax.sharding.AxisType.Auto,) * 2)


def _plan(tx, params, shardings):
  with warnings.catch_warnings():
    warnings.simplefilter("ignore", shardopt.ReplicatedStateWarning)
    return shardopt.plan_state_shardings(tx, params, shardings)


def _shard_size(shape, spec, mesh) -> int:
  return int(np.prod(NamedSharding(mesh, spec).shard_shape(shape)))


@pytest.mark.parametrize("entry", _cases("sharding"))
def test_state_follows_param_sharding(entry):
  tx = _build(entry)
  mesh = _mesh()
  params = {k: jax.ShapeDtypeStruct(s, jnp.float32) for k, (s, _) in
            _LAYOUT.items()}
  shardings = {k: NamedSharding(mesh, spec) for k, (_, spec) in
               _LAYOUT.items()}
  plan = _plan(tx, params, shardings)
  layout = {f"[{k!r}]": (s, spec) for k, (s, spec) in _LAYOUT.items()}
  largest_shard = max(_shard_size(s, spec, mesh) for s, spec in
                      _LAYOUT.values())
  problems = [f"{path}: less sharded than its param" for path in
              plan.under_sharded]
  for leaf in plan.leaves:
    size = int(np.prod(leaf.shape))
    if any(leaf.spec):
      continue
    if leaf.param is None:
      if size > largest_shard:
        problems.append(f"{leaf.path} {leaf.shape}: replicated, derives from"
                        f" no param, larger than any param shard")
      continue
    shape, spec = layout[leaf.param]
    if any(spec) and size > _shard_size(shape, spec, mesh):
      problems.append(f"{leaf.path} {leaf.shape}: replicated while params"
                      f"{leaf.param} is sharded {spec}")
  assert not problems, "\n".join(problems) + f"\n{plan}"


def _comparable(tree):
  """Floats as float32 numpy, PRNG keys as their raw data."""
  def convert(x):
    if jnp.issubdtype(x.dtype, jax.dtypes.prng_key):
      x = jax.random.key_data(x)
    x = np.asarray(jax.device_get(x))
    return x.astype(np.float32) if np.issubdtype(x.dtype, np.floating) else x
  return jax.tree.map(convert, tree)


# The matrix of (c): every entry on Auto and Explicit axes, with and without
# ZeRO over 'data', through ``opt.update`` and ``opt.train_step``. The
# params are those of _STEP_LAYOUT: one replicated over 'data' (ZeRO splits
# its dimension 0), one already split over it (FSDP: its state follows it),
# a vector with no free dimension, a rank-3 kernel, a scalar.
_STEP_LAYOUT = {
    "w": ((16, 32), P(None, "model")),
    "f": ((8, 16), P("data", "model")),
    "b": ((16,), P("model")),
    "k": ((4, 8, 16), P(None, None, "model")),
    "s": ((), P()),
}
# ZeRO splits the state of "w" and "k" (2 KiB each); "f" is FSDP already;
# statistics of a few floats (L-BFGS's weights) stay whole.
_STEP_MIN_SHARD_BYTES = 256
# Axis types of ('data', 'model') per mesh kind; "mixed": a value's type
# names its split over 'data' only.
_AXIS_TYPES = {"auto": (jax.sharding.AxisType.Auto,) * 2,
               "explicit": (jax.sharding.AxisType.Explicit,) * 2,
               "mixed": (jax.sharding.AxisType.Explicit,
                         jax.sharding.AxisType.Auto)}
_MESH_KINDS = ("auto", "explicit")


def _step_case_ids():
  """Auto and Explicit axes, each with and without ZeRO; the mixed mesh
  with ZeRO over its Explicit axis (the layouts of both kinds at once)."""
  return [pytest.param(kind, zero, id=f"{kind}{'-zero' if zero else ''}")
          for kind in _MESH_KINDS for zero in (False, True)] + [
              pytest.param("mixed", True, id="mixed-zero")]


def _step_params():
  keys = jax.random.split(jax.random.PRNGKey(7), len(_STEP_LAYOUT))
  return {name: jax.random.normal(key, shape) for key, (name, (shape, _)) in
          zip(keys, _STEP_LAYOUT.items())}


_VALUE_AND_GRAD = jax.jit(jax.value_and_grad(_objective))
_GRAD = jax.jit(jax.grad(_objective))


def _extra_args(entry, params):
  if not entry.extra_args:
    return {}
  value, grad = _VALUE_AND_GRAD(params)
  extra = {"value": value, "grad": grad, "value_fn": _objective,
           "obj_fn": _objective}
  return {name: extra[name] for name in entry.extra_args}


_REFERENCES: dict = {}


def _reference(entry, params, state, steps):
  """``(params, state)`` after ``steps`` unsharded jitted steps of the
  entry from ``(params, state)``; computed once per entry and initial state
  shapes (the sharded inits of one entry agree but for quantized blocks)."""
  key = (entry.label, str(jax.tree.structure(state)),
         tuple(np.shape(x) for x in jax.tree.leaves(state)))
  if key not in _REFERENCES:
    step = jax.jit(_objective_step(_build(entry), entry))
    for _ in range(steps):
      params, state, _ = step(params, state)
    _REFERENCES[key] = (params, state)
  return _REFERENCES[key]


def _objective_loss(params, batch):
  """The harness objective as a train_step loss (the batch is unused)."""
  del batch
  return _objective(params)


def _step_optimizer(tx, kind, zero):
  """``(mesh, param shardings, host params, sharded optimizer)`` of ``tx``
  on the (2, 4) mesh of axis type ``kind``, ZeRO over 'data' or not."""
  mesh = jax.make_mesh((2, 4), ("data", "model"),
                       axis_types=_AXIS_TYPES[kind])
  shardings = {k: NamedSharding(mesh, spec) for k, (_, spec) in
               _STEP_LAYOUT.items()}
  host = _step_params()
  with warnings.catch_warnings():
    warnings.simplefilter("ignore", shardopt.ReplicatedStateWarning)
    opt = shardopt.make_sharded_optimizer(
        tx, host, shardings, shard_state_over="data" if zero else None,
        min_shard_bytes=_STEP_MIN_SHARD_BYTES, donate=False)
  return mesh, shardings, host, opt


@pytest.mark.parametrize("kind,zero", _step_case_ids())
@pytest.mark.parametrize("entry", _cases("sharded_step"))
def test_sharded_step_matches_unsharded(entry, kind, zero):
  mesh, shardings, host, opt = _step_optimizer(_build(entry), kind, zero)
  with jax.sharding.set_mesh(mesh):
    params = jax.device_put(host, shardings)
    state = opt.init(params)
    want = _reference(entry, host, jax.device_get(state), _SHARDED_STEPS)
    through_update, through_train_step = (params, state), (params, state)
    train_step = opt.train_step(_objective_loss, extra_args=entry.extra_args)
    for _ in range(_SHARDED_STEPS):
      p, s = through_update
      g = _GRAD(p)
      g = jax.tree.map(jnp.negative, g) if entry.descent else g
      through_update = opt.update(g, s, p, **_extra_args(entry, p))
      if not entry.descent:
        through_train_step = train_step(*through_train_step, jnp.zeros(()))[:2]
  for leaf, expected in zip(jax.tree.leaves(through_update[1]),
                            jax.tree.leaves(opt.state_shardings)):
    assert leaf.sharding.is_equivalent_to(expected, leaf.ndim)
  _assert_close_to_leaf_scale(_comparable(through_update), _comparable(want),
                              _STEP_TOLERANCE)
  if not entry.descent:
    _assert_close_to_leaf_scale(_comparable(through_train_step),
                                _comparable(want), _STEP_TOLERANCE)


@pytest.mark.parametrize("kind", ["explicit", "mixed"])
@pytest.mark.parametrize("entry", _cases("explicit_typed"))
def test_update_on_arrays_typed_on_explicit_axes_matches_unsharded(entry, kind):
  """(f): ``tx.update`` in a ``jit`` of the user's (flax's
  ``TrainState.apply_gradients`` without ``with_update_layout``) on params,
  gradients and state typed on Explicit (2, 4) axes, or on 'data' Explicit
  and 'model' Auto, where the sharded step runs it with the axes Auto: 3
  steps equal the unsharded ones as in (c)."""
  mesh, shardings, host, opt = _step_optimizer(_build(entry), kind, zero=False)
  step = jax.jit(_objective_step(opt.tx, entry))
  with jax.sharding.set_mesh(mesh):
    params = jax.device_put(host, shardings)
    state = opt.init(params)
    want = _reference(entry, host, jax.device_get(state), _SHARDED_STEPS)
    for _ in range(_SHARDED_STEPS):
      params, state, _ = step(params, state)
  _assert_close_to_leaf_scale(_comparable((params, state)), _comparable(want),
                              _STEP_TOLERANCE)


@pytest.mark.parametrize("kind", _MESH_KINDS)
@pytest.mark.parametrize(
    "entry", _cases("optax_sharded_step",
                    [e for e in catalogue.ENTRIES if e.oracle]))
def test_optax_transformation_in_the_sharded_step(entry, kind):
  """(e): optax's own build of the entry, passed to the sharded step with
  ZeRO over 'data', equals optax's unsharded jitted step within 1e-5 over 3
  steps, on Auto and on Explicit axes (optax's code has no sharding types:
  a ``vdot`` or a matmul over a split dimension, an SVD)."""
  tx = catalogue.build(entry, optax)
  mesh, shardings, host, opt = _step_optimizer(tx, kind, zero=True)
  want, want_state = host, tx.init(host)
  step = jax.jit(_objective_step(tx, entry))
  with jax.sharding.set_mesh(mesh):
    params = jax.device_put(host, shardings)
    state = opt.init(params)
    for _ in range(_SHARDED_STEPS):
      g = _GRAD(params)
      g = jax.tree.map(jnp.negative, g) if entry.descent else g
      params, state = opt.update(g, state, params, **_extra_args(entry, params))
  for _ in range(_SHARDED_STEPS):
    want, want_state, _ = step(want, want_state)
  _assert_close_to_leaf_scale(_comparable((params, state)),
                              _comparable((want, want_state)),
                              _STEP_TOLERANCE)


def _assert_close_to_leaf_scale(got, want, tol=1e-6):
  assert jax.tree.structure(got) == jax.tree.structure(want)
  for (path, g), w in zip(jax.tree_util.tree_flatten_with_path(got)[0],
                          jax.tree.leaves(want)):
    scale = float(np.max(np.abs(w), initial=0.0)) if w.dtype.kind == "f" else 0
    np.testing.assert_allclose(g, w, rtol=tol, atol=tol * scale,
                               err_msg=jax.tree_util.keystr(path))


# --- (d) ZeRO over 'data' on the (2, 4) mesh --------------------------------

# Params replicated over 'data', two of them >= min_shard_bytes (32 KiB each).
_ZERO_LAYOUT = {
    "w": ((128, 64), P(None, "model")),
    "b": ((64,), P("model")),
    "k": ((4, 32, 64), P(None, None, "model")),
    "s": ((), P()),
}
_ZERO_RATIO = 0.55  # per-device state bytes with ZeRO / without, at most
_PARAM_SIZED = 128 * 64  # elements of the smallest param ZeRO may split


def _zero_plans(tx):
  """(params, shardings, plan without ZeRO, plan with ZeRO over 'data')."""
  mesh = _mesh()
  params = {k: jax.random.normal(jax.random.PRNGKey(i), s) for i, (k, (s, _))
            in enumerate(_ZERO_LAYOUT.items())}
  shardings = {k: NamedSharding(mesh, spec) for k, (_, spec) in
               _ZERO_LAYOUT.items()}
  params = jax.device_put(params, shardings)
  with warnings.catch_warnings():
    warnings.simplefilter("ignore", shardopt.ReplicatedStateWarning)
    plain = shardopt.plan_state_shardings(tx, params, shardings)
    zero = shardopt.plan_state_shardings(tx, params, shardings,
                                         shard_state_over="data")
  return params, shardings, plain, zero


def _held_bytes(tx, params, shardings, plan) -> int:
  """Bytes of the state on the most loaded device, from its shards."""
  state = shardopt.sharded_init(tx, shardings, plan.shardings)(params)
  held = {}
  for leaf in jax.tree.leaves(state):
    for shard in leaf.addressable_shards:
      held[shard.device] = held.get(shard.device, 0) + shard.data.nbytes
  return max(held.values(), default=0)


@pytest.mark.parametrize("entry", _cases("zero"))
def test_zero_shrinks_param_sized_state(entry):
  tx = _build(entry)
  params, shardings, plain, zero = _zero_plans(tx)
  without = plain.bytes_per_device  # == the resident bytes (test_step.py)
  with_zero = _held_bytes(tx, params, shardings, zero)
  assert with_zero == zero.bytes_per_device
  if any(np.prod(l.shape) >= _PARAM_SIZED for l in plain.leaves):
    assert with_zero <= _ZERO_RATIO * without, f"{with_zero} / {without}\n{zero}"
  else:
    assert with_zero <= without


@pytest.mark.parametrize("entry", _cases("zero_reasons"))
def test_zero_lists_every_large_leaf_it_leaves_out(entry):
  """No leaf >= min_shard_bytes is left unsharded over 'data' without a
  reason in the plan and a warning naming it."""
  tx = _build(entry)
  _, shardings, _, zero = _zero_plans(tx)
  skipped = {l.path for l in zero.zero_skipped}
  for leaf in zero.leaves:
    nbytes = int(np.prod(leaf.shape)) * leaf.dtype.itemsize
    if not leaf.shape or nbytes < zero.min_shard_bytes:
      # A small leaf is split only with the rest of its param's state.
      assert not leaf.zero.startswith("dim ") or leaf.param is not None, leaf
    elif "data" not in str(leaf.spec):
      assert leaf.path in skipped and leaf.zero.startswith("not sharded: ")
  with warnings.catch_warnings(record=True) as record:
    warnings.simplefilter("always", shardopt.ReplicatedStateWarning)
    shardopt.state_shardings(tx, jax.tree.map(
        lambda p: jax.ShapeDtypeStruct(p.shape, p.dtype), _zero_plans(tx)[0]),
        shardings, shard_state_over="data")
  warned = " ".join(str(w.message) for w in record
                    if "shard_state_over" in str(w.message))
  assert all(path in warned for path in skipped)


# --- the catalogue itself ---------------------------------------------------

def _returns_transformation(obj) -> bool:
  if not inspect.isfunction(obj):
    return False
  returned = inspect.signature(obj).return_annotation
  return "GradientTransformation" in str(returned)


def test_every_public_transformation_has_an_entry():
  named = {id(catalogue.constructor(e)) for e in catalogue.ENTRIES}
  public = {f"{prefix}{n}" for namespace, prefix in
            ((shardopt, ""), (shardopt.contrib, "contrib."))
            for n, obj in vars(namespace).items() if not n.startswith("_")
            and _returns_transformation(obj) and id(obj) not in named}
  assert not public, f"add an Entry to tests/catalogue.py for {public}"


def test_every_entry_is_implemented():
  missing = [e.label for e in catalogue.ENTRIES if not callable(
      catalogue.constructor(e))]
  assert not missing, f"in the catalogue but not in shardopt: {missing}"


def test_catalogue_doc_is_fresh():
  spec = importlib.util.spec_from_file_location("render_catalogue", _RENDERER)
  renderer = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(renderer)
  assert _DOC.read_text() == renderer.render(), (
      "docs/catalogue.md is stale: run "
      "`python tools/render_catalogue.py > docs/catalogue.md`")
