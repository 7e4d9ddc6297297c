"""The held-out slice of the corpus during training: its loss every --eval-every steps
(one jitted program) and greedy samples (every --sample-every steps and at the end) whose
prompt is the start of that slice. Imports jax.
"""

import pathlib

import jax
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P
import numpy as np

from launch import data
from launch import report
from launch import steps
from launch.model import next_token_loss
from launch.processes import say

__all__ = ["HeldOut"]


class HeldOut:
  """The loss on the held-out slice (one jitted program) and greedy samples
  whose prompt is the start of that slice."""

  def __init__(self, args, mesh, model, param_shardings, held_out, batches):
    """``batches``: the held-out batches (``data.eval_batches``), None with --eval-every 0."""
    self.held_out_bytes = held_out.size
    self.batches = None if batches is None else data.sharded_eval_batches(batches, mesh)
    loss_fn = lambda p, tokens: next_token_loss(model, p, tokens)
    self._loss = steps.eval_loss(loss_fn, param_shardings,
                                 NamedSharding(mesh, P(None, "data", None)))
    window = args.seq_len - 1
    self.prompt_len = window // 2
    self._prompt = np.zeros((1, window), np.int32)
    self._prompt[0, :self.prompt_len] = held_out[:self.prompt_len]
    self._sample = steps.greedy_sample(model, param_shardings, self.prompt_len)

  def describe(self, args) -> str:
    return (f"held-out: the last {self.held_out_bytes} bytes of {data.CORPUS_PATH.name}, never"
            f" trained on; {self.batches.shape[0]} batches of {args.batch} x {args.seq_len}"
            f" bytes every {args.eval_every} steps and at the last" if args.eval_every else
            "held-out loss: off (--eval-every 0)")

  def loss(self, params) -> float:
    return float(self._loss(params, self.batches))

  def sample(self, params, step: int, path: pathlib.Path) -> None:
    """Prints the greedy continuation of the prompt and appends it to ``path``."""
    tokens = np.asarray(jax.device_get(self._sample(params, self._prompt)))[0]
    text = lambda t: bytes(t.astype(np.uint8).tolist()).decode("utf-8", errors="replace")
    prompt, continuation = text(tokens[:self.prompt_len]), text(tokens[self.prompt_len:])
    say(f"sample at step {step} (greedy): {prompt!r} -> {continuation!r}")
    if jax.process_index() == 0:
      report.append_metrics(path, {"step": step, "prompt": prompt,
                                   "continuation": continuation})
