"""Test set-up: 8 simulated CPU devices, configured before jax is imported."""

import os

os.environ["XLA_FLAGS"] = (
    os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"
).strip()
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import pathlib  # noqa: E402

import jax  # noqa: E402

_CACHE = pathlib.Path(__file__).resolve().parent.parent / ".jax_cache"
jax.config.update("jax_compilation_cache_dir", str(_CACHE))
jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.5)
