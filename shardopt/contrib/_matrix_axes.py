"""Reading a weight of any rank as a (stack of) matrices, and back.

A weight's axes are split into reduction (input) axes, output axes and the
remaining batch axes (``y = x W`` has reduction axis 0, output axis 1). Muon
and GaLore name them with dimension numbers of this form.
"""

from collections.abc import Callable
from collections.abc import Sequence
import math

__all__ = ["as_matrix_stack", "fan_in_and_out", "split_axes"]


def _axes(axis: Sequence[int] | int, ndim: int) -> tuple[int, ...]:
  axes = (axis,) if isinstance(axis, int) else tuple(axis)
  return tuple(a % ndim for a in axes)


def split_axes(shape, dims, who: str):
  """(batch, reduction, output) axes of an array of ``shape``.

  ``dims`` has ``reduction_axis`` and ``output_axis`` (ints or sequences);
  ``who`` names the optimizer in errors.
  """
  ndim = len(shape)
  if ndim < 2:
    raise ValueError(
        f"{who} needs parameters of rank >= 2; got shape {shape}. Leave "
        "vectors and scalars out (None as their dimension numbers).")
  reduction = _axes(dims.reduction_axis, ndim)
  output = _axes(dims.output_axis, ndim)
  if set(reduction) & set(output):
    raise ValueError(
        f"{who}: reduction axes {reduction} and output axes {output} overlap "
        f"for shape {shape} ({dims}); name each axis at most once.")
  batch = tuple(a for a in range(ndim) if a not in reduction + output)
  return batch, reduction, output


def fan_in_and_out(shape, dims, who: str = "Muon") -> tuple[int, int]:
  """Products of the reduction and of the output axes' sizes."""
  _, reduction, output = split_axes(shape, dims, who)
  return (math.prod(shape[a] for a in reduction),
          math.prod(shape[a] for a in output))


def as_matrix_stack(shape, dims, who: str = "Muon"
                    ) -> tuple[Callable, Callable]:
  """``(to_stack, from_stack)``: an array of ``shape`` to a (batch,
  reduction, output) stack of matrices and back."""
  batch, reduction, output = split_axes(shape, dims, who)
  order = batch + reduction + output
  inverse = tuple(order.index(a) for a in range(len(shape)))
  sizes = lambda axes: tuple(shape[a] for a in axes)
  stacked = tuple(math.prod(sizes(axes)) for axes in (batch, reduction,
                                                        output))
  moved = sizes(order)
  return (lambda x: x.transpose(order).reshape(stacked),
          lambda x: x.reshape(moved).transpose(inverse))
