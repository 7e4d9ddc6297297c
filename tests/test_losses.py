"""shardopt.losses against optax.losses: signatures, values and gradients
bit-equal under jit (incl. label smoothing, masks/``where``, axes and integer
labels), clear errors, and the cross-entropies on logits sharded over batch
('data') and vocabulary ('model') without gathering them."""

import inspect
import math
import re
import warnings

import jax
import jax.numpy as jnp
from jax._src.core import ShardingTypeError  # not public
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P
import numpy as np
import optax
import pytest

import shardopt
from shardopt import losses

_RTOL = 1e-6
_ATOL = 1e-6


def _normal(seed, shape, scale=1.0):
  return scale * jax.random.normal(jax.random.PRNGKey(seed), shape)


def _probs(seed, shape):
  return jax.nn.softmax(_normal(seed, shape, 2.0))


def _ints(seed, shape, high):
  return jax.random.randint(jax.random.PRNGKey(seed), shape, 0, high)


def _mask(seed, shape):
  return jax.random.bernoulli(jax.random.PRNGKey(seed), 0.7, shape)


_LOGITS = _normal(0, (4, 5, 7), 3.0)
_ONE_HOT = jax.nn.one_hot(_ints(1, (4, 5), 7), 7)
_SMOOTH = optax.losses.smooth_labels(_ONE_HOT, 0.1)
_MASK = _mask(2, (4, 5, 7)).at[..., 0].set(True)
_ROW_MASK = _mask(3, (4, 5))
_PRED, _TARGET = _normal(4, (6, 8)), _normal(5, (6, 8))
_SEG_LOGITS, _SEG_TARGETS = _normal(6, (2, 4, 4, 3)), jax.nn.one_hot(
    _ints(7, (2, 4, 4), 3), 3)
_CTC_LOGITS = _normal(8, (2, 6, 5))
_CTC_LOGIT_PAD = jnp.array([[0.0] * 6, [0.0] * 4 + [1.0] * 2])
_CTC_LABELS = jnp.array([[1, 2, 2], [3, 1, 0]])
_CTC_LABEL_PAD = jnp.array([[0.0, 0.0, 0.0], [0.0, 0.0, 1.0]])

