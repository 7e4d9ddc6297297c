"""Deterministic byte-level batches of real text, sharded over the data axis.

The corpus is ``launch/corpus.txt`` (shipped with the code, so it is the same
on every machine): the module and class documentation of about 80 Python
standard-library modules, as plain ASCII prose. Tokens are bytes (vocab 256).

Batch ``step`` depends only on ``(seed, step)``: a resumed run reads exactly
the batches an uninterrupted one would. Every process computes the same
global batch indices but materialises only the rows its devices hold.
"""

import pathlib

import jax
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec as P

__all__ = ["CORPUS_PATH", "batch_at", "load_corpus", "sharded_batch"]

CORPUS_PATH = pathlib.Path(__file__).with_name("corpus.txt")


def load_corpus(path: pathlib.Path = CORPUS_PATH) -> np.ndarray:
  """The corpus as a uint8 array of bytes."""
  return np.frombuffer(path.read_bytes(), dtype=np.uint8)


def batch_at(corpus: np.ndarray, seed: int, step: int, batch: int,
             length: int) -> np.ndarray:
  """Global batch ``step``: ``batch`` windows of ``length`` bytes, int32."""
  rng = np.random.default_rng([seed, step])
  starts = rng.integers(0, corpus.size - length, size=batch)
  return corpus[starts[:, None] + np.arange(length)[None, :]].astype(np.int32)


def sharded_batch(corpus: np.ndarray, seed: int, step: int, batch: int,
                  length: int, mesh: jax.sharding.Mesh,
                  data_axis: str = "data") -> jax.Array:
  """Global batch ``step`` as a jax.Array with rows split over ``data_axis``."""
  host = batch_at(corpus, seed, step, batch, length)
  sharding = NamedSharding(mesh, P(data_axis, None))
  return jax.make_array_from_callback(host.shape, sharding,
                                      lambda index: host[index])
