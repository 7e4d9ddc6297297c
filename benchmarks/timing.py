"""Seconds per optimizer update, timed the same way by every benchmark."""

import collections
import ctypes
import time

import jax
import numpy as np


def seconds_per_update(opt, grads, params, state, steps, wait_each=True):
  """One warm update, then ``steps`` timed ones, each waited for (or,
  ``wait_each=False``, only the last: the device's time per update without
  the host's wait and dispatch in between); returns (seconds per update,
  params, state) to carry into the next round."""
  params, state = opt.update(grads, state, params)  # warm
  jax.block_until_ready(state)
  start = time.perf_counter()
  for step in range(steps):
    params, state = opt.update(grads, state, params)
    if wait_each or step == steps - 1:
      jax.block_until_ready(state)
  return (time.perf_counter() - start) / steps, params, state


def interleaved(layouts, grads, rounds=15, steps=10, wait_each=True):
  """Per key of ``layouts`` (key -> (opt, params, state); ``None`` is the
  baseline): (median seconds per ``opt.update``, median over rounds of its
  time over the baseline's in the same round). Rounds interleave the
  layouts, so load that changes between rounds cancels in the ratios.
  ``layouts`` gets the updated (donated) params and state."""
  live = {k: [v[1], v[2]] for k, v in layouts.items()}
  times = collections.defaultdict(list)
  for _ in range(rounds):
    for key, (opt, *_rest) in layouts.items():
      seconds, params, state = seconds_per_update(opt, grads, *live[key], steps,
                                                  wait_each)
      times[key].append(seconds)
      live[key] = [params, state]
  for key, (params, state) in live.items():
    layouts[key] = (layouts[key][0], params, state)
  base = np.asarray(times[None])
  return {k: (float(np.median(v)), float(np.median(np.asarray(v) / base)))
          for k, v in times.items()}


def keep_freed_memory() -> None:
  """glibc: serve every allocation from the heap and keep freed memory, so
  an update's temporaries reuse pages (as a pooling allocator would)
  instead of mapping fresh ones over 32 MiB at every call."""
  libc = ctypes.CDLL("libc.so.6")
  m_trim_threshold, m_mmap_threshold = -1, -3
  for option in (m_mmap_threshold, m_trim_threshold):
    if libc.mallopt(option, 1 << 30) != 1:
      raise OSError(f"mallopt({option}) failed")
