"""The main job: ``python -m launch.train --help`` lists every option.

Trains a byte-level transformer LM (launch/model.py) on a shipped text corpus
with sharded params and sharded optimizer state on a device mesh, printing the
mesh, the partition-rule table and the per-device memory plan first, then a
progress line, and writing OUT/metrics.jsonl, OUT/loss.png and checkpoints.
"""

import sys

from launch import cli


def main(argv=None) -> int:
  args = cli.parse_args(argv)
  cli.set_cpu_devices(args.cpu_devices)
  from launch import job  # Imports jax, so only after XLA_FLAGS is set.
  return job.run(args)


if __name__ == "__main__":
  sys.exit(main())
