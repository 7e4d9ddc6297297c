"""A small decoder-only transformer language model (Flax linen).

Parameter paths follow the names the partition-rule presets expect::

  embed/embedding                    (vocab, d_model)
  layers_N/attn/{query,key,value}/kernel  (d_model, heads, head_dim)
  layers_N/attn/out/kernel           (heads, head_dim, d_model)
  layers_N/mlp/wi/kernel             (d_model, mlp)
  layers_N/mlp/wo/kernel             (mlp, d_model)
  layers_N/ln_{1,2}/scale, ln_f/scale, lm_head/kernel (d_model, vocab)

There are no biases and no position parameters (positions are sinusoidal), so
every parameter is covered by the presets.

The model computes in its params' dtype (bfloat16 params: bfloat16
activations and matmuls); the loss takes its log-softmax in float32.

With ``scan_layers`` the blocks run under ``nn.scan``: one compiled block,
its params stacked once under ``layers/`` with a leading layer dimension
(``layers/attn/query/kernel`` is (layers, d_model, heads, head_dim)), the
layout of ``partitioning.decoder_rules(..., stacked=True)``.

On Explicit mesh axes (the job's ``--axis-types explicit``) the layers
compute with layouts in their types (``launch/typed_layers.py``), under
every preset with the loss and gradients of one device
(``tests/test_launch_explicit.py``).
"""

import dataclasses

import flax.linen as nn
import jax
import jax.numpy as jnp

from launch import typed_layers

__all__ = ["ModelConfig", "Transformer", "greedy_continue", "next_token_loss"]


@dataclasses.dataclass(frozen=True)
class ModelConfig:
  vocab: int = 256
  d_model: int = 64
  heads: int = 4
  head_dim: int = 16
  mlp: int = 256
  layers: int = 2
  scan_layers: bool = False
  unroll_scan: bool = False  # scan_layers written out layer by layer (for FLOP counts)


def _sinusoids(length: int, width: int) -> jax.Array:
  pos = jnp.arange(length, dtype=jnp.float32)[:, None]
  freq = jnp.exp(-jnp.log(10_000.0) * jnp.arange(0, width, 2) / width)
  angles = pos * freq[None, :]
  return jnp.concatenate([jnp.sin(angles), jnp.cos(angles)], axis=-1)


class Attention(nn.Module):
  cfg: ModelConfig

  @nn.compact
  def __call__(self, x):
    cfg = self.cfg
    proj = lambda name: nn.DenseGeneral(
        (cfg.heads, cfg.head_dim), use_bias=False, dot_general=typed_layers.dot_general, name=name)(x)
    q, k, v = proj("query"), proj("key"), proj("value")
    logits = jnp.einsum("bqhd,bkhd->bhqk", q, k) / jnp.sqrt(cfg.head_dim)
    length = x.shape[1]
    causal = jnp.tril(jnp.ones((length, length), bool))
    logits = jnp.where(causal, logits, jnp.finfo(logits.dtype).min)
    mixed = jnp.einsum("bhqk,bkhd->bqhd", jax.nn.softmax(logits), v)
    return nn.DenseGeneral(
        cfg.d_model, axis=(-2, -1), use_bias=False, dot_general=typed_layers.dot_general, name="out")(mixed)


class Mlp(nn.Module):
  cfg: ModelConfig

  @nn.compact
  def __call__(self, x):
    h = nn.gelu(nn.Dense(self.cfg.mlp, use_bias=False, dot_general=typed_layers.dot_general, name="wi")(x))
    return nn.Dense(self.cfg.d_model, use_bias=False, dot_general=typed_layers.dot_general, name="wo")(h)


class Block(nn.Module):
  cfg: ModelConfig
  scanned: bool = False  # nn.scan's signature: (x, _) -> (x, None)

  @nn.compact
  def __call__(self, x, _=None):
    y = x + Attention(self.cfg, name="attn")(nn.RMSNorm(name="ln_1")(x))
    y = y + Mlp(self.cfg, name="mlp")(nn.RMSNorm(name="ln_2")(y))
    # A scan's carry keeps its type.
    return (typed_layers.typed_as(y, x), None) if self.scanned else y


class _Embed(nn.Embed):
  """``nn.Embed`` whose lookup also types on Explicit mesh axes: there a gather
  of a table split over one axis has no sharding rule, so the rows come out
  laid out as the ids are (``out_sharding``)."""

  def __call__(self, inputs):
    if typed_layers.explicit_spec(self.embedding) is None:
      return super().__call__(inputs)
    ids = typed_layers.explicit_spec(inputs) or (None,) * inputs.ndim
    table = jnp.asarray(self.embedding, self.dtype)
    return table.at[inputs].get(out_sharding=typed_layers.laid_out_as(table, (*ids, None)))


class Transformer(nn.Module):
  """Token ids (batch, length) -> next-token logits (batch, length, vocab)."""

  cfg: ModelConfig

  @nn.compact
  def __call__(self, tokens):
    cfg = self.cfg
    x = _Embed(cfg.vocab, cfg.d_model, name="embed")(tokens)
    x = x + _sinusoids(tokens.shape[1], cfg.d_model)[None].astype(x.dtype)
    if cfg.scan_layers:
      stack = nn.scan(Block, variable_axes={"params": 0},
                      split_rngs={"params": True}, length=cfg.layers,
                      unroll=cfg.layers if cfg.unroll_scan else 1)
      x, _ = stack(cfg, scanned=True, name="layers")(x, None)
    else:
      for i in range(cfg.layers):
        x = Block(cfg, name=f"layers_{i}")(x)
    x = nn.RMSNorm(name="ln_f")(x)
    return nn.Dense(cfg.vocab, use_bias=False, dot_general=typed_layers.dot_general, name="lm_head")(x)


def next_token_loss(model: Transformer, params, tokens: jax.Array) -> jax.Array:
  """Mean cross-entropy of predicting tokens[:, 1:] from tokens[:, :-1]."""
  logits = model.apply({"params": typed_layers.gathered_for(params, tokens)}, tokens[:, :-1])
  logp = jax.nn.log_softmax(logits.astype(jnp.float32))
  target = jax.nn.one_hot(tokens[:, 1:], model.cfg.vocab)
  return -jnp.mean(jnp.sum(logp * target, axis=-1))


def greedy_continue(model: Transformer, params, tokens: jax.Array, start: int) -> jax.Array:
  """``tokens`` (batch, length) with every position from ``start`` on replaced
  by the model's most likely next byte, one position at a time (each step
  reads the whole window; the causal mask keeps later positions out)."""

  params = typed_layers.gathered_for(params, tokens)

  def next_byte(i, tokens):
    logits = model.apply({"params": params}, tokens)
    return tokens.at[:, i].set(jnp.argmax(logits[:, i - 1], axis=-1).astype(tokens.dtype))

  return jax.lax.fori_loop(start, tokens.shape[1], next_byte, tokens)
