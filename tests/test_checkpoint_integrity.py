"""Checkpoint integrity: checksums written at save and verified on restore, what counts as corruption,
construction errors, and Orbax noise kept off the terminal."""

import errno
import gc
import hashlib
import json
import os
import pathlib
import shutil
import sys

import jax
import jax.numpy as jnp
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P_
import numpy as np
import orbax.checkpoint as ocp
import pytest
import tensorstore

import checkpoints as ck
from checkpoints import integrity
from checkpoints import integrity_v2
from checkpoints import layout
from checkpoints import quiet

MESHES = {"2x4": (2, 4), "4x2": (4, 2), "8x1": (8, 1)}


def _mesh(shape):
  return jax.make_mesh(shape, ("a", "b"), axis_types=(jax.sharding.AxisType.Auto,) * 2)


def _sharding(where, spec=None):
  if where == "1dev":
    return jax.sharding.SingleDeviceSharding(jax.devices()[0])
  return NamedSharding(_mesh(MESHES[where]), P_("a", "b") if spec is None else spec)


def _state(where="2x4", seed=0):
  """A small state: one big leaf (most of the data file), a quantized int8 leaf, a step and a key."""
  k1, k2 = jax.random.split(jax.random.key(seed))
  return {
      "params": {"w": jax.device_put(jax.random.normal(k1, (512, 1024)), _sharding(where))},
      "opt_state": {"codes": jax.device_put(jax.random.randint(k2, (64, 128), -128, 127, jnp.int8),
                                            _sharding(where, P_("b", None)) if where != "1dev" else _sharding(where))},
      "step": jnp.int32(seed),
      "rng": jax.random.key(seed),
  }


def _target(where):
  def leaf(x, spec):
    sharding = _sharding(where, spec) if where != "1dev" else _sharding(where)
    return jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=sharding)
  state = jax.eval_shape(lambda: _state("1dev"))
  specs = {"params": {"w": P_("a", "b")}, "opt_state": {"codes": P_("b", None)}, "step": P_(), "rng": P_()}
  return jax.tree.map(leaf, state, specs)


def _assert_bit_equal(got, want):
  for x, y in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
    if jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key):
      x, y = jax.random.key_data(x), jax.random.key_data(y)
    np.testing.assert_array_equal(np.asarray(x).reshape(-1).view(np.uint8), np.asarray(y).reshape(-1).view(np.uint8))


def _save_steps(directory, steps=(1, 2)):
  with ck.CheckpointManager(directory, ck.CheckpointPolicy(async_save=False)) as mngr:
    for step in steps:
      mngr.save(step, _state(seed=step), metadata={"pos": step})


def _flip_middle_of_largest_data_file(step_dir, n=64, at=0.5):
  files = [p for p in (step_dir / "state").rglob("*") if p.is_file() and p.parent.name == "d"]
  path = max(files, key=lambda p: p.stat().st_size)
  data = bytearray(path.read_bytes())
  mid = int(len(data) * at)
  data[mid:mid + n] = bytes(b ^ 0xFF for b in data[mid:mid + n])
  path.write_bytes(bytes(data))


# The checksum itself ----------------------------------------------------

P = 2**61 - 1
SEED = 12345


def _words(x: np.ndarray) -> np.ndarray:
  """The documented words of ``x``, as Python-int-safe uint64 (shape: the word matrix's)."""
  x = np.asarray(x).reshape(x.shape or (1,))
  if x.dtype == np.bool_:
    return x.astype(np.uint64)
  if jax.dtypes.itemsize_bits(x.dtype) < 8:
    return (x.view(np.uint8) & ((1 << jax.dtypes.itemsize_bits(x.dtype)) - 1)).astype(np.uint64)
  if x.dtype.itemsize < 4:
    return x.view(np.uint8 if x.dtype.itemsize == 1 else np.uint16).astype(np.uint64)
  return x.view(np.uint32).astype(np.uint64)


