"""Every catalogue transformation as the tx of flax's ``nnx.Optimizer``, given
plainly (no adapter), float and quantized state: the params of the same
transformation run on the model's pure arrays.

``nnx.Optimizer`` writes the state back into its object graph after every
update, rebuilding containers inside the params' mapping (SM3's covers,
Shampoo's factors, a ``QuantizedArray``) as mappings; the transformations
read such a state in their own structure (``shardopt/_src/state_structure.py``).
"""

import jax
import numpy as np
import pytest

import shardopt
from tests import catalogue
from tests import nnx_training

STEPS = 2  # the second update reads the state nnx.Optimizer wrote back


def _quantized(tx, bits):
  """``tx``, or its moments at ``bits`` (the MLP's 4 x 8 kernel included)."""
  return tx if bits is None else shardopt.quantized_state(tx, bits=bits, min_size=16)


def _cases():
  """Every entry float; at 8 and 4 bits all but the catalogue's own
  ``quantized_state`` entries (quantizing a quantized state is refused:
  tests/test_quantized_state.py)."""
  entries = [e for e in catalogue.ENTRIES if e.transformation and not e.extra_args]
  return [pytest.param(entry, bits, id=f"{entry.label}-{name}")
          for bits, name in ((None, "float"), (8, "8bit"), (4, "4bit"))
          for entry in entries
          if bits is None or entry.qualname != "quantized_state"]


@pytest.mark.parametrize("entry,bits", _cases())
def test_nnx_optimizer_gives_the_params_of_the_pure_arrays(entry, bits):
  make = lambda: _quantized(catalogue.build(entry), bits)
  try:
    _, want = nnx_training.on_pure_arrays(make(), STEPS)
  except ValueError as error:  # e.g. per-example clipping: these grads have no batch axis
    with pytest.raises(type(error)):
      nnx_training.through_nnx_optimizer(make(), STEPS)
    return
  _, got = nnx_training.through_nnx_optimizer(make(), STEPS)
  jax.tree.map(lambda g, w: np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6),
               got, want)
