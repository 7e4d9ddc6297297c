"""``shardopt.perturbations``: optax's ``optax.perturbations`` (differentiable
smoothing of a function by random perturbations)."""

from shardopt._src.perturbations import Gumbel
from shardopt._src.perturbations import make_perturbed_fun
from shardopt._src.perturbations import Normal

__all__ = ["Gumbel", "make_perturbed_fun", "Normal"]
