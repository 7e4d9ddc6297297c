"""Deterministic byte-level batches of real text, sharded over the data axis.

The corpus is ``launch/corpus.txt`` (shipped with the code, so it is the same
on every machine): the module and class documentation of about 80 Python
standard-library modules, as plain ASCII prose. Tokens are bytes (vocab 256).

The job trains on the first 90% of the corpus and holds the rest out
(``split``): the held-out slice starts at a paragraph, no training window
reaches into it, and the eval batches (``eval_batches``) are consecutive,
non-overlapping windows of it, the same at every evaluation.

Batch ``step`` depends only on ``(seed, step)``: a resumed run reads exactly
the batches an uninterrupted one would. Every process computes the same
global batch indices but materialises only the rows its devices hold.
"""

import pathlib

import jax
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec as P

__all__ = ["CORPUS_PATH", "HELD_OUT_FRACTION", "batch_at", "check_seq_len", "eval_batches",
           "load_corpus", "sharded_batch", "sharded_eval_batches", "split"]

CORPUS_PATH = pathlib.Path(__file__).with_name("corpus.txt")
HELD_OUT_FRACTION = 0.1


def load_corpus(path: pathlib.Path = CORPUS_PATH) -> np.ndarray:
  """The corpus as a uint8 array of bytes."""
  return np.frombuffer(path.read_bytes(), dtype=np.uint8)


def split(corpus: np.ndarray,
          held_out: float = HELD_OUT_FRACTION) -> tuple[np.ndarray, np.ndarray]:
  """(training bytes, held-out bytes): the held-out slice is the last
  ``held_out`` of the corpus, from the first paragraph start (after a blank
  line) at or after that point."""
  cut = int(corpus.size * (1 - held_out))
  text = corpus[cut:].tobytes()
  blank = text.find(b"\n\n")
  cut += blank + 2 if blank >= 0 else 0
  return corpus[:cut], corpus[cut:]


def check_seq_len(length: int, train: np.ndarray, held_out: np.ndarray) -> None:
  """A ValueError naming --seq-len and the longest that works when windows of ``length``
  bytes do not fit: training windows in the training slice (``batch_at`` draws a start), the
  greedy sample's prompt, the first half of a window, in the held-out slice."""
  longest = min(train.size - 1, 2 * held_out.size + 2)
  if length > longest:
    raise ValueError(f"--seq-len {length}: at most {longest} with this corpus (training windows"
                     f" lie in its {train.size}-byte training slice, the sample's prompt, the"
                     f" first half of a window, in its {held_out.size}-byte held-out slice)")


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


def eval_batches(held_out: np.ndarray, count: int, batch: int, length: int) -> np.ndarray:
  """``(n, batch, length)`` int32: consecutive non-overlapping windows of
  ``held_out`` from its start, ``n`` the smaller of ``count`` and the whole
  batches the slice holds; a ValueError when it holds none."""
  fit = (held_out.size // length) // batch
  if fit < 1:
    raise ValueError(f"the held-out slice ({held_out.size} bytes) holds no batch of {batch}"
                     f" windows of {length} bytes; lower --batch or --seq-len, or pass"
                     " --eval-every 0")
  rows = min(count, fit) * batch
  windows = held_out[:rows * length].reshape(rows, length).astype(np.int32)
  return windows.reshape(-1, batch, length)


def sharded_eval_batches(batches: np.ndarray, mesh: jax.sharding.Mesh,
                         data_axis: str = "data") -> jax.Array:
  """``eval_batches`` as one jax.Array, each batch's rows split over ``data_axis``."""
  sharding = NamedSharding(mesh, P(None, data_axis, None))
  return jax.make_array_from_callback(batches.shape, sharding, lambda index: batches[index])
