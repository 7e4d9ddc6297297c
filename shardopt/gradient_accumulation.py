"""(placeholder: being written)."""

__all__ = []
