"""Code books, block layout and block-wise quantize/dequantize, hand-checked.

Independent truths: the code tables written out by hand from the papers'
definitions, the nearest entry found by brute force (numpy argmin), error
bounds of half the widest gap between entries times the block's absmax.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from shardopt._src.quantization import blocks
from shardopt._src.quantization import codes

BOOKS = [(8, True), (8, False), (4, True), (4, False)]


def _encode(book, x):
  return jax.jit(lambda v: codes.encode(v, book))(jnp.asarray(x))


def _decode(book, index):
  return np.asarray(jax.jit(lambda i: codes.decode(i, book))(index))


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


@pytest.mark.parametrize("bits,signed,size,smallest", [
    (8, True, 255, 1e-6), (8, False, 256, 1e-7), (4, True, 15, 1e-2),
    (4, False, 16, 1 / 16)])
def test_table_sizes_extremes_and_zero(bits, signed, size, smallest):
  values = codes.code_book(bits, signed).values
  assert len(values) == size <= 2 ** bits
  assert np.all(np.diff(values) > 0)
  assert values[-1] == 1.0
  assert values[0] == (-1.0 if signed else (0.0 if bits == 8 else 1 / 16))
  np.testing.assert_allclose(values[values > 0].min(), smallest, rtol=1e-6)
  assert (0.0 in values) == (bits == 8 or signed)


@pytest.mark.parametrize("bits,signed", BOOKS)
def test_encode_is_the_nearest_entry(bits, signed):
  book = codes.code_book(bits, signed)
  rng = np.random.default_rng(0)
  low = -1.0 if signed else 0.0
  x = np.concatenate([rng.uniform(low, 1, 20_000), rng.uniform(low, 1, 5_000) * 1e-3,
                      rng.uniform(low, 1, 5_000) * 1e-6]).astype(np.float32)
  got = _decode(book, _encode(book, x))
  nearest = np.abs(x[:, None] - book.values[None, :]).min(axis=1)
  error = np.abs(got - x)
  zero_point = (x > 0) & (got == book.values[book.values > 0].min())  # never 0
  assert np.all((error <= nearest * (1 + 1e-6) + 1e-12) | zero_point)


@pytest.mark.parametrize("bits,signed", BOOKS)
def test_every_entry_encodes_to_itself(bits, signed):
  book = codes.code_book(bits, signed)
  index = _encode(book, book.values)
  np.testing.assert_array_equal(np.asarray(index), np.arange(len(book.values)))
  np.testing.assert_array_equal(_decode(book, index), book.values)


def test_unsigned_codes_never_round_a_positive_value_to_zero():
  book = codes.code_book(8, False)
  index = _encode(book, np.asarray([0.0, 1e-30, 1e-9, -0.5], np.float32))
  np.testing.assert_array_equal(np.asarray(index), [0, 1, 1, 0])


def test_pack_puts_two_indices_per_byte():
  index = jnp.asarray([[1, 2, 15, 0], [7, 8, 3, 4]], jnp.uint8)
  packed = codes.pack(index, axis=1)
  np.testing.assert_array_equal(np.asarray(packed), [[0xF1, 0x02], [0x37, 0x48]])
  np.testing.assert_array_equal(np.asarray(codes.unpack(packed, axis=1)), index)
  np.testing.assert_array_equal(np.asarray(codes.unpack(codes.pack(index, 0), 0)), index)


def test_tiles_fill_from_the_last_dimension_and_fit_the_shards():
  assert blocks.choose_tile((64, 128), 256, (64, 128)) == (2, 128)
  assert blocks.choose_tile((256, 64), 256, (64, 32)) == (8, 32)
  assert blocks.choose_tile((64, 4, 16), 256, (32, 1, 8)) == (32, 1, 8)
  assert blocks.choose_tile((6, 6), 16, (6, 6)) is None  # only 2 x 2 fits
  # Shard (64, 64) of a (256, 64) param on model=4, ZeRO over data=2 may split
  # its free dimension 1: tiles must divide 32 there.
  assert blocks.fit_lengths((256, 64), (64, 64), 2, free=[1]) == (64, 32)


def _coded(book, x):
  """What the codes represent: ``x``, or its root for a ``root`` book."""
  return np.sqrt(np.maximum(x, 0)) if book.root else x


def _max_error(book):
  """The largest rounding error within [-1, 1] (signed) or [0, 1]: half the
  widest gap, or the distance from 0 up to a zero-free book's first entry."""
  below = 0.0 if book.signed else float(book.values[0])
  return max(float(np.diff(book.values).max()) / 2, below)


