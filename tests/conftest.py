"""Test set-up: 8 simulated CPU devices, configured before jax is imported."""

import os

# LLVM at -O0: the suite compiles thousands of small programs, and XLA's
# backend compile is most of its time; -O0 cuts the suite's CPU time by a
# third (a harness subset: 175 -> 112 CPU-seconds). (XLA:CPU's elemental
# emitter, --xla_cpu_use_fusion_emitters=false, would halve the compiles
# again but moves L-BFGS's line search off optax's decisions.) The flags
# reach every subprocess a test starts (launch_helpers.child_env), so
# in-process references and jobs compile alike.
os.environ["XLA_FLAGS"] = (
    os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"
    " --xla_backend_optimization_level=0"
).strip()
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import pathlib  # noqa: E402

import jax  # noqa: E402

# Every program in the persistent cache, however quick to compile: the two
# xdist workers and the jobs tests start compile many of the same programs
# (an entry's unsharded reference, a job and its resume); the job tests took
# 102 s instead of 121 s with it than with a 0.5 s threshold.
_CACHE = pathlib.Path(__file__).resolve().parent.parent / ".jax_cache"
jax.config.update("jax_compilation_cache_dir", str(_CACHE))
jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
