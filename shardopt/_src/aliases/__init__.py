"""Ready-made optimizers: chains of transformations with optax's names, signatures and defaults."""
