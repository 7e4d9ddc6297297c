"""Ready-made sign-based optimizers (Lion, signSGD, Signum, Rprop) and those
whose step size comes from the objective (Polyak SGD, L-BFGS with a line
search), with optax's names, signatures and defaults.
"""

from shardopt._src import base
from shardopt._src.linesearch import zoom
from shardopt._src.transforms import lbfgs as lbfgs_lib
from shardopt._src.transforms import scaling
from shardopt._src.wrappers import combine

__all__ = [
    "lbfgs",
]

_Extra = base.GradientTransformationExtraArgs


def lbfgs(
    learning_rate: base.ScalarOrSchedule | None = None,
    memory_size: int = 10,
    scale_init_precond: bool = True,
    linesearch: base.GradientTransformation | None = (
        zoom.scale_by_zoom_linesearch(
            max_linesearch_steps=20, initial_guess_strategy="one")),
) -> _Extra:
  """L-BFGS: a limited-memory quasi-Newton direction, with a zoom line search.

  The direction is the two-loop recursion's product of an inverse-Hessian
  estimate (from the last ``memory_size`` pairs of param and gradient
  differences) with the gradient; it is scaled by ``-learning_rate`` (or
  negated when ``learning_rate`` is None) and handed to ``linesearch``.
  ``update`` needs ``value=``, ``grad=`` and ``value_fn=`` for the search.

  Args:
    learning_rate: a scalar or schedule scaling the direction; ``None``
      (default) only negates it and leaves the step length to the line
      search.
    memory_size: number of past difference pairs kept (default 10).
    scale_init_precond: whether to scale the initial inverse Hessian by
      ``<dw, du> / <du, du>`` (default True).
    linesearch: a line-search transformation run after the direction;
      default ``scale_by_zoom_linesearch(max_linesearch_steps=20,
      initial_guess_strategy="one")``; ``None`` takes the step as is.

  Returns:
    A ``GradientTransformationExtraArgs``: ``scale_by_lbfgs``, the step
    scaling, then the line search.

  References:
    Nocedal, "Updating Quasi-Newton Matrices with Limited Storage", Math.
    Comp. 1980 (https://doi.org/10.1090/S0025-5718-1980-0572855-7); Liu &
    Nocedal, "On the limited memory BFGS method for large scale
    optimization", Math. Prog. 1989 (https://doi.org/10.1007/BF01589116);
    Nocedal & Wright, "Numerical Optimization", 1999, Algorithms 7.4, 7.5.
  """
  if learning_rate is None:
    step = scaling.scale(-1.0)
  else:
    step = scaling.scale_by_learning_rate(learning_rate)
  return combine.chain(
      lbfgs_lib.scale_by_lbfgs(memory_size=memory_size,
                                  scale_init_precond=scale_init_precond),
      step,
      base.identity() if linesearch is None else linesearch,
  )