def _matrix(x: np.ndarray) -> np.ndarray:
  """The documented word matrix: leading dims x last dim, a 0-d or 1-d leaf in rows of ROW words."""
  u = _words(x)
  if u.ndim > 1:
    return u
  padded = np.zeros(-(-u.size // integrity.ROW) * integrity.ROW, np.uint64)
  padded[:u.size] = u  # zeros add nothing to the sums
  return padded.reshape(-1, integrity.ROW)


def _reference_checksum(x, seed=SEED) -> list[int]:
  """The documented formula with Python integers: exact row and column sums, then
  sum of s[i] * prod_d z_d ** i_d mod P."""
  m = _matrix(np.asarray(x))
  rows, columns = m.sum(axis=-1), m.reshape(-1, m.shape[-1]).sum(axis=0)
  row_points = [integrity.point(seed, "row", d) for d in range(rows.ndim)]
  column_point = integrity.point(seed, "column", 0)
  row_value = sum(int(s) * np.prod([pow(z, i, P) for z, i in zip(row_points, idx)], dtype=object)
                  for idx, s in np.ndenumerate(rows)) % P
  column_value = sum(int(s) * pow(column_point, j, P) for j, s in enumerate(columns)) % P
  return [row_value, column_value]


CHECKSUM_CASES = {
    "f32-2d": lambda k: jax.random.normal(k, (64, 96)),
    "bf16-2d": lambda k: jax.random.normal(k, (64, 96)).astype(jnp.bfloat16),
    "int8-3d": lambda k: jax.random.randint(k, (8, 16, 24), -128, 127, jnp.int8),
    "bool-2d": lambda k: jax.random.bernoulli(k, 0.5, (64, 96)),
    "int4-2d": lambda k: jax.random.randint(k, (64, 96), -8, 7, jnp.int8).astype(jnp.int4),
    "f32-1d-long": lambda k: jax.random.normal(k, (3 * 4096 * 8 + 24,)),  # rows of 4096 words, a partial one
    "u32-0d": lambda k: jax.random.bits(k, (), jnp.uint32),
}


@pytest.mark.parametrize("case", list(CHECKSUM_CASES))
def test_checksum_equals_the_formula_on_any_layout_on_host_and_on_device(case):
  x = CHECKSUM_CASES[case](jax.random.key(1))
  want = _reference_checksum(np.asarray(x))
  layouts = {"numpy": np.asarray(x), "1dev": jax.device_put(x, jax.devices()[0])}
  if x.ndim >= 1:
    spec = P_(*(["a", "b"] + [None] * x.ndim)[:x.ndim]) if x.ndim >= 2 else P_(("a", "b"))
    for name in ("2x4", "4x2", "8x1"):
      layouts[name] = jax.device_put(x, _sharding(name, spec))
    layouts["replicated"] = jax.device_put(x, _sharding("2x4", P_()))
  for name, value in layouts.items():
    assert integrity.checksums({"x": value}, SEED)["x"] == want, name
  for name in ("1dev", "2x4") if x.ndim >= 1 else ("1dev",):  # the accelerator path, run on CPU shards
    assert integrity.checksums({"x": layouts[name]}, SEED, force_device=True)["x"] == want, name


def _flip(x: np.ndarray, *changes) -> np.ndarray:
  """``x`` (float32) with bits XORed into its words: ``(index, bits)`` pairs."""
  y = np.array(x, np.float32)
  for index, bits in changes:
    y.view(np.uint32)[index] ^= np.uint32(bits)
  return y


def _damage_cases():
  """(name, intact, damaged): structured damage of the kinds the checksum must catch."""
  w = np.asarray(jax.random.normal(jax.random.key(3), (64, 96)))
  positive = [idx for idx in zip(*np.nonzero(w > 0)) if idx[0] % 2 == 0 and idx[1] % 2 == 0]
  negative = [idx for idx in zip(*np.nonzero(w < 0)) if idx[0] % 2 == 0 and idx[1] % 2 == 0]
  sign = 1 << 31
  scales = np.abs(w) + 0.5  # absmax scales of quantized blocks: all positive
  small = np.abs(w) < 2  # exponent bit 30 clear
  i = next(i for i in range(92) if small[5, i] and not small[5, i + 4])
  block = np.array(w)
  block[:32, :64] *= -1  # 2048 values of both signs
  negated_scales = np.array(scales)
  negated_scales[8:12, 16:20] *= -1
  return [
      ("paired sign flips, same direction", w, _flip(w, (positive[0], sign), (positive[1], sign))),
      ("paired sign flips, opposite directions", w, _flip(w, (positive[0], sign), (negative[0], sign))),
      ("negated 4x4 block of scales", scales, negated_scales),
      ("exponent bit set at one index, cleared 4 further", w, _flip(w, ((5, i), 1 << 30), ((5, i + 4), 1 << 30))),
      ("2048 values negated", w, block.astype(np.float32)),
  ]


@pytest.mark.parametrize("case", range(5), ids=[c[0] for c in _damage_cases()])
def test_structured_damage_changes_the_checksum(case):
  _, intact, damaged = _damage_cases()[case]
  assert not np.array_equal(intact, damaged)
  assert integrity.checksums({"x": intact}, SEED) != integrity.checksums({"x": damaged}, SEED)


def test_the_old_checksum_missed_every_one_of_the_structured_cases():
  """Why format 2 was replaced: its sums modulo 2**32 cancel for all of them."""
  for name, intact, damaged in _damage_cases():
    assert integrity_v2.checksums({"x": intact}) == integrity_v2.checksums({"x": damaged}), name


def test_any_change_of_up_to_three_words_or_within_a_row_or_column_is_caught():
  rng = np.random.default_rng(0)
  x = rng.integers(0, 2**32, (24, 40), dtype=np.uint32)
  base = integrity.checksums({"x": x}, SEED)
  for trial in range(300):
    y = x.copy()
    if trial % 3 == 0:  # 1 to 3 words anywhere
      cells = [tuple(rng.integers(0, s) for s in x.shape) for _ in range(rng.integers(1, 4))]
    elif trial % 3 == 1:  # several words of one row
      row = rng.integers(0, 24)
      cells = [(row, c) for c in rng.choice(40, rng.integers(2, 40), replace=False)]
    else:  # several words of one column
      column = rng.integers(0, 40)
      cells = [(r, column) for r in rng.choice(24, rng.integers(2, 24), replace=False)]
    for cell in cells:
      y[cell] = rng.integers(0, 2**32, dtype=np.uint32)
    if not np.array_equal(x, y):
      assert integrity.checksums({"x": y}, SEED) != base, cells


def test_a_change_keeping_every_row_and_column_sum_escapes_as_documented():
  """The stated limit: +d, -d in one row and -d, +d in another at the same columns."""
  x = np.full((4, 4), 1000, np.uint32)
  y = x.copy()
  y[0, 0] += 7
  y[0, 2] -= 7
  y[3, 0] -= 7
  y[3, 2] += 7
  assert integrity.checksums({"x": y}, SEED) == integrity.checksums({"x": x}, SEED)


def test_the_checksum_depends_on_the_seed():
  x = np.asarray(jax.random.normal(jax.random.key(2), (32, 64)))
  assert integrity.checksums({"x": x}, 1) != integrity.checksums({"x": x}, 2)


# Damaged data -----------------------------------------------------------


def _damaged_leaves(directory, step, target):
  """The leaves of ``step`` that plain Orbax (no checksums) fails to read or reads with other bits."""
  want = layout.to_saveable(_state(seed=step))
  damaged = []
  with ocp.CheckpointManager(directory, item_names=("state",)) as plain:
    for name, leaf in layout.named_leaves(target):
      item, restore_args = layout.read_args([(name, leaf)])
      args = ocp.args.PyTreeRestore(item=item, restore_args=restore_args, partial_restore=True)
      try:
        got = plain.restore(step, args=ocp.args.Composite(state=args))["state"][name]
      except Exception:  # noqa: BLE001  (any read failure marks the leaf damaged)
        damaged.append(name)
        continue
      if np.asarray(got).tobytes() != np.asarray(want[name]).tobytes():
        damaged.append(name)
  return damaged


def _damage_step(directory, step, target) -> list[str]:
  """Flips 64 bytes of the step's largest data file until a plain Orbax read
  sees a change (OCDBT packs values in any order, so which leaf is hit
  varies); the damaged leaves."""
  for at in (0.5, 0.4, 0.6):
    _flip_middle_of_largest_data_file(directory / str(step), at=at)
    damaged = _damaged_leaves(directory, step, target)
    if damaged:
      return damaged
  raise AssertionError("three flips of 64 bytes changed no leaf a plain read returns")


def test_flipped_bytes_in_a_data_file_name_leaf_and_step_and_the_previous_step_is_restored(tmp_path):
  _save_steps(tmp_path)
  damaged = _damage_step(tmp_path, 2, _target("2x4"))
  with ck.CheckpointManager(tmp_path) as mngr:
    with pytest.raises(ck.CorruptCheckpointError) as info:
      mngr.restore(_target("2x4"))
    assert info.value.step == 2 and sorted(info.value.leaves) == damaged, str(info.value)
    assert "step 2" in str(info.value) and all(f"'{n}'" in str(info.value) for n in damaged)
    restored = mngr.restore_latest_valid(_target("2x4"))
  assert restored.step == 1 and restored.metadata == {"pos": 1}
  assert [s.step for s in restored.skipped] == [2] and f"'{damaged[0]}'" in restored.skipped[0].reason
  _assert_bit_equal(restored.state, _state(seed=1))


@pytest.mark.parametrize("case", range(5), ids=[c[0] for c in _damage_cases()])
def test_structured_damage_in_a_saved_step_names_the_step_and_the_leaf(tmp_path, case):
  """The damaged values are written by Orbax itself (a decodable step), then take the place of
  the intact step's arrays: only the checksum can tell."""
  _, intact, damaged = _damage_cases()[case]
  sharding = _sharding("2x4", P_("a", "b"))
  state = lambda x: {"params": {"w": jax.device_put(jnp.asarray(x, jnp.float32), sharding)}}
  with ck.CheckpointManager(tmp_path / "run", ck.CheckpointPolicy(async_save=False)) as mngr:
    mngr.save(3, state(intact))
  with ck.CheckpointManager(tmp_path / "other", ck.CheckpointPolicy(async_save=False)) as mngr:
    mngr.save(3, state(damaged))
  shutil.rmtree(tmp_path / "run" / "3" / "state")
  shutil.copytree(tmp_path / "other" / "3" / "state", tmp_path / "run" / "3" / "state")
  target = jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=a.sharding), state(intact))
  with ck.CheckpointManager(tmp_path / "run") as mngr, pytest.raises(ck.CorruptCheckpointError) as info:
    mngr.restore(target)
  assert info.value.step == 3 and info.value.leaves == ("params.w",), str(info.value)
  assert "step 3" in str(info.value) and "'params.w'" in str(info.value)