@pytest.mark.parametrize("bits,signed", BOOKS)
def test_block_round_trip_error_is_bounded_per_block(bits, signed):
  book = codes.code_book(bits, signed)
  rng = np.random.default_rng(1)
  x = rng.standard_normal((8, 64)) * np.logspace(-4, 2, 8)[:, None]
  x = (x if signed else x ** 2).astype(np.float32)
  q, got = _round_trip(book, bits, (1, 32), x)
  assert q.codes.dtype == jnp.uint8
  assert q.codes.shape == ((8, 64) if bits == 8 else (8, 32))
  x, got = _coded(book, x), _coded(book, got)
  absmax = np.abs(x).reshape(8, 2, 32).max(axis=2)
  np.testing.assert_array_equal(np.asarray(q.scales), absmax)
  bound = absmax * _max_error(book) * (1 + 1e-5)
  error = np.abs(got - x).reshape(8, 2, 32).max(axis=2)
  assert np.all(error <= bound)
  # The absmax element of each block is stored exactly (its root, up to the
  # rounding of squaring it back, for a root book).
  blocks_x, blocks_got = x.reshape(16, 32), got.reshape(16, 32)
  top = np.abs(blocks_x).argmax(axis=1)
  np.testing.assert_allclose(blocks_got[np.arange(16), top],
                             blocks_x[np.arange(16), top], rtol=1e-6 if book.root else 0)


@pytest.mark.parametrize("bits,signed", BOOKS)
def test_zero_blocks_stay_zero(bits, signed):
  book = codes.code_book(bits, signed)
  x = np.zeros((2, 32), np.float32)
  x[1] = 1.0
  q, got = _round_trip(book, bits, (1, 32), x)
  np.testing.assert_array_equal(np.asarray(q.scales), [[0.0], [1.0]])
  np.testing.assert_array_equal(got, x)


def test_signed_extremes_and_unsigned_negatives():
  x = np.asarray([[-3.0, 3.0, 0.0, 1.5]], np.float32)
  _, got = _round_trip(codes.code_book(8, True), 8, (1, 4), x)
  np.testing.assert_array_equal(got[0, :3], [-3.0, 3.0, 0.0])
  _, got = _round_trip(codes.code_book(8, False), 8, (1, 4), x)
  np.testing.assert_array_equal(got[0, :3], [0.0, 3.0, 0.0])


@pytest.mark.parametrize("bits,signed", BOOKS)
def test_a_non_finite_value_stays_in_its_element(bits, signed):
  book = codes.code_book(bits, signed)
  rng = np.random.default_rng(2)
  x = rng.uniform(0.1, 1.0, (3, 16)).astype(np.float32)
  _, clean = _round_trip(book, bits, (1, 16), x)
  bad = x.copy()
  bad[0, 3], bad[1, 5] = np.nan, np.inf
  q, got = _round_trip(book, bits, (1, 16), bad)
  x, got, clean = _coded(book, x), _coded(book, got), _coded(book, clean)
  scales = np.asarray(q.scales)[:, 0]
  assert np.all(np.isfinite(scales)) and np.all(np.isfinite(got))
  np.testing.assert_array_equal(scales[0], np.delete(x[0], 3).max())  # finite absmax
  assert scales[1] == np.delete(x[1], 5).max()
  assert got[1, 5] == scales[1]  # inf saturates to the block's scale
  nearest_zero = book.values[np.abs(book.values).argmin()]
  assert got[0, 3] == nearest_zero * scales[0]
  bound = scales * _max_error(book) * (1 + 1e-5)
  for row, skip in ((0, 3), (1, 5)):
    keep = np.arange(16) != skip
    assert np.all(np.abs(got[row, keep] - x[row, keep]) <= bound[row])
  np.testing.assert_array_equal(got[2], clean[2])


def test_four_bit_second_moments_store_the_root_by_hand():
  book = codes.code_book(4, False)
  assert book.root and book.name == "linear-zero-free-sqrt-4"
  x = np.asarray([[0.25, 1.0, 0.0, 0.01]], np.float32)  # roots .5, 1, 0, .1
  q, got = _round_trip(book, 4, (1, 4), x)
  assert float(q.scales[0, 0]) == 1.0
  np.testing.assert_allclose(got[0], [0.25, 1.0, (1 / 16) ** 2, (2 / 16) ** 2],
                             rtol=1e-6)
