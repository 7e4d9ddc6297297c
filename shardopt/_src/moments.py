"""Which fields of an optimizer state are moments: declared, never guessed.

A *moment* is a running statistic of the gradients: Adam's first and second
moments, a momentum trace, Adagrad's sum of squares, and, not shaped like
their param, Adafactor's row and column statistics and SM3's covers.
Moments are what the state wrappers may store in fewer bits: block-wise
quantization (``quantized_state``: 8 or 4 bits, moments shaped like their
param) and ``low_precision_state`` (bfloat16, every moment). Everything
else a transformation keeps (iterates and copies of the params, previous
gradients, gradient accumulators, counters, preconditioner statistics,
quasi-Newton memory, line-search values) is stored as it is.

A transformation declares its moments next to its state class, with the
sign each one can take::

  @declare_moments(mu=SIGNED, nu=NONNEGATIVE)
  class ScaleByAdamState(NamedTuple):
    count: jax.Array
    mu: base.Updates
    nu: base.Updates

Every leaf below a declared field (the field holds a tree shaped like the
params) is that kind of moment. A field may also declare the fewest bits
that keep its optimizer's update accurate (``min_bits={"m": 8}``):
``quantized_state`` asked for fewer stores it at that width and reports
so. A field whose leaves must stay as they are declares why
(``kept={"mu": why}``), and ``quantized_state`` reports that reason: a
moment whose rounding its update amplifies (SOAP's ``mu``, centred
RMSProp's ``mu`` and ``nu``), or a field holding another transformation's
state whose moments are not of the params' elements (GaLore's Adam moments
of the projected gradient); nothing below such a field is a moment.
optax's own state classes, for optax transformations passed to shardopt's
wrappers, are declared in ``OPTAX_MOMENTS`` (their floors in
``OPTAX_MIN_BITS``, their kept fields in ``OPTAX_KEPT``), keyed by the
class's module and qualified name; a state class declared nowhere has no
moments. The decision depends on the state's classes and fields only,
never on the names of the params (a param named ``v`` is not a second
moment); a NamedTuple of a class the params' own tree uses is a container
of params, never a state class.
"""

from collections.abc import Callable
from collections.abc import Mapping
from typing import Any
from typing import NamedTuple

import jax

__all__ = [
    "CENTRED_RMS_KEPT",
    "NONNEGATIVE",
    "OPTAX_KEPT",
    "OPTAX_MIN_BITS",
    "OPTAX_MOMENTS",
    "SIGNED",
    "LeafKind",
    "declare_moments",
    "declared_kept",
    "declared_min_bits",
    "declared_moments",
    "leaf_kinds",
]

SIGNED = "signed"  # any sign: first moments, momentum traces
NONNEGATIVE = "nonnegative"  # never below zero: averages or sums of squares
_KINDS = (SIGNED, NONNEGATIVE)

_DECLARED: dict[type, Mapping[str, str]] = {}
_MIN_BITS: dict[type, Mapping[str, int]] = {}
_KEPT: dict[type, Mapping[str, str]] = {}

_ADAM = {"mu": SIGNED, "nu": NONNEGATIVE}
# Why centred RMSProp's averages stay in float (transforms/rms.py).
CENTRED_RMS_KEPT = ("kept in float: the update divides by sqrt(nu - mu**2), which "
                   "separately rounded codes make negative")