def test_damage_is_found_when_restoring_onto_another_mesh(tmp_path):
  _save_steps(tmp_path)
  damaged = _damage_step(tmp_path, 2, _target("4x2"))
  with ck.CheckpointManager(tmp_path) as mngr, pytest.raises(ck.CorruptCheckpointError) as info:
    mngr.restore(_target("4x2"))
  assert info.value.step == 2 and sorted(info.value.leaves) == damaged, str(info.value)


@pytest.mark.parametrize("where", ["2x4", "4x2", "8x1", "1dev"])
def test_cross_mesh_restore_is_bit_equal_with_checksums_verified(tmp_path, where, monkeypatch):
  _save_steps(tmp_path, steps=(3,))
  verified = []
  real = integrity.checksums
  monkeypatch.setattr(integrity, "checksums", lambda leaves, *a, **kw: verified.append(sorted(leaves)) or real(leaves, *a, **kw))
  with ck.CheckpointManager(tmp_path) as mngr:
    restored = mngr.restore(_target(where))
  _assert_bit_equal(restored.state, _state(seed=3))
  assert verified == [["opt_state.codes", "params.w", "rng", "step"]]


def test_edited_record_or_metadata_is_corruption(tmp_path):
  _save_steps(tmp_path)
  record_file = tmp_path / "2" / "layout" / "metadata"
  saved = json.loads(record_file.read_text())
  saved["checksums"]["params.w"][0] ^= 1
  record_file.write_text(json.dumps(saved))
  (tmp_path / "1" / "metadata" / "metadata").write_text(json.dumps({"pos": 7}))
  with ck.CheckpointManager(tmp_path) as mngr:
    for step in (1, 2):
      with pytest.raises(ck.CorruptCheckpointError, match=f"step {step} .*digest mismatch"):
        mngr.restore(_target("2x4"), step)


