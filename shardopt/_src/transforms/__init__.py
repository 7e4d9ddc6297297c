"""Gradient transformations, one family per module (moments, clipping, factored statistics, ...)."""
