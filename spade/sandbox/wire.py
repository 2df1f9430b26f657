"""Framing of the messages between the worker and its children.

Standard library only: the worker and its children import it inside the
sandbox (see worker.py). A message is a 4-byte big-endian length and that
many bytes of JSON. Each program child also shares one page with the worker,
on which it writes a heartbeat (`BEAT`) before each program call: the call's
sequence number, its item's index in the batch and its budget in seconds.
"""

import json
import os
import struct

LEN = struct.Struct(">I")
BEAT = struct.Struct("<IId")  # sequence, batch item index, budget (s)


def frame(data):
  """`data` (bytes) with its length in front."""
  return LEN.pack(len(data)) + data


def write_all(fd, data):
  """Writes one framed message on a blocking descriptor."""
  view = memoryview(frame(data))
  while view:
    n = os.write(fd, view)
    view = view[n:]


def text_size(obj, limit, depth=0):
  """A lower bound on the encoded size: the lengths of the strings inside.

  Stops counting once past `limit`; containers deeper than 8 levels count as
  nothing here (the exact check after encoding still applies).
  """
  if isinstance(obj, (str, bytes)):
    return len(obj)
  if depth > 8:
    return 0
  total = 0
  items = obj
  if isinstance(obj, dict):
    items = (x for kv in obj.items() for x in kv)
  elif not isinstance(obj, (list, tuple)):
    return 0
  for item in items:
    total += text_size(item, limit, depth + 1)
    if total > limit:
      break
  return total


def send(fd, obj, limit, seq=None):
  """Child side: one framed JSON message; an oversized one becomes an error.

  `seq` echoes the request's sequence number, so an answer can never be
  taken for the answer to another request.
  """
  try:
    if text_size(obj, limit) > limit:
      # Encoding tens of MiB only to refuse them can outlast the deadline.
      data = b"x" * (limit + 1)
    else:
      data = json.dumps(obj, allow_nan=False).encode("utf-8", "surrogatepass")
  except (TypeError, ValueError) as e:
    obj = {
        "ok": False,
        "reason": "bad_result",
        "message": f"the result is not JSON-serialisable: {e}"[:2000],
    }
    data = json.dumps(obj).encode()
  if len(data) > limit:
    obj = {
        "ok": False,
        "reason": "result_too_large",
        "message": (
            f"the result has {len(data)} bytes, over the {limit}-byte cap;"
            " return shorter observations"
        ),
    }
    data = json.dumps(obj).encode()
  if seq is not None:
    # Appended last so the size check above counts only the program's data.
    data = data[:-1] + b', "seq": ' + str(int(seq)).encode() + b"}"
  write_all(fd, data)


def recv(fd):
  """Child side: one framed message (blocking); None at end of stream.

  The worker sends one message and waits for the answer, so one read almost
  always returns all of it: each system call costs a trip through gVisor.
  """
  data = os.read(fd, 1 << 16)
  if len(data) < LEN.size:
    while data and len(data) < LEN.size:
      more = os.read(fd, LEN.size - len(data))
      if not more:
        return None
      data += more
    if not data:
      return None
  size = LEN.unpack(data[: LEN.size])[0]
  chunks = [data[LEN.size :]]
  have = len(chunks[0])
  while have < size:
    chunk = os.read(fd, min(size - have, 1 << 20))
    if not chunk:
      return None
    chunks.append(chunk)
    have += len(chunk)
  return json.loads(b"".join(chunks))
