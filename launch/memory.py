"""Bytes per param of the training state and of the compiled step, for the
job's header.

The params' and the optimizer state's bytes are their global arrays' bytes
(every element once, replicas not counted), over the param count. The step's
peak is XLA's ``memory_analysis()`` of the compiled train step, the program
of one device: its arguments and outputs, less the outputs written into
donated arguments, plus its temporaries. Backends that keep host memory
apart (GPU, TPU) report the host part separately (state offloaded with
--state-memory-kind pinned_host); on CPU both are host RAM and it is 0.
"""

import jax

__all__ = ["describe", "step_peak"]


def _nbytes(tree) -> int:
  return sum(leaf.nbytes for leaf in jax.tree.leaves(tree))


def step_peak(compiled) -> tuple[int, int]:
  """(device bytes, host bytes) one device's program holds at its peak."""
  m = compiled.memory_analysis()
  device = (m.argument_size_in_bytes + m.output_size_in_bytes - m.alias_size_in_bytes
            + m.temp_size_in_bytes)
  host = (m.host_argument_size_in_bytes + m.host_output_size_in_bytes
          - m.host_alias_size_in_bytes + m.host_temp_size_in_bytes)
  return device, host


def describe(params, opt_state, compiled) -> list[str]:
  """The header lines: bytes per param of the params, the optimizer state
  and the train step's peak (per device, and over all devices per param)."""
  n_params = sum(leaf.size for leaf in jax.tree.leaves(params))
  devices = jax.device_count()
  device, host = step_peak(compiled)
  host_part = f" + {host / 2**20:.2f} MiB of host memory" if host else ""
  per_param = device * devices / n_params
  return [
      f"bytes per param: params {_nbytes(params) / n_params:.3f}, optimizer state"
      f" {_nbytes(opt_state) / n_params:.3f} ({n_params:,} params; every element once)",
      f"train step peak: {device / 2**20:.2f} MiB per device{host_part} (XLA's"
      " memory_analysis: arguments + outputs - donated + temporaries),"
      f" {per_param:.2f} bytes per param over the {devices} devices",
  ]
