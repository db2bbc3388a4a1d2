#!/usr/bin/env python3
"""Writes the seed corpus (tests/fuzz/corpus/<target>/seed-*): a few valid and
a few broken inputs per target, in the layouts tests/fuzz/fuzz_targets.cc
reads. Crashers and interesting inputs found by `make fuzz` are added next to
them by hand (named crash-* / found-*). Re-run only to regenerate seeds."""
import hashlib, os, struct

def crc32c(b):
    crc = 0xFFFFFFFF
    for x in b:
        crc ^= x
        for _ in range(8):
            crc = (crc >> 1) ^ (0x82F63B78 if crc & 1 else 0)
    return crc ^ 0xFFFFFFFF

def varint(v):
    out = bytearray()
    while True:
        b = v & 0x7F
        v >>= 7
        if v:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)

def f_varint(n, v): return varint(n << 3) + varint(v)
def f_bytes(n, b):
    if isinstance(b, str): b = b.encode()
    return varint((n << 3) | 2) + varint(len(b)) + b
def f_fixed32(n, v): return varint((n << 3) | 5) + struct.pack('<I', v)
u16 = lambda v: struct.pack('<H', v)
u64 = lambda v: struct.pack('<Q', v)

def chunk(rnd, begin, floats, crc=None):
    data = struct.pack('<%df' % len(floats), *floats)
    return (f_varint(1, rnd) + f_varint(2, begin) + f_bytes(3, data) +
            f_fixed32(4, crc32c(data) if crc is None else crc))

root = os.path.join(os.path.dirname(os.path.abspath(__file__)), 'corpus')
def put(target, name, data):
    d = os.path.join(root, target)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, 'seed-' + name), 'wb') as f:
        f.write(data)

good = chunk(3, 8, [1.0, 2.0, 3.0, 4.0])
# tensor_chunk: flags (bit0-1 cuts, 2 wrong round, 3 fix crc, 4 exact begin), cuts, range, message
put('tensor_chunk', 'valid', bytes([16]) + u16(4) + good)
put('tensor_chunk', 'valid-3-pieces', bytes([16 | 2]) + u16(3) + u16(11) + u16(4) + good)
put('tensor_chunk', 'bad-crc', bytes([16]) + u16(4) + chunk(3, 8, [1.0], crc=7))
put('tensor_chunk', 'wrong-round', bytes([16 | 4]) + u16(4) + good)
put('tensor_chunk', 'past-range', bytes([16]) + u16(2) + good)
put('tensor_chunk', 'truncated', bytes([16]) + u16(4) + good[:-3])
put('tensor_chunk', 'unknown-fields', bytes([16 | 8]) + u16(4) + f_varint(9, 5) +
    f_bytes(10, b'xyz') + good + f_varint(1, 3))
put('tensor_chunk', 'odd-size', bytes([16 | 8]) + u16(4) + f_bytes(3, b'abcde'))

# chunk_stream: round u8, begin u64, count u16, then [cuts u8, len u16, message]*
def msg(m, cuts=0): return bytes([cuts]) + u16(len(m)) + m
put('chunk_stream', 'two-chunks', bytes([3]) + u64(100) + u16(6) +
    msg(chunk(3, 100, [1, 2, 3, 4]), 5) + msg(chunk(3, 104, [5, 6])))
put('chunk_stream', 'gap', bytes([3]) + u64(100) + u16(6) +
    msg(chunk(3, 100, [1, 2])) + msg(chunk(3, 103, [5, 6])))
put('chunk_stream', 'short', bytes([3]) + u64(0) + u16(8) + msg(chunk(3, 0, [1, 2])))
put('chunk_stream', 'huge-begin', bytes([1]) + u64(2**64 - 9) + u16(8) +
    msg(chunk(1, 2**64 - 9, [1, 2, 3])))

# read_slice_request: cut u8, ReadSliceRequest
req = f_varint(1, 4) + f_varint(2, 10) + f_varint(3, 2000) + f_varint(4, 1) + \
    f_bytes(5, 'w2') + f_varint(6, 1)
put('read_slice_request', 'valid', bytes([5]) + req)
put('read_slice_request', 'truncated', bytes([3]) + req[:-1])
put('read_slice_request', 'bad-utf8-reader', bytes([0]) + f_bytes(5, b'\xff\xfe'))

# model_manifest mode 0: total u16, ModelManifest
def digest(name, off, n, pieces=0):
    b = f_bytes(1, name) + f_varint(2, off) + f_varint(3, n) + f_bytes(4, '1' * 64)
    for _ in range(pieces): b += f_bytes(5, '2' * 64)
    return f_bytes(3, b)
mm = f_varint(1, 7) + f_bytes(2, 'a' * 64) + digest('w', 0, 100, 4) + digest('b', 100, 20) + \
    f_varint(4, 32) + f_varint(5, 120)
put('model_manifest', 'valid', bytes([0]) + u16(120) + mm)
put('model_manifest', 'gap', bytes([0]) + u16(120) + f_varint(1, 7) + digest('w', 0, 100, 4) +
    digest('b', 101, 19) + f_varint(4, 32) + f_varint(5, 120))