def test_deleted_step_folder_falls_back_and_a_deleted_item_folder_is_skipped(tmp_path):
  _save_steps(tmp_path, steps=(1, 2, 3))
  shutil.rmtree(tmp_path / "3")
  shutil.rmtree(tmp_path / "2" / "state")
  with ck.CheckpointManager(tmp_path) as mngr:
    assert mngr.all_steps() == [1, 2]
    with pytest.raises(ck.NoCheckpointError, match=r"step 3 .*steps there: \[1, 2\]"):
      mngr.restore(_target("2x4"), 3)
    with pytest.raises(ck.CorruptCheckpointError, match="step 2"):
      mngr.restore(_target("2x4"))
    restored = mngr.restore_latest_valid(_target("2x4"))
  assert restored.step == 1 and [s.step for s in restored.skipped] == [2]


@pytest.mark.parametrize("item", ["state", "layout", "metadata"])
def test_a_missing_item_folder_is_named_and_the_step_skipped_as_missing(tmp_path, item):
  _save_steps(tmp_path)
  shutil.rmtree(tmp_path / "2" / item)
  with ck.CheckpointManager(tmp_path) as mngr:
    with pytest.raises(ck.CorruptCheckpointError) as info:
      mngr.restore(_target("2x4"))
    assert info.value.step == 2 and info.value.missing, str(info.value)
    assert f"item folder {item!r}" in str(info.value) and str(tmp_path / "2" / item) in str(info.value)
    restored = mngr.restore_latest_valid(_target("2x4"))
  assert restored.step == 1 and [(s.step, s.missing) for s in restored.skipped] == [(2, True)]
  _assert_bit_equal(restored.state, _state(seed=1))


