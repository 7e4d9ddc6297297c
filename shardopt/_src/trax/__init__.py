"""Optimizers with trax's formulas, where they differ from optax's."""
