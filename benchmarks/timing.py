"""Seconds per optimizer update, timed the same way by every benchmark."""

import time

import jax


def seconds_per_update(opt, grads, params, state, steps):
  """One warm update, then ``steps`` timed ones, each waited for; returns
  (seconds per update, params, state) to carry into the next round."""
  params, state = opt.update(grads, state, params)  # warm
  jax.block_until_ready(state)
  start = time.perf_counter()
  for _ in range(steps):
    params, state = opt.update(grads, state, params)
    jax.block_until_ready(state)
  return (time.perf_counter() - start) / steps, params, state
