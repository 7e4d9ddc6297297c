"""Code books, block layout and block-wise quantize/dequantize, hand-checked.

Independent truths: the code tables written out by hand from the papers'
definitions, the nearest entry found by brute force (numpy argmin), error
bounds derived by hand per code (half the widest gap of a table rounded to
its nearest entry; for the companded code, the gap at the top times the
share of it past the boundary) times the block's absmax.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import shardopt
from shardopt._src.quantization import blocks
from shardopt._src.quantization import codes
from shardopt._src.quantization import packing

# (bits, signed, code)
BOOKS = [(8, True, "dynamic"), (8, False, "dynamic"), (4, True, "dynamic"),
         (4, False, "dynamic"), (8, True, "companded"), (8, False, "companded"),
         (4, True, "companded"), (4, False, "companded")]


def _encode(book, entries):
  """Indices of values in units of a scale of 1, given as what the entries
  are of (for a root book, roots)."""
  x = np.square(entries) if book.root else entries
  return jax.jit(lambda v: codes.encode(v, 1.0, book))(jnp.asarray(x))


def _decode(book, index):
  """The entries at ``index`` (for a root book, the roots of the values)."""
  return _coded(book, np.asarray(jax.jit(lambda i: codes.decode(i, 1.0, book))(index)))


def _round_trip(book, bits, tile, x):
  """(QuantizedArray, dequantized numpy array) of ``x``, jitted."""
  q = jax.jit(lambda v: blocks.quantize(v, tile, book, bits))(jnp.asarray(x))
  got = jax.jit(lambda q: blocks.dequantize(q, tile, book, bits, jnp.float32))(q)
  return q, np.asarray(got)


def test_four_bit_tables_by_hand():
  signed = [0.01, 0.055, 0.1, 0.325, 0.55, 0.775, 1.0]
  np.testing.assert_allclose(codes.code_book(4, True).values,
                             [-v for v in signed[::-1]] + [0.0] + signed, rtol=1e-6)
  np.testing.assert_allclose(codes.code_book(4, False).values,
                             np.arange(1, 17) / 16, rtol=0)
  # Companded: y = k / 7 expands to x = y / (2 - y) = k / (14 - k).
  companded = [1 / 13, 2 / 12, 3 / 11, 4 / 10, 5 / 9, 6 / 8, 1.0]
  np.testing.assert_allclose(codes.code_book(4, True, "companded").values,
                             [-v for v in companded[::-1]] + [0.0] + companded,
                             rtol=1e-6)
  # Minifloat e4m0: the powers of two 2**-15 ... 1.
  np.testing.assert_array_equal(codes.code_book(4, False, "companded").values,
                                2.0 ** np.arange(-15, 1))


def test_eight_bit_companded_tables_by_hand():
  k = np.arange(1, 128)
  np.testing.assert_allclose(
      codes.code_book(8, True, "companded").values,
      np.concatenate([-(k / (254 - k))[::-1], [0.0], k / (254 - k)]), rtol=1e-6)
  # Minifloat e5m3: octave 2**e (e = -31 ... -1) in 8 steps, then 1.
  octaves = 2.0 ** np.arange(-31, 0)
  np.testing.assert_array_equal(
      codes.code_book(8, False, "companded").values,
      np.append((octaves[:, None] * (1 + np.arange(8) / 8)).ravel(), 1.0))


@pytest.mark.parametrize("bits,signed,code,size,smallest", [
    (8, True, "dynamic", 255, 1e-6), (8, False, "dynamic", 256, 1e-7),
    (4, True, "dynamic", 15, 1e-2), (4, False, "dynamic", 16, 1 / 16),
    (8, True, "companded", 255, 1 / 253), (8, False, "companded", 249, 2.0 ** -31),
    (4, True, "companded", 15, 1 / 13), (4, False, "companded", 16, 2.0 ** -15)])
def test_table_sizes_extremes_and_zero(bits, signed, code, size, smallest):
  book = codes.code_book(bits, signed, code)
  values = book.values
  assert len(values) == size <= 2 ** bits
  assert np.all(np.diff(values) > 0)
  assert values[-1] == 1.0
  zero_entry = signed or book.kind == "dynamic"
  assert values[0] == (-1.0 if signed else (0.0 if zero_entry else smallest))
  np.testing.assert_allclose(values[values > 0].min(), smallest, rtol=1e-6)
  assert (0.0 in values) == zero_entry


def _compand(book, x):
  """Where ``book`` rounds: the compander for a companded book, else ``x``."""
  return 2 * x / (1 + np.abs(x)) if book.kind == "companded" else x


@pytest.mark.parametrize("bits,signed,code", BOOKS)
def test_encode_is_the_nearest_entry(bits, signed, code):
  """Nearest in ``x``; for the companded code nearest in ``2x / (1 + |x|)``."""
  book = codes.code_book(bits, signed, code)
  rng = np.random.default_rng(0)
  low = -1.0 if signed else 0.0
  x = np.concatenate([rng.uniform(low, 1, 20_000), rng.uniform(low, 1, 5_000) * 1e-3,
                      rng.uniform(low, 1, 5_000) * 1e-6]).astype(np.float32)
  got = _compand(book, _decode(book, _encode(book, x)).astype(np.float64))
  y, table = _compand(book, x.astype(np.float64)), _compand(book, book.values)
  nearest = np.abs(y[:, None] - table[None, :]).min(axis=1)
  error = np.abs(got - y)
  zero_point = (x > 0) & (got == table[table > 0].min())  # never 0
  assert np.all((error <= nearest * (1 + 1e-5) + 1e-7) | zero_point)


@pytest.mark.parametrize("bits,signed,code", BOOKS)
def test_every_entry_encodes_to_itself(bits, signed, code):
  book = codes.code_book(bits, signed, code)
  index = _encode(book, book.values)
  np.testing.assert_array_equal(np.asarray(index), np.arange(len(book.values)))
  np.testing.assert_array_equal(_decode(book, index), book.values)


@pytest.mark.parametrize("bits,code", [(8, "dynamic"), (8, "companded"), (4, "dynamic"),
                                       (4, "companded")])
def test_unsigned_codes_never_round_a_positive_value_to_zero(bits, code):
  book = codes.code_book(bits, False, code)
  x = jnp.asarray([0.0, 1e-30, 1e-9, 1e-3, -0.5], jnp.float32)
  got = np.asarray(jax.jit(lambda v: codes.decode(codes.encode(v, 1.0, book),
                                                  1.0, book))(x))
  assert np.all(got[1:4] > 0)
  first = book.values[0] ** (2 if book.root else 1)  # 0, or zero-free's first
  assert got[0] == got[4] == first


def test_pack_puts_two_indices_per_byte():
  index = jnp.asarray([[1, 2, 15, 0], [7, 8, 3, 4]], jnp.uint8)
  packed = packing.pack(index, axis=1)
  np.testing.assert_array_equal(np.asarray(packed), [[0xF1, 0x02], [0x37, 0x48]])
  np.testing.assert_array_equal(np.asarray(packing.unpack(packed, axis=1)), index)
  np.testing.assert_array_equal(np.asarray(packing.unpack(packing.pack(index, 0), 0)), index)


@pytest.mark.parametrize("axis", [0, 1, 2])
def test_every_backend_form_of_pack_and_unpack_gives_the_same_bytes(axis):
  # XLA:CPU compiles one form, other backends the other (platform_dependent):
  # both against the layout written out with numpy.
  rng = np.random.default_rng(axis)
  index = rng.integers(0, 16, (4, 6, 8)).astype(np.uint8)
  low, high = np.split(index, 2, axis=axis)
  expected = low | (high << 4)
  for pack in (packing._pack_halves, packing._pack_by_window_sum, packing.pack):
    packed = jax.jit(pack, static_argnums=1)(jnp.asarray(index), axis)
    np.testing.assert_array_equal(np.asarray(packed), expected)
  for unpack in (packing._unpack_by_shifts, packing._unpack_concatenated,
                 packing.unpack):
    got = jax.jit(unpack, static_argnums=1)(jnp.asarray(expected), axis)
    np.testing.assert_array_equal(np.asarray(got), index)


@pytest.mark.parametrize("signed", [True, False])
def test_every_backend_form_of_the_block_absmax_agrees(signed):
  # Blocks of 16 along the last axis: random values, one block all
  # negative, one all zero, one all non-finite, one value of each kind of
  # non-finite in others.
  rng = np.random.default_rng(3)
  x = rng.normal(size=(6, 4, 16)).astype(np.float32)
  x[0, 1] = -np.abs(x[0, 1])
  x[1, 2] = 0.0
  x[2, 0] = [np.nan, np.inf, -np.inf, np.nan] * 4
  x[3, 3, 5], x[4, 1, 0], x[5, 2, 9] = np.nan, np.inf, -np.inf
  finite = np.where(np.isfinite(x), x, 0.0)
  expected = (np.abs(finite) if signed else np.maximum(finite, 0.0)).max(
      axis=2, keepdims=True)
  for form in (blocks._absmax_two_valued, blocks._absmax_of_magnitudes,
               blocks._absmax):
    got = jax.jit(lambda b: form(b, (2,), signed))(jnp.asarray(x))
    np.testing.assert_array_equal(np.asarray(got), expected)


def test_tiles_fill_from_the_last_dimension_and_fit_the_shards():
  assert blocks.choose_tile((64, 128), 256, (64, 128)) == (2, 128)
  assert blocks.choose_tile((256, 64), 256, (64, 32)) == (8, 32)
  assert blocks.choose_tile((64, 4, 16), 256, (32, 1, 8)) == (32, 1, 8)
  assert blocks.choose_tile((6, 6), 16, (6, 6)) is None  # only 2 x 2 fits


def _coded(book, x):
  """What the codes represent: ``x``, or its root for a ``root`` book."""
  return np.sqrt(np.maximum(x, 0)) if book.root else x


# The largest |x - decode(encode(x))| over [-1, 1] (signed) or [0, 1], by hand:
# dynamic, half the widest gap (the top decade's 2**levels steps of 0.9);
# linear zero-free, the distance from 0 to its first entry 1 / 2**bits;
# companded (x_k = k / (2L - k)), from the boundary (2L - 1) / (2L + 1) up
# to 1: 2 / (2L + 1), the widest (the gap past the boundary grows with k);
# minifloat, half the top octave's step: (1/2) / 2**mantissa_bits / 2.
MAX_ERROR = {
    "dynamic-signed-8": 0.9 / 64 / 2, "dynamic-unsigned-8": 0.9 / 128 / 2,
    "dynamic-signed-4": 0.9 / 4 / 2, "linear-zero-free-sqrt-4": 1 / 16,
    "linear-zero-free-sqrt-8": 1 / 256, "companded-signed-8": 2 / 255,
    "companded-signed-4": 2 / 15, "minifloat-zero-free-8": 1 / 32,
    "minifloat-zero-free-4": 1 / 4,
}


@pytest.mark.parametrize("bits,signed,code", BOOKS)
def test_stated_error_bounds(bits, signed, code):
  book = codes.code_book(bits, signed, code)
  np.testing.assert_allclose(codes.max_error(book), MAX_ERROR[book.name], rtol=1e-5)


@pytest.mark.parametrize("bits,signed,code", BOOKS)
def test_block_round_trip_error_is_bounded_per_block(bits, signed, code):
  book = codes.code_book(bits, signed, code)
  rng = np.random.default_rng(1)
  x = rng.standard_normal((8, 64)) * np.logspace(-4, 2, 8)[:, None]
  x = (x if signed else x ** 2).astype(np.float32)
  q, got = _round_trip(book, bits, (1, 32), x)
  assert q.codes.dtype == jnp.uint8
  assert q.codes.shape == ((8, 64) if bits == 8 else (8, 32))
  absmax = np.abs(x).reshape(8, 2, 32).max(axis=2)
  np.testing.assert_array_equal(np.asarray(q.scales), absmax)
  # The error bound holds for what the codes represent (a root book: roots).
  x, got = _coded(book, x), _coded(book, got)
  bound = _coded(book, absmax) * MAX_ERROR[book.name] * (1 + 1e-5)
  error = np.abs(got - x).reshape(8, 2, 32).max(axis=2)
  assert np.all(error <= bound)
  # The absmax element of each block is stored exactly (its root, up to the
  # rounding of squaring it back, for a root book).
  blocks_x, blocks_got = x.reshape(16, 32), got.reshape(16, 32)
  top = np.abs(blocks_x).argmax(axis=1)
  np.testing.assert_allclose(blocks_got[np.arange(16), top],
                             blocks_x[np.arange(16), top], rtol=1e-6 if book.root else 0)


@pytest.mark.parametrize("bits,signed,code", BOOKS)
def test_zero_blocks_stay_zero(bits, signed, code):
  book = codes.code_book(bits, signed, code)
  x = np.zeros((2, 32), np.float32)
  x[1] = 1.0
  q, got = _round_trip(book, bits, (1, 32), x)
  np.testing.assert_array_equal(np.asarray(q.scales), [[0.0], [1.0]])
  np.testing.assert_array_equal(got, x)


@pytest.mark.parametrize("code", codes.CODES)
def test_signed_extremes_and_unsigned_negatives(code):
  x = np.asarray([[-3.0, 3.0, 0.0, 1.5]], np.float32)
  _, got = _round_trip(codes.code_book(8, True, code), 8, (1, 4), x)
  np.testing.assert_array_equal(got[0, :3], [-3.0, 3.0, 0.0])
  book = codes.code_book(8, False, code)
  q, got = _round_trip(book, 8, (1, 4), x)
  # 0, or a zero-free book's first entry (of a root book, squared) times 3.
  smallest = book.values[0] ** (2 if book.root else 1) * 3.0
  np.testing.assert_allclose(got[0, :3], [smallest, 3.0, smallest], rtol=1e-6)
  # An unsigned block's scale is its largest value, however negative the rest.
  q, _ = _round_trip(book, 8, (1, 4), np.asarray([[-5.0, 2.0, 0.0, 1.0],
                                                   [-5.0, -1.0, -2.0, -0.5]],
                                                  np.float32))
  np.testing.assert_array_equal(np.asarray(q.scales), [[2.0], [0.0]])


@pytest.mark.parametrize("bits,signed,code", BOOKS)
def test_a_non_finite_value_stays_in_its_element(bits, signed, code):
  book = codes.code_book(bits, signed, code)
  rng = np.random.default_rng(2)
  x = rng.uniform(0.1, 1.0, (3, 16)).astype(np.float32)
  if signed:
    x[:, ::2] *= -1
  bad, zeroed = x.copy(), x.copy()
  bad[0, 3], bad[1, 5], bad[2, 7] = np.nan, np.inf, -np.inf
  zeroed[0, 3] = zeroed[1, 5] = zeroed[2, 7] = 0.0
  _, clean = _round_trip(book, bits, (1, 16), zeroed)  # as if absent
  q, got = _round_trip(book, bits, (1, 16), bad)
  scales = np.asarray(q.scales)[:, 0]
  assert np.all(np.isfinite(scales)) and np.all(np.isfinite(got))
  assert got[1, 5] == scales[1]  # inf saturates to the block's scale
  # -inf to -scale; an unsigned book stores it as its smallest entry.
  smallest = book.values[0] ** (2 if book.root else 1)
  assert got[2, 7] == (-scales[2] if signed else smallest * scales[2])
  nearest_zero = book.values[np.abs(book.values).argmin()]
  assert got[0, 3] == nearest_zero ** (2 if book.root else 1) * scales[0]  # nan
  for row, skip in ((0, 3), (1, 5), (2, 7)):
    keep = np.arange(16) != skip
    assert scales[row] == np.abs(x[row, keep]).max()  # the finite absmax
    np.testing.assert_array_equal(got[row, keep], clean[row, keep])
    bound = _coded(book, scales[row]) * MAX_ERROR[book.name] * (1 + 1e-5)
    assert np.all(np.abs(_coded(book, got[row, keep]) - _coded(book, x[row, keep]))
                  <= bound)


def test_four_bit_second_moments_store_the_root_by_hand():
  book = codes.code_book(4, False)
  assert book.root and book.name == "linear-zero-free-sqrt-4"
  x = np.asarray([[0.25, 1.0, 0.0, 0.01]], np.float32)  # roots .5, 1, 0, .1
  q, got = _round_trip(book, 4, (1, 4), x)
  assert float(q.scales[0, 0]) == 1.0
  np.testing.assert_allclose(got[0], [0.25, 1.0, (1 / 16) ** 2, (2 / 16) ** 2],
                             rtol=1e-6)


def test_companded_momentum_by_hand():
  """8-bit: 0.5 compands to 2/3, 84.67 steps of 1/127, stored as step 85,
  which expands to 85 / (254 - 85); the block's absmax is 4."""
  book = codes.code_book(8, True, "companded")
  x = np.asarray([[-4.0, 2.0, 0.0, 4.0 / 253]], np.float32)
  q, got = _round_trip(book, 8, (1, 4), x)
  np.testing.assert_array_equal(np.asarray(q.codes), [[0, 127 + 85, 127, 128]])
  np.testing.assert_allclose(got[0], [-4.0, 4 * 85 / 169, 0.0, 4.0 / 253], rtol=1e-6)


