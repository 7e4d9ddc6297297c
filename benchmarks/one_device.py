"""What the one-device AdamW benchmarks (``update_bandwidth``,
``backend_forms``, ``minimal_quantized``) share: the optimizer per state
variant, the problem (a tree of float32 matrices on one device), the
options, the kernel count of a compiled update and the results file's
command line."""

import argparse
import os
import pathlib
import re
import sys

import jax
import jax.numpy as jnp
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import shardopt


def optimizer(variant):
  """AdamW with float32 state (``variant`` None) or ``quantized_state`` of
  ``variant = (bits, code)``."""
  tx = shardopt.adamw(1e-3, weight_decay=1e-4)
  if variant is None:
    return tx
  bits, code = variant
  return shardopt.quantized_state(tx, bits=bits, code=code)


def tree(leaves: int, rows: int, cols: int, seed: int):
  keys = jax.random.split(jax.random.key(seed), leaves)
  normal = jax.jit(lambda k: jax.random.normal(k, (rows, cols), jnp.float32))
  return {f"w{i}": normal(k) for i, k in enumerate(keys)}


def problem(args):
  """(params, grads, shardings): ``args.leaves`` random matrices of
  ``args.rows`` x ``args.cols`` on a one-device mesh, gradients 1e-3 times
  another draw."""
  mesh = jax.make_mesh((1,), ("data",), devices=jax.devices()[:1])
  params = tree(args.leaves, args.rows, args.cols, 0)
  grads = jax.tree.map(lambda g: 1e-3 * g,
                       tree(args.leaves, args.rows, args.cols, 1))
  shardings = jax.tree.map(lambda _: NamedSharding(mesh, P()), params)
  return params, grads, shardings


def fusions(compiled_text: str) -> int:
  """The fused kernels (``fusion`` instructions) of a compiled program's
  entry computation."""
  entry = compiled_text[compiled_text.index("ENTRY"):]
  return len(re.findall(r"= \S+ fusion\(", entry))


def parse_arguments(module, description, results, rounds, steps, argv):
  """(arguments, the command line) of a one-device AdamW benchmark: the
  tree (``--leaves`` matrices of ``--rows`` x ``--cols``), the timing and
  the results file."""
  parser = argparse.ArgumentParser(description=description)
  parser.add_argument("--leaves", type=int, default=16)
  parser.add_argument("--rows", type=int, default=4096)
  parser.add_argument("--cols", type=int, default=4096)
  parser.add_argument("--rounds", type=int, default=rounds)
  parser.add_argument("--steps", type=int, default=steps,
                      help="timed updates per variant in each round")
  parser.add_argument("--results", type=pathlib.Path, default=results)
  args = parser.parse_args(argv)
  command = f"python -m {module} " + " ".join(
      sys.argv[1:] if argv is None else argv)
  return args, command.strip()


def command_line(command: str) -> str:
  """The results file's line naming the command, where and what ran it."""
  device = jax.devices()[0]
  platforms = os.environ.get("JAX_PLATFORMS")
  where = f", JAX_PLATFORMS={platforms}" if platforms else ""
  return (f"Command: `{command}` (from the repository root{where})."
          f" One {device.device_kind} ({device.platform}), jax {jax.__version__}.")
