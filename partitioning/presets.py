"""Named partition-rule sets for a decoder-only transformer, and its param shapes.

Param paths (Flax linen names; a leading 'params/' or any prefix is fine):

  embed/embedding                     (vocab, d_model)
  layers_N/attn/{query,key,value}/kernel (d_model, heads, head_dim)
  layers_N/attn/out/kernel            (heads, head_dim, d_model)
  layers_N/mlp/wi/kernel              (d_model, mlp)   (wi_0, wi_1 when gated)
  layers_N/mlp/wo/kernel              (mlp, d_model)
  layers_N/ln_{1,2}/scale, ln_f/scale (d_model,)
  lm_head/kernel                      (d_model, vocab)

Presets:
  'replicated': every param on every device.
  'fsdp': the d_model dimension of every matrix sharded over the fsdp axis
    (ZeRO-3 style: gathered before use).
  'tp': Megatron-style tensor parallelism over the model axis: heads of
    attention, the mlp dimension, and the vocab of embedding and lm_head.
  'fsdp_tp': both at once, so matrices are split over fsdp x model devices.
Norm scales and biases stay replicated (they are tiny).

Stacked (scanned) layers, ``stacked=True``: the layout maxtext and levanter
use to compile a deep model once per layer kind. Every per-layer param lives
once under ``layers/`` with a leading layer dimension of size L::

  layers/attn/{query,key,value}/kernel (L, d_model, heads, head_dim)
  layers/attn/out/kernel              (L, heads, head_dim, d_model)
  layers/mlp/wi/kernel, layers/mlp/wo/kernel  (L, d_model, mlp), (L, mlp, d_model)
  layers/ln_{1,2}/scale               (L, d_model)

The layer dimension is never sharded (the scan slices it); the others are
sharded as in the unstacked preset. A stacked norm scale is L times larger,
so under the fsdp presets its d_model dimension is split over the fsdp axis.
"""

from typing import Any

import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec

from partitioning.specs import PartitionError

__all__ = ["DECODER_PRESETS", "decoder_param_shapes", "decoder_rules"]

DECODER_PRESETS = ("replicated", "fsdp", "tp", "fsdp_tp")

# (pattern, rank, dimension of d_model, dimension split by tensor parallelism)
_DECODER_LAYOUT = (
    (r"embed/embedding$", 2, 1, 0),
    (r"attn/(query|key|value)/kernel$", 3, 0, 1),
    (r"attn/out/kernel$", 3, 2, 0),
    (r"mlp/wi(_\d+)?/kernel$", 2, 0, 1),
    (r"mlp/wo/kernel$", 2, 1, 0),
    (r"lm_head/kernel$", 2, 0, 1),
)
_SCALE = r"(ln_\w+|norm\w*)/scale$"
_STACKED = r"(^|/)layers/(.*/)?"  # per-layer params under one 'layers' node
_OUTSIDE_STACKED = r"^(?!(.*/)?layers/)(.*/)?"  # not under it (the final norm)


def _replicated(stacked: bool) -> list[tuple[str, PartitionSpec]]:
  """Norm scales (stacked ones have their own rule) and biases: replicated."""
  scale = (_OUTSIDE_STACKED if stacked else "") + _SCALE
  return [(scale, PartitionSpec()), (r"bias$", PartitionSpec())]


def decoder_rules(
    preset: str = "fsdp_tp",
    *,
    fsdp_axis: str | tuple[str, ...] = "fsdp",
    model_axis: str | tuple[str, ...] = "model",
    stacked: bool = False,
) -> list[tuple[str, PartitionSpec]]:
  """The rules of one preset (see the module docstring) for the named mesh axes.

  Args:
    preset: one of ``DECODER_PRESETS``.
    fsdp_axis: mesh axis (or axes) that splits d_model under fsdp presets.
    model_axis: mesh axis (or axes) of tensor parallelism under tp presets.
    stacked: per-layer params are stacked under ``layers/`` with a leading
      layer dimension (scanned layers), which stays unsharded.

  Returns:
    ``(regex, PartitionSpec)`` pairs, first match wins.
  """
  if preset not in DECODER_PRESETS:
    raise PartitionError(f"Unknown preset {preset!r}: choose one of {DECODER_PRESETS}.")
  if preset == "replicated":
    return [(".*", PartitionSpec())]
  fsdp = preset in ("fsdp", "fsdp_tp")
  rules = []
  for pattern, rank, embed_dim, tp_dim in _DECODER_LAYOUT:
    entries = [None] * rank
    if fsdp:
      entries[embed_dim] = fsdp_axis
    if preset in ("tp", "fsdp_tp"):
      entries[tp_dim] = model_axis
    if stacked and pattern.startswith(("attn", "mlp")):
      rules.append((_STACKED + pattern, PartitionSpec(None, *entries)))
    else:
      rules.append((pattern, PartitionSpec(*entries)))
  if stacked:
    rules.insert(0, (_STACKED + _SCALE, PartitionSpec(None, fsdp_axis if fsdp else None)))
  return rules + _replicated(stacked)


def decoder_param_shapes(
    vocab: int,
    d_model: int,
    layers: int,
    mlp: int,
    heads: int,
    *,
    head_dim: int | None = None,
    gated_mlp: bool = False,
    kv_heads: int | None = None,
    stacked: bool = False,
    dtype: Any = jnp.float32,
) -> dict:
  """The param tree (of ShapeDtypeStruct) of an untied decoder-only transformer.

  ``gated_mlp`` gives two input projections wi_0, wi_1 (LLaMA-style), so
  ``decoder_param_shapes(32000, 4096, 32, 11008, 32, gated_mlp=True)`` has the
  6.74e9 params of LLaMA-7B. ``kv_heads`` (grouped-query attention) gives key
  and value ``kv_heads`` heads: ``decoder_param_shapes(32000, 8192, 80, 28672,
  64, gated_mlp=True, kv_heads=8)`` has the 6.90e10 params of LLaMA-2-70B.
  ``stacked`` puts every per-layer param once under ``layers`` with a
  leading layer dimension (scanned layers) instead of ``layers_N`` subtrees.
  """
  head_dim = head_dim or d_model // heads
  kv_heads = kv_heads or heads
  lead = (layers,) if stacked else ()
  sds = lambda *shape: jax.ShapeDtypeStruct(shape, dtype)
  kernel = lambda *shape: {"kernel": sds(*lead, *shape)}
  wi = {"wi_0": kernel(d_model, mlp), "wi_1": kernel(d_model, mlp)} if gated_mlp else {"wi": kernel(d_model, mlp)}
  layer = lambda: {
      "attn": {
          "query": kernel(d_model, heads, head_dim),
          **{n: kernel(d_model, kv_heads, head_dim) for n in ("key", "value")},
          "out": kernel(heads, head_dim, d_model),
      },
      "mlp": {**wi, "wo": kernel(mlp, d_model)},
      "ln_1": {"scale": sds(*lead, d_model)},
      "ln_2": {"scale": sds(*lead, d_model)},
  }
  per_layer = {"layers": layer()} if stacked else {f"layers_{i}": layer() for i in range(layers)}
  return {
      "embed": {"embedding": sds(vocab, d_model)},
      **per_layer,
      "ln_f": {"scale": sds(d_model)},
      "lm_head": {"kernel": sds(d_model, vocab)},
  }
