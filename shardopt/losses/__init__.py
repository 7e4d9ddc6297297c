"""Losses: every loss of ``optax.losses`` (same names, signatures, numbers).

The cross-entropies reduce over the class axis with elementwise terms and
``jnp`` reductions only, so logits whose vocabulary axis is sharded over a
mesh axis are never gathered (tests/test_losses.py checks the compiled HLO).
"""

from shardopt.losses._cross_entropy import poly_loss_cross_entropy
from shardopt.losses._cross_entropy import safe_softmax_cross_entropy
from shardopt.losses._cross_entropy import sigmoid_binary_cross_entropy
from shardopt.losses._cross_entropy import sigmoid_focal_loss
from shardopt.losses._cross_entropy import softmax_cross_entropy
from shardopt.losses._cross_entropy import softmax_cross_entropy_with_integer_labels
from shardopt.losses._ctc import ctc_loss
from shardopt.losses._ctc import ctc_loss_with_forward_probs
from shardopt.losses._divergences import convex_kl_divergence
from shardopt.losses._divergences import generalized_kl_divergence
from shardopt.losses._divergences import kl_divergence
from shardopt.losses._divergences import kl_divergence_with_log_targets
from shardopt.losses._fenchel_young import make_fenchel_young_loss
from shardopt.losses._margins import hinge_loss
from shardopt.losses._margins import multiclass_hinge_loss
from shardopt.losses._margins import multiclass_perceptron_loss
from shardopt.losses._margins import multiclass_sparsemax_loss
from shardopt.losses._margins import perceptron_loss
from shardopt.losses._margins import sparsemax_loss
from shardopt.losses._ranking import ranking_softmax_loss
from shardopt.losses._regression import cosine_distance
from shardopt.losses._regression import cosine_similarity
from shardopt.losses._regression import huber_loss
from shardopt.losses._regression import l2_loss
from shardopt.losses._regression import log_cosh
from shardopt.losses._regression import squared_error
from shardopt.losses._segmentation import binary_dice_loss
from shardopt.losses._segmentation import dice_loss
from shardopt.losses._segmentation import multiclass_generalized_dice_loss
from shardopt.losses._self_supervised import ntxent
from shardopt.losses._self_supervised import triplet_margin_loss
from shardopt.losses._smoothing import smooth_labels

__all__ = [
    "binary_dice_loss", "convex_kl_divergence", "cosine_distance", "cosine_similarity",
    "ctc_loss", "ctc_loss_with_forward_probs", "dice_loss", "generalized_kl_divergence",
    "hinge_loss", "huber_loss", "kl_divergence", "kl_divergence_with_log_targets", "l2_loss",
    "log_cosh", "make_fenchel_young_loss", "multiclass_generalized_dice_loss",
    "multiclass_hinge_loss", "multiclass_perceptron_loss", "multiclass_sparsemax_loss",
    "ntxent", "perceptron_loss", "poly_loss_cross_entropy", "ranking_softmax_loss",
    "safe_softmax_cross_entropy", "sigmoid_binary_cross_entropy", "sigmoid_focal_loss",
    "smooth_labels", "softmax_cross_entropy", "softmax_cross_entropy_with_integer_labels",
    "sparsemax_loss", "squared_error", "triplet_margin_loss",
]