@pytest.mark.parametrize("bits", [8, 4])
def test_quantized_state_takes_the_code(bits):
  """``quantized_state(..., code="dynamic")`` stores each moment in the
  dynamic family's books and its Adam update stays near float state's."""
  rng = np.random.default_rng(3)
  params = {"w": jnp.asarray(rng.standard_normal((64, 128)), jnp.float32)}
  tx = shardopt.quantized_state(shardopt.adam(1e-2), bits, code="dynamic")
  report = shardopt.describe_quantized_state(tx, params)
  assert {l.path: l.stored for l in report.leaves} == {
      "[0].mu['w']": f"dynamic-signed-{bits}",
      "[0].nu['w']": {8: "dynamic-unsigned-8", 4: "linear-zero-free-sqrt-4"}[bits]}
  exact = shardopt.adam(1e-2)
  state, float_state = tx.init(params), exact.init(params)
  for _ in range(3):
    grads = {"w": jnp.asarray(rng.standard_normal((64, 128)), jnp.float32)}
    got, state = jax.jit(tx.update)(grads, state, params)
    want, float_state = exact.update(grads, float_state, params)
  error = np.abs(np.asarray(got["w"]) - np.asarray(want["w"])).mean()
  assert error / np.abs(np.asarray(want["w"])).mean() < (0.05 if bits == 8 else 0.25)
  with pytest.raises(ValueError, match="code='linear'"):
    shardopt.quantized_state(shardopt.adam(1e-2), bits, code="linear")


