"""trax's optimizers with trax's semantics, as gradient transformations.

Where trax differs from optax, these keep trax's behaviour under separate
names (``trax_adam``, ``trax_momentum``, ``trax_rmsprop``, ``trax_adafactor``,
``trax_sm3``) and trax's defaults. Each returns *updates* (the negative step):
``apply_updates(params, updates)`` gives trax's new weights. Counters start at
0, so trax's ``step`` is the number of updates applied before this one.

Differences from the optax aliases of the same family:
- weight decay is decoupled and *not* scaled by the learning rate:
  ``w <- (1 - weight_decay_rate) * w - step`` (Adam, Momentum, Adafactor);
- Adafactor factors every array of rank >= 2 over its last two dimensions
  (optax factors the two largest dimensions of arrays whose second-largest is
  at least ``min_dim_size_to_factor``), adds ``epsilon1`` to the squared
  gradient, clips the update RMS only when ``do_clipping``, optionally keeps
  bfloat16 momentum, and can ramp weight decay down to 0 over
  ``weight_decay_n_steps`` steps;
- RMSProp starts its mean square at one and divides by ``sqrt(v) + eps``;
- SM3 offers EMA, heavy-ball and Nesterov momentum, an averaging factor for the
  second moments (1.0 = AdaGrad-style sums) and weight decay added to the
  preconditioned gradient.

References: Kingma & Ba 2014 (Adam); Sutskever et al. 2013 (momentum);
Shazeer & Stern 2018, https://arxiv.org/abs/1804.04235 (Adafactor);
Anil et al. 2019, https://arxiv.org/abs/1901.11150 (SM3).
"""

from shardopt._src import base
from shardopt._src.transforms.adam import scale_by_adam
from shardopt._src.transforms.clipping import clip_by_global_norm
from shardopt._src.transforms.momentum import trace
from shardopt._src.transforms.rms import scale_by_rms
from shardopt._src.transforms.scaling import scale_by_learning_rate
from shardopt._src.transforms.weight_decay import add_decayed_weights
from shardopt._src.wrappers.combine import chain

__all__ = [
    "trax_adam",
    "trax_momentum",
    "trax_rmsprop",
]


def _optional_clip(clip_grad_norm):
  return [] if clip_grad_norm is None else [clip_by_global_norm(clip_grad_norm)]


def _decoupled_decay(weight_decay_rate):
  """Adds ``-rate * w`` to updates that are already negative steps."""
  return [] if not weight_decay_rate else [add_decayed_weights(-weight_decay_rate)]


def trax_adam(
    learning_rate: base.ScalarOrSchedule = 1e-4,
    weight_decay_rate: float = 1e-5,
    b1: float = 0.9,
    b2: float = 0.999,
    eps: float = 1e-5,
    clip_grad_norm: float | None = None,
) -> base.GradientTransformation:
  """trax's Adam: ``w <- (1 - wd) w - lr * m_hat / (sqrt(v_hat) + eps)``.

  Gradients are first clipped to global norm ``clip_grad_norm`` when given.

  Args:
    learning_rate: a scalar or a schedule of the step count (default 1e-4).
    weight_decay_rate: the decoupled decay ``wd`` (default 1e-5).
    b1: decay of the first moment (default 0.9).
    b2: decay of the second moment (default 0.999).
    eps: added to the root of the second moment (default 1e-5).
    clip_grad_norm: global norm the gradients are clipped to; ``None``
      (default) does not clip.

  Returns:
    A ``GradientTransformation`` whose updates are the change of ``w``.

  References:
    Kingma & Ba, "Adam: A Method for Stochastic Optimization", ICLR 2015
    (https://arxiv.org/abs/1412.6980); decoupled decay as in Loshchilov &
    Hutter, "Decoupled Weight Decay Regularization", ICLR 2019
    (https://arxiv.org/abs/1711.05101); trax's ``trax.optimizers.Adam``.
  """
  return chain(
      *_optional_clip(clip_grad_norm),
      scale_by_adam(b1=b1, b2=b2, eps=eps),
      scale_by_learning_rate(learning_rate),
      *_decoupled_decay(weight_decay_rate),
  )


def trax_momentum(
    learning_rate: base.ScalarOrSchedule = 0.01,
    mass: float = 0.9,
    weight_decay_rate: float = 1e-5,
    nesterov: bool = True,
) -> base.GradientTransformation:
  """trax's momentum SGD, Nesterov by default.

  ``v <- mass * v + g``; the step is ``mass * v + g`` (Nesterov) or ``v``;
  ``w <- (1 - wd) w - lr * step``.

  Args:
    learning_rate: a scalar or a schedule of the step count (default 0.01).
    mass: the momentum's decay (default 0.9).
    weight_decay_rate: the decoupled decay ``wd`` (default 1e-5).
    nesterov: whether to use Nesterov momentum (default True).

  Returns:
    A ``GradientTransformation`` whose updates are the change of ``w``.

  References:
    Sutskever et al., "On the importance of initialization and momentum in
    deep learning", ICML 2013
    (https://proceedings.mlr.press/v28/sutskever13.html); Nesterov's form as
    in Bengio et al., "Advances in Optimizing Recurrent Networks", 2012
    (https://arxiv.org/abs/1212.0901); trax's ``trax.optimizers.Momentum``.
  """
  return chain(
      trace(decay=mass, nesterov=nesterov),
      scale_by_learning_rate(learning_rate),
      *_decoupled_decay(weight_decay_rate),
  )


def trax_rmsprop(
    learning_rate: base.ScalarOrSchedule = 1e-3,
    gamma: float = 0.9,
    eps: float = 1e-8,
    clip_grad_norm: float | None = None,
) -> base.GradientTransformation:
  """trax's RMSProp: ``v <- gamma v + (1 - gamma) g^2`` from ``v = 1``.

  ``w <- w - lr * g / (sqrt(v) + eps)``; gradients are first clipped to
  global norm ``clip_grad_norm`` when given.

  Args:
    learning_rate: a scalar or a schedule of the step count (default 1e-3).
    gamma: decay of the moving average (default 0.9).
    eps: added to the root of the average (default 1e-8).
    clip_grad_norm: global norm the gradients are clipped to; ``None``
      (default) does not clip.

  Returns:
    A ``GradientTransformation`` whose updates are the change of ``w``.

  References:
    Tieleman & Hinton, "Lecture 6.5 - rmsprop", Coursera: Neural Networks for
    Machine Learning, 2012
    (https://www.cs.toronto.edu/~tijmen/csc321/slides/lecture_slides_lec6.pdf);
    trax's ``trax.optimizers.RMSProp``.
  """
  return chain(
      *_optional_clip(clip_grad_norm),
      scale_by_rms(decay=gamma, eps=eps, initial_scale=1.0, eps_in_sqrt=False),
      scale_by_learning_rate(learning_rate),
  )