# optax 0.2.8's state classes: "module.QualifiedName" -> {field: kind}.
# Centred RMSProp's classes declare no moment but keep both averages
# (``OPTAX_KEPT``), as shardopt's own do.
OPTAX_MOMENTS: Mapping[str, Mapping[str, str]] = {
    "optax._src.transform.ScaleByAdamState": _ADAM,
    "optax._src.transform.ScaleByAmsgradState": {**_ADAM, "nu_max": NONNEGATIVE},
    "optax._src.transform.ScaleByBeliefState": _ADAM,
    "optax._src.transform.ScaleByNovogradState": _ADAM,
    "optax._src.transform.ScaleByRmsState": {"nu": NONNEGATIVE},
    "optax._src.transform.ScaleByRmsWithCountState": {"nu": NONNEGATIVE},
    "optax._src.transform.ScaleByRssState": {"sum_of_squares": NONNEGATIVE},
    "optax._src.transform.ScaleByLionState": {"mu": SIGNED},
    # mu: the per-axis covers (not shaped like the param); nu: the momentum.
    "optax._src.transform.ScaleBySM3State": {"mu": NONNEGATIVE, "nu": SIGNED},
    "optax._src.transform.ScaleByAdaDeltaState": {"e_g": NONNEGATIVE,
                                                  "e_x": NONNEGATIVE},
    "optax._src.transform.ScaleByAdanState": {"m": SIGNED, "v": SIGNED,
                                              "n": NONNEGATIVE},
    "optax._src.factorized.FactoredState": {
        "v_row": NONNEGATIVE, "v_col": NONNEGATIVE, "v": NONNEGATIVE},
    "optax.transforms._accumulation.TraceState": {"trace": SIGNED},
    "optax.transforms._accumulation.EmaState": {"ema": SIGNED},
    "optax.contrib._ademamix.ScaleByAdemamixState": {
        "m1": SIGNED, "m2": SIGNED, "nu": NONNEGATIVE},
    "optax.contrib._ademamix.ScaleBySimplifiedAdEMAMixState": {
        "m": SIGNED, "n": NONNEGATIVE},
    "optax.contrib._dadapt_adamw.DAdaptAdamWState": {
        "exp_avg": SIGNED, "exp_avg_sq": NONNEGATIVE},
    "optax.contrib._prodigy.ProdigyState": {
        "exp_avg": SIGNED, "exp_avg_sq": NONNEGATIVE},
    "optax.contrib._momo.MomoState": {"exp_avg": SIGNED},
    "optax.contrib._momo.MomoAdamState": {"exp_avg": SIGNED,
                                          "exp_avg_sq": NONNEGATIVE},
    "optax.contrib._madgrad.MadgradState": {"grad_sum_sq": NONNEGATIVE,
                                            "s": SIGNED},
    "optax.contrib._muon.MuonState": {"mu": SIGNED},
    "optax.contrib._sophia.SophiaState": {"mu": SIGNED, "nu": SIGNED},
}
# The same classes' floors on a moment's width (``declare_moments``'s
# ``min_bits``): those of the shardopt classes holding the same moments.
# optax keeps AcProp's state in AdaBelief's class: its nu at 8 bits at least
# (AcProp's at 4 bits moved 27.8% off float state; shardopt's AcProp keeps
# nu in float, contrib/_acprop.py).
OPTAX_MIN_BITS: Mapping[str, Mapping[str, int]] = {
    "optax._src.transform.ScaleByAdaDeltaState": {"e_x": 8},
    "optax._src.transform.ScaleByBeliefState": {"nu": 8},
    "optax.contrib._ademamix.ScaleBySimplifiedAdEMAMixState": {"m": 8, "n": 8},
}
# optax's classes' fields kept as they are, and why (``declare_moments``'s
# ``kept``).
OPTAX_KEPT: Mapping[str, Mapping[str, str]] = {
    f"optax._src.transform.{name}": {"mu": CENTRED_RMS_KEPT, "nu": CENTRED_RMS_KEPT}
    for name in ("ScaleByRStdDevState", "ScaleByRStdDevWithCountState")
}


def declare_moments(min_bits: Mapping[str, int] | None = None,
                    kept: Mapping[str, str] | None = None,
                    **fields: str) -> Callable[[type], type]:
  """Class decorator: the named fields of a state class are moments.

  Args:
    min_bits: field -> the fewest bits (8) its quantized code may have,
      for a moment whose optimizer loses accuracy at 4 bits.
    kept: field -> why its leaves stay as they are (``quantized_state``
      reports it): a moment its update cannot take rounded, or a field
      holding state whose moments are not of the params' elements; no leaf
      below it is a moment.
    **fields: field name -> ``SIGNED`` or ``NONNEGATIVE``.

  Returns:
    A decorator that registers the class and returns it unchanged.
  """
  for name, kind in fields.items():
    if kind not in _KINDS:
      raise ValueError(f"declare_moments: {name}={kind!r}; expected "
                       f"moments.SIGNED or moments.NONNEGATIVE.")
  min_bits = dict(min_bits or {})
  for name, bits in min_bits.items():
    if name not in fields or bits not in (4, 8):
      raise ValueError(f"declare_moments: min_bits[{name!r}]={bits!r}; "
                       "expected 4 or 8 for a field declared a moment.")

  def register(cls: type) -> type:
    unknown = (set(fields) | set(kept or {})) - set(getattr(cls, "_fields", ()))
    if unknown:
      raise ValueError(f"declare_moments: {cls.__qualname__} has no field "
                       f"{sorted(unknown)} (fields: {cls._fields}).")
    _DECLARED[cls] = dict(fields)
    _MIN_BITS[cls] = min_bits
    _KEPT[cls] = dict(kept or {})
    return cls

  return register