@pytest.mark.default_codegen
@pytest.mark.parametrize("bits,code", [(8, "companded"), (4, "companded"),
                                       (4, "dynamic")])
def test_the_other_backends_forms_give_the_same_state(bits, code):
  # The forms XLA:CPU does not compile (benchmarks.backend_forms swaps them
  # in), through AdamW's whole quantized update: the same state and params
  # bit for bit after 3 steps, from a program that differs.
  from benchmarks import backend_forms
  rng = np.random.default_rng(bits)
  params = {k: jnp.asarray(rng.normal(size=(16, 512)), jnp.float32)
            for k in ("a", "b")}
  tx = shardopt.quantized_state(shardopt.adamw(1e-2, weight_decay=1e-4),
                                bits=bits, code=code)

  def run():
    step = jax.jit(lambda p, g, s: tx.update(g, s, p))
    p, s = params, tx.init(params)
    for i in range(3):
      grads = jax.tree.map(lambda x: jnp.sin(x * (i + 1)), p)
      updates, s = step(p, grads, s)
      p = shardopt.apply_updates(p, updates)
    return p, s, step.lower(p, grads, s).as_text()

  p, s, program = run()
  with backend_forms.swapped("all"):
    p_other, s_other, program_other = run()
  assert program_other != program
  for x, y in zip(jax.tree.leaves((p, s)), jax.tree.leaves((p_other, s_other))):
    np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


@pytest.mark.parametrize("bits", [8, 4])
def test_the_update_exports_for_several_platforms(bits):
  # jax.export lowers every platform's form behind a platform index; the
  # exported update called here equals the jitted one bit for bit.
  from jax import export
  params = {"a": jnp.asarray(np.random.default_rng(0).normal(size=(16, 512)),
                             jnp.float32)}
  tx = shardopt.quantized_state(shardopt.adamw(1e-2), bits=bits)
  state = tx.init(params)
  update = jax.jit(lambda p, g, s: tx.update(g, s, p))
  exported = export.export(update, platforms=("cpu", "cuda", "tpu"))(
      params, params, state)
  assert exported.platforms == ("cpu", "cuda", "tpu")
  for x, y in zip(jax.tree.leaves(exported.call(params, params, state)),
                  jax.tree.leaves(update(params, params, state))):
    np.testing.assert_array_equal(np.asarray(x), np.asarray(y))