put('model_manifest', 'zero-piece', bytes([0]) + u16(10) + digest('w', 0, 10) + f_varint(5, 10))
# mode 1: total u16, n u8, [name u8, offset u64, elements u64]*, piece u16, fill
put('model_manifest', 'layers', bytes([1]) + u16(100) + bytes([2]) + bytes([1]) + u64(0) +
    u64(60) + bytes([2]) + u64(60) + u64(40) + u16(16) + bytes(range(200)))
put('model_manifest', 'layers-bad', bytes([1]) + u16(100) + bytes([2]) + bytes([1]) + u64(0) +
    u64(60) + bytes([2]) + u64(61) + u64(39) + u16(16))

# run_record: the file's bytes
rec = f_bytes(1, 'run-1') + f_varint(3, 12) + f_bytes(4, 'c' * 64) + f_varint(5, 4) + \
    f_bytes(6, 'run-1-r10') + f_varint(7, 1700000000000) + f_varint(9, 10)
put('run_record', 'valid', rec)
put('run_record', 'finished', rec + f_varint(8, 1))
put('run_record', 'no-run-id', f_varint(3, 12))
put('run_record', 'garbage', b'\x0a\xff\xff\xff')

# checkpoint_id mode 0: layer u8, offset u16, length u16, id; mode 2/4/6: u64 offset/length
put('checkpoint_id', 'known', bytes([0, 0]) + u16(0) + u16(0) + b'run-r1')
put('checkpoint_id', 'known-range', bytes([0, 1]) + u16(8) + u16(16) + b'run-r1')
put('checkpoint_id', 'huge-offset', bytes([6, 0]) + u64(2**64 - 1) + u64(2**63) + b'run-r1')
put('checkpoint_id', 'past-end', bytes([0, 0]) + u16(3999) + u16(2) + b'run-r1')
put('checkpoint_id', 'dotdot', bytes([0, 0]) + u16(0) + u16(0) + b'../manifests/run-r1')
put('checkpoint_id', 'slash', bytes([0, 0]) + u16(0) + u16(0) + b'a/b')
put('checkpoint_id', 'unknown', bytes([0, 0]) + u16(0) + u16(0) + b'nope-r1')
put('checkpoint_id', 'long', bytes([0, 0]) + u16(0) + u16(0) + b'x' * 200)
put('checkpoint_id', 'nul', bytes([0, 0]) + u16(0) + u16(0) + b'run-r1\x00x')
layer = f_bytes(1, 'fc') + f_bytes(2, 'float32') + f_varint(3, 4) + f_varint(4, 16) + \
    f_bytes(5, hashlib.sha256(b'x').hexdigest())
put('checkpoint_id', 'manifest', bytes([1]) + f_bytes(2, 'run-1') + f_varint(3, 5) +
    f_bytes(7, layer))
put('checkpoint_id', 'manifest-dotdot', bytes([1]) + f_bytes(2, 'a..b') + f_varint(3, 5) +
    f_bytes(7, layer))

# address: the string itself
for i, a in enumerate([b'127.0.0.1:5000', b'[::1]:80', b'worker-3.svc:50051', b'host:0',
                       b':80', b'host:65536', b'host', b'a:b:1', b'']):
    put('address', str(i), a)


# encoded_slice: codec byte (0 fp32, 1 fp16, 2 bf16, 3 int8, 4 topk:0.1,
# 5 randomk:0.25), u16 element count, the encoding.
def encoded_slice_seeds():
    d = os.path.join(os.path.dirname(__file__), "corpus", "encoded_slice")
    os.makedirs(d, exist_ok=True)
    n = 20
    seeds = [
        bytes([0]) + struct.pack("<H", n) + struct.pack("<20f", *[i * 0.5 for i in range(n)]),
        bytes([1]) + struct.pack("<H", n) + b"\x00\x3c" * n,
        bytes([3]) + struct.pack("<H", n) + struct.pack("<f", 0.01) + bytes(range(n)),
        bytes([3]) + struct.pack("<H", n) + struct.pack("<f", float("nan")) + bytes(n),
        # topk:0.1 of 20: k = 2, indices 3 and 7 (gaps 3, 3), two values.
        bytes([4]) + struct.pack("<H", n) + struct.pack("<I", 2) + bytes([3, 3]) + struct.pack("<2f", 1.0, -2.0),
        # an index out of range
        bytes([4]) + struct.pack("<H", n) + struct.pack("<I", 2) + bytes([3, 30]) + struct.pack("<2f", 1.0, -2.0),
        bytes([5]) + struct.pack("<H", n) + struct.pack("<I", 5) + bytes([0] * 5) + struct.pack("<5f", *[1.0] * 5),
    ]
    for i, b in enumerate(seeds):
        with open(os.path.join(d, "seed-%d" % i), "wb") as f:
            f.write(b)

if __name__ == "__main__":
    encoded_slice_seeds()