def declared_moments(cls: type) -> Mapping[str, str] | None:
  """The moments declared for a state class (field -> kind), or None when
  the class declares none (shardopt's registry, then ``OPTAX_MOMENTS``)."""
  if cls in _DECLARED:
    return _DECLARED[cls]
  return OPTAX_MOMENTS.get(_optax_key(cls))


def declared_min_bits(cls: type) -> Mapping[str, int]:
  """The floors declared for a state class's moments (field -> bits),
  empty where it declares none (``declare_moments``, then
  ``OPTAX_MIN_BITS``)."""
  if cls in _DECLARED:
    return _MIN_BITS[cls]
  return OPTAX_MIN_BITS.get(_optax_key(cls), {})


def declared_kept(cls: type) -> Mapping[str, str]:
  """The fields of a state class declared kept as they are (field -> why),
  empty where it declares none (``declare_moments``, then ``OPTAX_KEPT``)."""
  if cls in _DECLARED:
    return _KEPT[cls]
  return OPTAX_KEPT.get(_optax_key(cls), {})


def _optax_key(cls: type) -> str:
  return f"{cls.__module__}.{cls.__qualname__}"


class LeafKind(NamedTuple):
  """What one state leaf is: its moment kind (None: not a moment), the
  state class and field it lies in (``"ScaleByAdamState.mu"``, or ``""``),
  the fewest bits its field declares (0: any) and, below a field declared
  ``kept``, why it is kept as it is."""

  kind: str | None
  field: str
  min_bits: int = 0
  kept: str = ""


def _children(node) -> list[Any]:
  """The direct subtrees of a pytree node ([node] for a leaf)."""
  return jax.tree.leaves(node, is_leaf=lambda x: x is not node)


def _is_leaf(node) -> bool:
  children = _children(node)
  return len(children) == 1 and children[0] is node


def _is_named_tuple(node) -> bool:
  return isinstance(node, tuple) and hasattr(type(node), "_fields")


def _named_tuple_classes(tree) -> set[type]:
  """The NamedTuple classes of ``tree``'s nodes."""
  if _is_leaf(tree):
    return set()
  own = {type(tree)} if _is_named_tuple(tree) else set()
  return own.union(*map(_named_tuple_classes, _children(tree)))


def _walk(node, found: LeafKind, params_classes: set[type],
          out: list[LeafKind]) -> None:
  if (_is_named_tuple(node) and found.kind is None and not found.kept
      and type(node) not in params_classes):
    declared = declared_moments(type(node)) or {}
    floors = declared_min_bits(type(node))
    kept = declared_kept(type(node))
    for name, child in zip(node._fields, node):
      _walk(child, LeafKind(declared.get(name),
                            f"{type(node).__name__}.{name}",
                            floors.get(name, 0), kept.get(name, "")),
            params_classes, out)
    return
  if _is_leaf(node):
    out.append(found)
    return
  for child in _children(node):
    _walk(child, found, params_classes, out)


def leaf_kinds(state, params) -> list[LeafKind]:
  """Per leaf of ``state`` (``jax.tree.leaves`` order), what it is.

  ``params`` are those ``init`` built ``state`` from: a NamedTuple of a
  class their tree uses is a container of params (a tree ``init`` mapped
  over them), not a state class, so its leaves keep the state field they
  lie in.
  """
  out: list[LeafKind] = []
  _walk(state, LeafKind(None, ""), _named_tuple_classes(params), out)
  return out