# (name, positional args, keyword args); the same call on both libraries.
CASES = [
    ("softmax_cross_entropy", (_LOGITS, _ONE_HOT), {}),
    ("softmax_cross_entropy", (_LOGITS, _SMOOTH), {}),
    ("softmax_cross_entropy", (_LOGITS, _SMOOTH), {"where": _MASK}),
    ("softmax_cross_entropy", (_LOGITS, _probs(9, (4, 5, 7))), {"axis": 1}),
    ("softmax_cross_entropy", (_LOGITS, _probs(9, (4, 5, 7))),
     {"axis": (1, 2)}),
    ("softmax_cross_entropy_with_integer_labels",
     (_LOGITS, _ints(1, (4, 5), 7)), {}),
    ("softmax_cross_entropy_with_integer_labels",
     (_LOGITS, _ints(1, (4, 5), 7)), {"where": _MASK}),
    ("softmax_cross_entropy_with_integer_labels",
     (_LOGITS, _ints(1, (4, 7), 5)), {"axis": 1}),
    ("softmax_cross_entropy_with_integer_labels",
     (_LOGITS, _ints(1, (4,), 35)), {"axis": (1, 2)}),
    ("softmax_cross_entropy_with_integer_labels",
     (_LOGITS, _ints(1, (4,), 35)), {"axis": (1, 2), "where": _MASK}),
    ("safe_softmax_cross_entropy",
     (_LOGITS.at[..., 3].set(-jnp.inf), _ONE_HOT.at[..., 3].set(0.0)), {}),
    ("sigmoid_binary_cross_entropy", (_PRED, (_TARGET > 0).astype(int)), {}),
    ("sigmoid_focal_loss", (_PRED, (_TARGET > 0).astype(int)), {}),
    ("sigmoid_focal_loss", (_PRED, jax.nn.sigmoid(_TARGET)),
     {"alpha": 0.25, "gamma": 1.5}),
    ("poly_loss_cross_entropy", (_LOGITS, _SMOOTH), {"epsilon": 1.5}),
    ("poly_loss_cross_entropy", (_LOGITS, _SMOOTH), {"where": _MASK}),
    ("kl_divergence", (jax.nn.log_softmax(_LOGITS), _probs(9, (4, 5, 7))), {}),
    ("kl_divergence", (jax.nn.log_softmax(_LOGITS), _ONE_HOT),
     {"where": _MASK}),
    ("kl_divergence_with_log_targets",
     (jax.nn.log_softmax(_LOGITS), jnp.log(_probs(9, (4, 5, 7)))),
     {"axis": (1, 2)}),
    ("generalized_kl_divergence",
     (0.3 * _LOGITS, _probs(9, (4, 5, 7))), {"where": _MASK}),
    ("convex_kl_divergence", (0.3 * _LOGITS, _probs(9, (4, 5, 7))), {}),
    ("squared_error", (_PRED, _TARGET), {}),
    ("squared_error", (_PRED,), {}),
    ("l2_loss", (_PRED, _TARGET), {}),
    ("huber_loss", (_PRED, _TARGET), {"delta": 0.5}),
    ("log_cosh", (10 * _PRED, _TARGET), {}),
    ("cosine_similarity", (_PRED, _TARGET), {"epsilon": 1e-3}),
    ("cosine_similarity", (_PRED, _TARGET), {"where": _mask(10, (6, 8))}),
    ("cosine_distance", (_PRED, _TARGET), {"axis": 0}),
    ("smooth_labels", (_ONE_HOT, 0.2), {}),
    ("smooth_labels", (_ONE_HOT, 0.2), {"where": _MASK}),
    ("smooth_labels", (_ONE_HOT, 0.2), {"axis": (1, 2)}),
    ("hinge_loss", (_PRED, jnp.sign(_TARGET)), {}),
    ("perceptron_loss", (_PRED, jnp.sign(_TARGET)), {}),
    ("sparsemax_loss", (_PRED, (_TARGET > 0).astype(int)), {}),
    ("multiclass_hinge_loss", (_PRED, _ints(11, (6,), 8)), {}),
    ("multiclass_perceptron_loss", (_PRED, _ints(11, (6,), 8)), {}),
    ("multiclass_sparsemax_loss", (_PRED, _ints(11, (6,), 8)), {}),
    ("ranking_softmax_loss", (_PRED, _ints(12, (6, 8), 3)), {}),
    ("ranking_softmax_loss", (_PRED, _ints(12, (6, 8), 3)),
     {"where": _mask(13, (6, 8)).at[0].set(False), "weights": _PRED**2,
      "reduce_fn": None}),
    ("ranking_softmax_loss", (_PRED, _ints(12, (6, 8), 3)),
     {"where": _mask(13, (6, 8)).at[0].set(False), "reduce_fn": jnp.sum}),
    ("ntxent", (_PRED, jnp.array([0, 0, 1, 1, 2, 2])), {"temperature": 0.5}),
    ("triplet_margin_loss", (_PRED, _TARGET, _normal(14, (6, 8))), {}),
    ("triplet_margin_loss", (_PRED, _TARGET, _normal(14, (6, 8))),
     {"axis": 0, "norm_degree": 1, "margin": 2.0}),
    ("dice_loss", (_SEG_LOGITS, _SEG_TARGETS), {}),
    ("dice_loss", (_SEG_LOGITS, _SEG_TARGETS),
     {"class_weights": jnp.array([0.2, 1.0, 2.0]), "alpha": 0.3, "beta": 0.7,
      "reduction": "sum", "ignore_background": True}),
    ("dice_loss", (jax.nn.softmax(_SEG_LOGITS), _SEG_TARGETS),
     {"apply_softmax": False, "reduction": "none", "axis": (1,)}),
    ("multiclass_generalized_dice_loss", (_SEG_LOGITS, _SEG_TARGETS), {}),
    ("binary_dice_loss", (_SEG_LOGITS[..., 0], _SEG_TARGETS[..., 0]), {}),
    ("ctc_loss", (_CTC_LOGITS, _CTC_LOGIT_PAD, _CTC_LABELS, _CTC_LABEL_PAD),
     {}),
    ("ctc_loss_with_forward_probs",
     (_CTC_LOGITS, _CTC_LOGIT_PAD, _CTC_LABELS, _CTC_LABEL_PAD),
     {"blank_id": 4}),
]


