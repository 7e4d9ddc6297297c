"""Step time, tokens/s and model FLOPs utilisation (MFU) of the training step.

FLOPs per step are XLA's cost analysis of the step as lowered, before it is
partitioned: the whole mesh's computation, each FLOP counted once (a
compiled device program also counts what devices repeat on replicated
values), except computation a transformation partitions itself
(``shard_map``, custom partitioning: Shampoo's and SOAP's blocks), which is
counted for one device. XLA counts a loop's body once, so a model whose
layers run under a scan is counted from a lowering with its layers written
out (``counted``).
MFU is those FLOPs per second of step time over the mesh's peak:

- on accelerators, the vendor's dense bfloat16 peak per device (``PEAKS``,
  matched on ``device_kind``) times the device count, or ``--peak-tflops``
  (per device) when given;
- on CPU, an estimate: the float32 matmul rate measured on this host at start
  (one 1024 x 1024 product, best of 5) times the process count. The simulated
  devices of one process share its cores, so the device count does not
  multiply it.

Step time is measured in windows between two host syncs (the job's logging
points): ``Window.start`` after the previous sync and any work between steps
(eval, sample, checkpoint save), ``Window.stop`` once the window's results
are fetched. Compilation is done before the first window (``compile_step``).
"""

import dataclasses
import time

import jax
import jax.numpy as jnp

__all__ = ["PEAKS", "Peak", "Window", "compile_step", "data_sheet_peak", "peak_flops"]

# device_kind substring -> dense bfloat16 FLOP/s per device (vendors' data sheets); the first
# that the device_kind contains wins, so a variant comes before its family (the PCIe and NVL
# parts' clocks and power are lower than the SXM parts').
PEAKS = {
    "H200 NVL": 835e12, "H200": 989e12, "H100 PCIe": 756e12, "H100 NVL": 835e12,
    "H100": 989e12, "A100": 312e12,
    "TPU v6 lite": 918e12, "TPU v5 lite": 197e12, "TPU v5": 459e12, "TPU v4": 275e12,
}


@dataclasses.dataclass(frozen=True)
class Peak:
  flops_per_s: float | None  # the whole mesh; None: unknown (no MFU)
  source: str  # how it was obtained, for the header


def compile_step(step, *args, counted=None):
  """(the compiled step, FLOPs of one step over the whole mesh or None): the
  FLOPs of ``counted`` (default ``step``), a step of the same computation
  with no loop to count once, lowered on the same arguments."""
  lowered = step.lower(*args)
  analysis = (lowered if counted is None else counted.lower(*args)).cost_analysis()
  analysis = analysis[0] if isinstance(analysis, (list, tuple)) else analysis
  flops = (analysis or {}).get("flops")
  return lowered.compile(), (float(flops) if flops else None)


def _cpu_matmul_rate(size: int = 1024, repeats: int = 5) -> float:
  a = jnp.ones((size, size), jnp.float32)
  product = jax.jit(lambda a: a @ a)
  product(a).block_until_ready()
  best = float("inf")
  for _ in range(repeats):
    start = time.perf_counter()
    product(a).block_until_ready()
    best = min(best, time.perf_counter() - start)
  return 2 * size**3 / best


def peak_flops(peak_tflops: float | None = None) -> Peak:
  """The mesh's peak FLOP/s and where the figure comes from."""
  devices, kind = jax.device_count(), jax.devices()[0].device_kind
  if peak_tflops:
    return Peak(peak_tflops * 1e12 * devices,
                f"{peak_tflops:g} TFLOP/s per device (--peak-tflops) x {devices}")
  if jax.devices()[0].platform == "cpu":
    rate = _cpu_matmul_rate() * jax.process_count()
    return Peak(rate, f"{rate / 1e9:.0f} GFLOP/s, a float32 matmul measured on this host"
                f" x {jax.process_count()} process(es): an estimate")
  flops = data_sheet_peak(kind)
  if flops is None:
    return Peak(None, f"unknown for {kind!r}: pass --peak-tflops (per device)")
  return Peak(flops * devices, f"{flops / 1e12:g} TFLOP/s dense bfloat16 per {kind} x"
              f" {devices}")


def data_sheet_peak(device_kind: str) -> float | None:
  """The dense bfloat16 FLOP/s of one device of ``device_kind`` (``PEAKS``), or None."""
  return next((flops for name, flops in PEAKS.items() if name in device_kind), None)


class Window:
  """Wall time of the steps between two host syncs."""

  def __init__(self):
    self._t0, self._step0 = None, None

  def start(self, step: int) -> None:
    """Steps after ``step`` are timed from now."""
    self._t0, self._step0 = time.perf_counter(), step

  def stop(self, step: int) -> tuple[int, float]:
    """(steps, seconds) since ``start``; the steps' results must be fetched."""
    return step - self._step0, time.perf_counter() - self._t0