def test_step_written_before_checksums_restores_unverified_with_a_warning(tmp_path, caplog):
  _save_steps(tmp_path, steps=(1,))
  record_file = tmp_path / "1" / "layout" / "metadata"
  saved = json.loads(record_file.read_text())
  record_file.write_text(json.dumps({"format": "shardopt.checkpoint/1", "leaves": saved["leaves"]}))
  with ck.CheckpointManager(tmp_path) as mngr:
    restored = mngr.restore(_target("4x2"))
  _assert_bit_equal(restored.state, _state(seed=1))
  assert any("without checksums" in r.getMessage() for r in caplog.records)


def test_step_of_format_2_restores_verified_by_its_own_checksum(tmp_path):
  """Steps written before this checksum keep theirs: verified, and damage to them is caught."""
  _save_steps(tmp_path, steps=(1, 2))
  for step in (1, 2):
    record_file = tmp_path / str(step) / "layout" / "metadata"
    saved = json.loads(record_file.read_text())
    metadata = json.loads((tmp_path / str(step) / "metadata" / "metadata").read_text())
    sums = integrity_v2.checksums(layout.to_saveable(_state(seed=step)))
    text = json.dumps({"leaves": saved["leaves"], "checksums": sums, "metadata": metadata}, sort_keys=True)
    record_file.write_text(json.dumps({
        "format": "shardopt.checkpoint/2", "algorithm": integrity_v2.ALGORITHM, "leaves": saved["leaves"],
        "checksums": sums, "digest": hashlib.sha256(text.encode()).hexdigest()}))
  damaged = _damage_step(tmp_path, 2, _target("4x2"))
  with ck.CheckpointManager(tmp_path) as mngr:
    with pytest.raises(ck.CorruptCheckpointError) as info:
      mngr.restore(_target("4x2"))
    assert info.value.step == 2 and sorted(info.value.leaves) == damaged
    _assert_bit_equal(mngr.restore(_target("4x2"), 1).state, _state(seed=1))


# Errors that are not corruption ----------------------------------------------


def test_target_mismatch_is_its_own_error_and_never_falls_back(tmp_path):
  _save_steps(tmp_path)
  target = _target("2x4")
  target["params"]["w"] = jax.ShapeDtypeStruct((512, 512), jnp.float32, sharding=_sharding("2x4"))
  with ck.CheckpointManager(tmp_path) as mngr:
    for restore in (mngr.restore, mngr.restore_latest_valid):
      with pytest.raises(ck.StructureMismatchError, match=r"params.w: saved float32\(512, 1024\) vs target"):
        restore(target)


def _failing_open(error):
  def open_(*args, **kwargs):
    raise error
  return open_


@pytest.mark.parametrize("error", [
    ValueError('UNAVAILABLE: Error reading "params.w/0.0": connection reset'),
    ValueError('DEADLINE_EXCEEDED: Error reading "params.w/0.0"'),
    OSError(errno.EIO, "Input/output error"),
], ids=["unavailable", "deadline", "eio"])
def test_transient_read_error_propagates_as_itself(tmp_path, monkeypatch, error):
  _save_steps(tmp_path)
  monkeypatch.setattr(tensorstore, "open", _failing_open(error))
  with ck.CheckpointManager(tmp_path) as mngr:
    for restore in (mngr.restore, mngr.restore_latest_valid):
      with pytest.raises(Exception) as info:
        restore(_target("2x4"))
      assert not isinstance(info.value, ck.CheckpointError)
      assert info.value is error or error in _causes(info.value)


def _causes(exc):
  out = []
  while exc is not None:
    out.append(exc)
    exc = exc.__cause__ or exc.__context__
  return out