def _call(lib, name, args, kwargs):
  with warnings.catch_warnings():
    warnings.simplefilter("ignore", DeprecationWarning)
    return getattr(lib, name)(*args, **kwargs)


def _assert_close(got, want):
  assert jax.tree.structure(got) == jax.tree.structure(want)
  for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
    assert g.shape == w.shape and g.dtype == w.dtype
    np.testing.assert_allclose(g, w, rtol=_RTOL, atol=_ATOL)


def test_fenchel_young_matches_optax():
  ours = losses.make_fenchel_young_loss(jax.nn.logsumexp)
  theirs = optax.losses.make_fenchel_young_loss(jax.nn.logsumexp)
  _assert_close(ours(_LOGITS, _SMOOTH), theirs(_LOGITS, _SMOOTH))
  # With logsumexp it is the softmax cross-entropy of normalised labels.
  _assert_close(ours(_LOGITS, _SMOOTH),
                optax.losses.softmax_cross_entropy(_LOGITS, _SMOOTH))


def test_signatures_match_optax():
  def params(fn):
    return [(p.name, p.kind, p.default)
            for p in inspect.signature(fn).parameters.values()]
  different = [n for n in losses.__all__
               if params(getattr(losses, n)) != params(getattr(optax.losses, n))]
  assert not different


def test_top_level_reexports_where_optax_does():
  names = set(losses.__all__) & set(dir(optax))
  assert "softmax_cross_entropy_with_integer_labels" in names
  assert "l2_loss" in names
  missing = [n for n in names
             if getattr(shardopt, n, None) is not getattr(losses, n)]
  assert not missing


def test_deprecated_name_warns():
  with pytest.warns(DeprecationWarning, match="generalized_kl_divergence"):
    losses.convex_kl_divergence(_LOGITS, _probs(9, (4, 5, 7)))


@pytest.mark.parametrize("call,error,words", [
    (lambda: losses.softmax_cross_entropy_with_integer_labels(
        _LOGITS, _ONE_HOT), TypeError, "labels must hold integer"),
    (lambda: losses.softmax_cross_entropy(_ints(0, (3, 4), 2), _ONE_HOT[0, :3]),
     TypeError, "logits must have a floating dtype"),
    (lambda: losses.squared_error(_PRED, _TARGET[:3]), ValueError,
     "predictions and targets must have the same shape"),
    (lambda: losses.ctc_loss(_CTC_LOGITS[0], _CTC_LOGIT_PAD, _CTC_LABELS,
                             _CTC_LABEL_PAD), ValueError,
     "logits must have rank 3"),
    (lambda: losses.dice_loss(_SEG_LOGITS, _SEG_TARGETS, apply_softmax=False),
     ValueError, "valid probability distributions.*apply_softmax=True"),
])
def test_bad_input_names_the_argument(call, error, words):
  with pytest.raises(error, match=words):
    call()


# --- sharded: batch over 'data', vocabulary over 'model' -------------------

_BATCH, _VOCAB = 16, 512


def _sharded_batch(axis_type=jax.sharding.AxisType.Auto):
  mesh = jax.make_mesh((2, 4), ("data", "model"), axis_types=(axis_type,) * 2)
  logits = jax.device_put(_normal(20, (_BATCH, _VOCAB), 3.0),
                          NamedSharding(mesh, P("data", "model")))
  labels = _ints(21, (_BATCH,), _VOCAB)
  one_hot = jax.nn.one_hot(labels, _VOCAB)
  soft = optax.losses.smooth_labels(one_hot, 0.1)
  return (mesh, logits, jax.device_put(labels, NamedSharding(mesh, P("data"))),
          jax.device_put(soft, NamedSharding(mesh, P("data", "model"))))


