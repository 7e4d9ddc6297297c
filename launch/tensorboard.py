"""TensorBoard event files, written without TensorFlow.

An event file is a sequence of records (TFRecord framing: the length as a
little-endian uint64, its masked CRC-32C, the data, the data's masked
CRC-32C), each record one serialized ``tensorflow.Event`` protocol buffer.
The few fields the job writes are encoded here by hand (protobuf wire format):

  Event:      wall_time = 1 (double), step = 2 (int64), file_version = 3
              (string), summary = 5 (Summary), session_log = 7 (SessionLog)
  Summary:    value = 1 (repeated Value)
  Value:      tag = 1 (string), simple_value = 2 (float)
  SessionLog: status = 1 (enum, START = 1)

Each start of the job opens a new file in the run folder whose first event is
a ``SessionLog START`` at the first step it trains: TensorBoard then drops
the points of that step and later from the files before it (the steps a
resume repeats, or an earlier run a fresh start replaces).
``tensorboard --logdir runs`` shows each run folder as a run.
"""

import os
import pathlib
import socket
import struct
import time

__all__ = ["EventWriter", "crc32c"]


def _crc32c_table() -> list[int]:
  table = []
  for byte in range(256):
    crc = byte
    for _ in range(8):
      crc = (crc >> 1) ^ (0x82F63B78 if crc & 1 else 0)
    table.append(crc)
  return table


_TABLE = _crc32c_table()


def crc32c(data: bytes) -> int:
  """CRC-32C (Castagnoli) of ``data``."""
  crc = 0xFFFFFFFF
  for byte in data:
    crc = _TABLE[(crc ^ byte) & 0xFF] ^ (crc >> 8)
  return crc ^ 0xFFFFFFFF


def _masked_crc(data: bytes) -> bytes:
  crc = crc32c(data)
  return struct.pack("<I", (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF)


def _varint(value: int) -> bytes:
  out = bytearray()
  while True:
    byte, value = value & 0x7F, value >> 7
    out.append(byte | (0x80 if value else 0))
    if not value:
      return bytes(out)


def _field(number: int, wire_type: int, payload: bytes) -> bytes:
  return _varint(number << 3 | wire_type) + payload


def _bytes_field(number: int, data: bytes) -> bytes:
  return _field(number, 2, _varint(len(data)) + data)


def _event(wall_time: float, step: int, body: bytes) -> bytes:
  return _field(1, 1, struct.pack("<d", wall_time)) + _field(2, 0, _varint(step)) + body


def _scalar(tag: str, value: float) -> bytes:
  return _bytes_field(1, _bytes_field(1, tag.encode()) + _field(2, 5, struct.pack("<f", value)))


class EventWriter:
  """Appends scalars to a new event file in ``folder``."""

  def __init__(self, folder, first_step: int | None = None):
    """``first_step``: the first step this file writes, if given: its
    ``SessionLog START`` makes TensorBoard drop earlier files' points from it on."""
    now = time.time()
    name = f"events.out.tfevents.{now:.0f}.{socket.gethostname()}.{os.getpid()}"
    self.path = pathlib.Path(folder) / name
    self._file = open(self.path, "ab")
    self._write(_event(now, 0, _bytes_field(3, b"brain.Event:2")))
    if first_step is not None:
      self._write(_event(now, first_step, _bytes_field(7, _field(1, 0, _varint(1)))))
    self._file.flush()

  def _write(self, data: bytes) -> None:
    length = struct.pack("<Q", len(data))
    self._file.write(length + _masked_crc(length) + data + _masked_crc(data))

  def scalars(self, step: int, values: dict, wall_time: float | None = None) -> None:
    """One event of ``step`` holding every finite number of ``values`` by tag."""
    body = b"".join(_scalar(tag, float(v)) for tag, v in values.items()
                    if v is not None and float(v) == float(v) and abs(float(v)) != float("inf"))
    if body:
      self._write(_event(time.time() if wall_time is None else wall_time, step,
                         _bytes_field(5, body)))

  def flush(self) -> None:
    self._file.flush()

  def close(self) -> None:
    self._file.close()