def test_permission_denied_from_storage_is_a_permission_error(tmp_path, monkeypatch):
  _save_steps(tmp_path)
  denied = ValueError(f'PERMISSION_DENIED: Error opening "params.w/.zarray" in {tmp_path}/2/state')
  monkeypatch.setattr(tensorstore, "open", _failing_open(denied))
  with ck.CheckpointManager(tmp_path) as mngr:
    for restore in (mngr.restore, mngr.restore_latest_valid):
      with pytest.raises(PermissionError, match=r"step 2 .*permission denied") as info:
        restore(_target("2x4"))
      assert not isinstance(info.value, ck.CheckpointError)


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads files whatever their mode")
def test_unreadable_files_are_a_permission_error(tmp_path):
  _save_steps(tmp_path)
  files = [p for p in (tmp_path / "2" / "state").rglob("*") if p.is_file() and p.parent.name == "d"]
  for p in files:
    p.chmod(0)
  try:
    with ck.CheckpointManager(tmp_path) as mngr, pytest.raises(PermissionError, match="step 2"):
      mngr.restore_latest_valid(_target("2x4"))
  finally:
    for p in files:
      p.chmod(0o644)


# Construction -----------------------------------------------------------


def test_a_file_as_directory_fails_at_construction_naming_it(tmp_path):
  path = tmp_path / "ckpt"
  path.write_text("not a directory")
  with pytest.raises(ck.CheckpointDirectoryError, match=f"{path} is a file"):
    ck.CheckpointManager(path)
  assert path.read_text() == "not a directory"


def test_a_local_directory_orbax_would_write_elsewhere_fails_at_construction(tmp_path,
                                                                            monkeypatch):
  """'gs:/b/c' (a bucket URL missing a slash) is a local path to etils but orbax turns its
  'gs:/' into 'gs://', and tensorstore refused it at the first save, after the training."""
  monkeypatch.chdir(tmp_path)
  with pytest.raises(ck.CheckpointDirectoryError, match=f"{tmp_path}/gs:/b/c: orbax reads 'gs:/'"):
    ck.CheckpointManager("gs:/b/c")
  assert not list(tmp_path.iterdir())


def test_an_unwritable_directory_fails_at_construction_naming_it(tmp_path):
  if os.geteuid() == 0:  # root writes through file modes; sysfs refuses new entries to everyone
    path = pathlib.Path("/sys/shardopt_checkpoints")
  else:
    parent = tmp_path / "read_only"
    parent.mkdir(mode=0o555)
    path = parent / "ckpt"
  with pytest.raises(ck.CheckpointDirectoryError, match=f"Cannot write checkpoints to {path}"):
    ck.CheckpointManager(path)


def test_read_only_manager_restores_and_refuses_to_save(tmp_path):
  _save_steps(tmp_path, steps=(1,))
  with ck.CheckpointManager(tmp_path, read_only=True) as mngr:
    _assert_bit_equal(mngr.restore(_target("8x1")).state, _state(seed=1))
    with pytest.raises(ck.CheckpointError, match=r"read_only=True\) cannot save"):
      mngr.save(2, _state(seed=2))
  with pytest.raises(ck.CheckpointDirectoryError, match="does not exist"):
    ck.CheckpointManager(tmp_path / "missing", read_only=True)


# Noise ------------------------------------------------------------------


def test_failed_read_prints_nothing_but_the_error(tmp_path, capfd):
  _save_steps(tmp_path)
  for p in (tmp_path / "2" / "state").rglob("*"):
    if p.is_file() and p.parent.name == "d":
      p.write_bytes(p.read_bytes()[: p.stat().st_size // 2])
  with ck.CheckpointManager(tmp_path) as mngr, pytest.raises(ck.CorruptCheckpointError) as info:
    mngr.restore(_target("2x4"))
  gc.collect()  # abandoned read coroutines report when collected
  assert "tensorstore_spec" not in str(info.value) and len(str(info.value)) < 1000
  err = capfd.readouterr().err
  assert "Traceback" not in err and "Event loop is closed" not in err, err[:2000]


def test_noise_hooks_route_only_orbax_noise_to_debug(capsys, caplog):
  quiet.install()
  caplog.set_level("DEBUG", logger="checkpoints.orbax_noise")
  sys.excepthook(RuntimeError, RuntimeError("Event loop is closed"), None)
  assert "Event loop is closed" not in capsys.readouterr().err
  assert any("event loop closed" in r.getMessage() for r in caplog.records)
  sys.excepthook(RuntimeError, RuntimeError("a real error"), None)
  assert "a real error" in capsys.readouterr().err
