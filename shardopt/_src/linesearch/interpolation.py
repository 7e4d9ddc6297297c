"""Interpolation steps of the zoom line search: minimizers of a cubic and of a
parabola fitted to values and a slope of the objective along the direction.

Reference: Nocedal & Wright, "Numerical Optimization", 1999, Sec. 3.5.
"""

import jax
import jax.numpy as jnp

__all__ = [
    "cubic_minimizer",
    "quadratic_minimizer",
]


def cubic_minimizer(a, fa, fpa, b, fb, c, fc):
  """Critical point of the cubic through (a, fa), (b, fb), (c, fc) with slope
  fpa at a (NaN when there is none; the caller then falls back)."""
  db, dc = b - a, c - a
  denom = (db * dc) ** 2 * (db - dc)
  matrix = jnp.array([[dc**2, -(db**2)], [-(dc**3), db**3]])
  rhs = jnp.array([fb - fa - fpa * db, fc - fa - fpa * dc])
  cubic, quad = jnp.dot(matrix, rhs, precision=jax.lax.Precision.HIGHEST) / denom
  return a + (-quad + jnp.sqrt(quad * quad - 3.0 * cubic * fpa)) / (3.0 * cubic)


def quadratic_minimizer(a, fa, fpa, b, fb):
  """Critical point of the parabola through (a, fa), (b, fb), slope fpa at a."""
  db = b - a
  curvature = (fb - fa - fpa * db) / (db**2)
  return a - fpa / (2.0 * curvature)