_SHARDED = {
    "softmax_cross_entropy_with_integer_labels": lambda lo, la, so: (
        losses.softmax_cross_entropy_with_integer_labels(lo, la)),
    "softmax_cross_entropy": lambda lo, la, so: (
        losses.softmax_cross_entropy(lo, so)),
    "safe_softmax_cross_entropy": lambda lo, la, so: (
        losses.safe_softmax_cross_entropy(lo, so)),
    "poly_loss_cross_entropy": lambda lo, la, so: (
        losses.poly_loss_cross_entropy(lo, so)),
}


@pytest.mark.parametrize("axis_type", [jax.sharding.AxisType.Auto, jax.sharding.AxisType.Explicit])
@pytest.mark.parametrize("name", list(_SHARDED))
def test_cross_entropy_on_sharded_vocabulary_gathers_no_logits(name, axis_type):
  """On Auto axes and on Explicit ones (where optax's integer-label loss raises
  ShardingTypeError: a gather along the sharded vocabulary)."""
  mesh, logits, labels, soft = _sharded_batch(axis_type)
  loss = jax.jit(_SHARDED[name],
                 out_shardings=NamedSharding(mesh, P("data")))
  hlo = loss.lower(logits, labels, soft).compile().as_text()
  kinds = set(re.findall(r" (all-reduce|all-gather|all-to-all|reduce-scatter|"
                         r"collective-permute)(?:-start)?\(", hlo))
  assert kinds == {"all-reduce"}, kinds
  # Every array all-reduced holds at most this device's examples (one value
  # each: the vocabulary reduced away), never a (batch, vocab) block.
  reduced = [math.prod(int(d) for d in dims.split(",") if d)
             for line in hlo.splitlines() if " all-reduce(" in line
             for dims in re.findall(r"\w+\[([\d,]*)\]",
                                    line.split(" all-reduce(")[0])]
  assert reduced and max(reduced) <= _BATCH // 2, reduced
  got = loss(logits, labels, soft)
  host = [jax.device_get(x) for x in (logits, labels, soft)]
  np.testing.assert_allclose(got, _SHARDED[name](*host), rtol=_RTOL,
                             atol=_ATOL)
  reference = lambda lo: getattr(optax.losses, name)(lo, host[1] if "integer" in name else host[2])
  np.testing.assert_allclose(got, reference(host[0]), rtol=1e-5, atol=1e-5)
  grads = jax.jit(jax.grad(lambda lo: jnp.sum(_SHARDED[name](lo, labels, soft))))(logits)
  np.testing.assert_allclose(grads, jax.grad(lambda lo: jnp.sum(reference(lo)))(host[0]),
                             rtol=1e-5, atol=1e-6)


def test_optax_integer_label_loss_fails_on_explicit_axes_where_ours_runs():
  """The README's claim: optax's label gather along the vocabulary split over Explicit axes has
  no sharding rule; shardopt's masked sum runs (the test above checks its values)."""
  _, logits, labels, _ = _sharded_batch(jax.sharding.AxisType.Explicit)
  with pytest.raises(ShardingTypeError):
    jax.jit(optax.losses.softmax_cross_entropy_with_integer_labels)(logits, labels)
  jax.jit(losses.softmax_cross_entropy_with_integer_labels)(logits, labels)


# --- bit-equal to optax under jit: values and gradients ---------------------

