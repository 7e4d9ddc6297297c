"""Combinators and wrappers: transformations built from other transformations."""
