"""Functions served deprecated: they warn on each call, as optax's do."""

from collections.abc import Callable
import functools
from typing import Any
import warnings

__all__ = ["warn_on_call"]


def warn_on_call(public_name: str,
                 removed_in: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
  """A decorator: the function warns (``DeprecationWarning``, naming
  ``public_name`` and the optax release that removes it) whenever it is
  called, keeping its name, docstring and signature.

  Args:
    public_name: the name users call it by, e.g.
      ``"shardopt.second_order.hvp"``.
    removed_in: the optax version that removes it.

  Returns:
    The decorator.
  """
  message = (f"The function {public_name} is deprecated (as in optax 0.2.8)."
             f" This function will be/was removed in optax {removed_in}.")

  def decorate(fn):
    @functools.wraps(fn)
    def warned(*args, **kwargs):
      warnings.warn(message, category=DeprecationWarning, stacklevel=2)
      return fn(*args, **kwargs)
    return warned

  return decorate