# More options than CASES covers, for the bit-for-bit comparison.
BITWISE_CASES = CASES + [
    ("sigmoid_binary_cross_entropy", (_PRED, jax.nn.sigmoid(_TARGET)), {}),
    ("sigmoid_focal_loss", (_PRED, (_TARGET > 0).astype(int)), {"alpha": 0.6}),
    ("poly_loss_cross_entropy", (_LOGITS, _SMOOTH), {"axis": (1, 2)}),
    ("softmax_cross_entropy", (_LOGITS, _SMOOTH), {"where": _ROW_MASK}),
    ("softmax_cross_entropy_with_integer_labels",
     (_LOGITS, _ints(1, (4, 5), 7)), {"where": _ROW_MASK}),
    ("kl_divergence_with_log_targets",
     (jax.nn.log_softmax(_LOGITS), jnp.log(_probs(9, (4, 5, 7)))),
     {"where": _MASK}),
    ("generalized_kl_divergence", (0.3 * _LOGITS, _probs(9, (4, 5, 7))),
     {"axis": (1, 2)}),
    ("l2_loss", (_PRED,), {}),
    ("huber_loss", (_PRED,), {}),
    ("log_cosh", (_PRED,), {}),
    ("cosine_distance", (_PRED, _TARGET),
     {"epsilon": 0.1, "where": _mask(10, (6, 8))}),
    ("smooth_labels", (_SMOOTH, 0.3), {"axis": 1, "where": _MASK}),
    ("ranking_softmax_loss", (_PRED, _ints(12, (6, 8), 3)),
     {"weights": _PRED**2}),
    ("multiclass_generalized_dice_loss", (_SEG_LOGITS, _SEG_TARGETS),
     {"ignore_background": True, "smooth": 0.5}),
    ("multiclass_generalized_dice_loss",
     (jax.nn.softmax(_SEG_LOGITS), _SEG_TARGETS), {"apply_softmax": False}),
    ("binary_dice_loss", (_SEG_LOGITS[..., 0], _SEG_TARGETS[..., 0]),
     {"smooth": 0.1}),
    ("dice_loss", (_SEG_LOGITS[..., :1], _SEG_TARGETS[..., :1]), {}),
    ("ctc_loss", (_CTC_LOGITS, _CTC_LOGIT_PAD, _CTC_LABELS, _CTC_LABEL_PAD),
     {"log_epsilon": -1e3}),
]


def _is_float(x):
  return jnp.issubdtype(jnp.asarray(x).dtype, jnp.floating)


def _jitted_value_and_grads(lib, name, args, kwargs):
  """The loss and, by its VJP with ones, the gradient of its sum with respect
  to each floating argument, in one jitted program. The dice losses check
  probabilities (``apply_softmax=False``) on concrete values, in optax too:
  those run eagerly, differentiated with respect to the targets only."""
  checked = not kwargs.get("apply_softmax", kwargs.get("apply_sigmoid", True))
  free = [i for i, a in enumerate(args) if _is_float(a) and not (checked and i == 0)]

  def loss(*xs):
    full = list(args)
    for i, x in zip(free, xs):
      full[i] = x
    return _call(lib, name, full, kwargs)

  def value_and_grads(*xs):
    value, vjp = jax.vjp(loss, *xs)
    return value, vjp(jax.tree.map(jnp.ones_like, value))

  run = value_and_grads if checked else jax.jit(value_and_grads)
  return run(*[args[i] for i in free])


def _assert_bit_equal(got, want):
  assert jax.tree.structure(got) == jax.tree.structure(want)
  for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
    assert g.dtype == w.dtype
    np.testing.assert_array_equal(g, w)


@pytest.mark.parametrize("name,args,kwargs", BITWISE_CASES,
                         ids=[f"{c[0]}-{i}" for i, c in enumerate(BITWISE_CASES)])
def test_values_and_gradients_bit_equal_to_optax_under_jit(name, args, kwargs):
  got = _jitted_value_and_grads(losses, name, args, kwargs)
  want = _jitted_value_and_grads(optax.losses, name, args, kwargs)
  _assert_bit_equal(got, want)


def test_fenchel_young_bit_equal_to_optax_under_jit():
  def value_and_grads(lib):
    loss = lib.make_fenchel_young_loss(jax.nn.logsumexp)
    def value_and_grads(x, y):
      value, vjp = jax.vjp(loss, x, y)
      return value, vjp(jnp.ones_like(value))
    return jax.jit(value_and_grads)(_LOGITS, _SMOOTH)
  _assert_bit_equal(value_and_grads(losses), value_and_grads(optax.losses))
