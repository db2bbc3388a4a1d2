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
def put(target, name, data, prefix='seed-'):
    d = os.path.join(root, target)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, prefix + name), 'wb') as f:
        f.write(data)
# Crashers found by `make fuzz` (each also a FuzzRegressionTest), rewritten
# here in readable form.
def crash(target, name, data): put(target, name, data, prefix='crash-')

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


# encoded_slice: codec byte, for topk/randomk a u16 v (F = (v + 1) / 65536),
# u16 element count, the encoding (replaces the first seeds' layout).
def encoded_slice_seeds():
    t = 'encoded_slice'
    n = 20
    put(t, 'fp32', bytes([0]) + u16(n) + struct.pack('<20f', *[i * 0.5 for i in range(n)]))
    put(t, 'fp16', bytes([1]) + u16(n) + b'\x00\x3c' * n)
    put(t, 'fp16-inf-nan', bytes([1]) + u16(2) + b'\x00\x7c\x01\x7e')
    put(t, 'bf16', bytes([2]) + u16(n) + b'\x80\x3f' * n)
    put(t, 'int8', bytes([3]) + u16(n) + struct.pack('<f', 0.01) + bytes(range(n)))
    put(t, 'int8-nan-scale', bytes([3]) + u16(n) + struct.pack('<f', float('nan')) + bytes(n))
    put(t, 'int8-two-blocks', bytes([3]) + u16(300) + struct.pack('<f', 1.0) + bytes(256) +
        struct.pack('<f', 2.0) + bytes(44))
    # topk:0.1 of 20 (v = 6553): k = 2, indices 3 and 7 (gaps 3, 3).
    put(t, 'topk', bytes([4]) + u16(6553) + u16(n) + struct.pack('<I', 2) + bytes([3, 3]) +
        struct.pack('<2f', 1.0, -2.0))
    put(t, 'topk-out-of-range', bytes([4]) + u16(6553) + u16(n) + struct.pack('<I', 2) +
        bytes([3, 30]) + struct.pack('<2f', 1.0, -2.0))
    put(t, 'topk-long-varint', bytes([4]) + u16(6553) + u16(n) + struct.pack('<I', 2) +
        bytes([0x80, 0x80, 0x80, 0x80, 0x10, 1]) + struct.pack('<2f', 1.0, -2.0))
    # randomk:0.25 of 20 (v = 16383): k = 5.
    put(t, 'randomk', bytes([5]) + u16(16383) + u16(n) + struct.pack('<I', 5) + bytes([0] * 5) +
        struct.pack('<5f', *[1.0] * 5))
    crash(t, 'int8-scale-overflows', bytes([3]) + u16(1) + struct.pack('<f', 3.4028234e38) +
          bytes([127]))
    crash(t, 'fp32-empty-slice', bytes([0]) + u16(0))
    put(t, 'randomk-all', bytes([5]) + u16(65535) + u16(4) + struct.pack('<I', 4) +
        bytes([0] * 4) + struct.pack('<4f', 1, 2, 3, 4))
    # sparse:F (6): encodings written by SparseDctCodec::EncodeSlice (a range-
    # coded stream: they cannot be spelled by hand). F = (v + 1) / 65536.
    # n = 20 (one tail chunk, no DCT), k = 2: spikes 1, -2 at 3, 7 (and 0.25 at 11).
    put(t, 'sparse', bytes([6]) + u16(6553) + u16(20) + bytes.fromhex('0000004000577ed2924000'))
    # n = 1100 (two DCT chunks and a tail), k = 66: smooth rows.
    dct = bytes.fromhex('f271203e0045f3bd0bbc0b5d4f9084d96dc4862c0dec7dbba761923152f522e1'
                        '1537cee2420a2367efe36aceb9a386')
    put(t, 'sparse-dct', bytes([6]) + u16(3931) + u16(1100) + dct)
    put(t, 'sparse-nan-scale', bytes([6]) + u16(3931) + u16(1100) + struct.pack('<f', float('nan')) +
        dct[4:])
    put(t, 'sparse-first-byte', bytes([6]) + u16(3931) + u16(1100) + dct[:4] + b'\x01' + dct[5:])
    put(t, 'sparse-truncated', bytes([6]) + u16(3931) + u16(1100) + dct[:-1])

# encoded_pieces: mode u8, round u8, max u16, blob (u16 + bytes), then
# (honest peer) other request: round u8, attempt u8, kind u8, begin u8,
# end u8, piece size - 1 u8; (made-up peer) pieces: flags u8, offset u16,
# total u16, data (u16 + bytes).
def encoded_pieces_seeds():
    t = 'encoded_pieces'
    blob = bytes(range(40))
    put(t, 'honest', bytes([0, 3]) + u16(100) + u16(len(blob)) + blob + bytes([3, 0, 2, 0, 10, 6]))
    put(t, 'honest-exact', bytes([1, 3]) + u16(100) + u16(len(blob)) + blob + bytes([2, 1, 1, 5, 5, 0]))
    put(t, 'honest-too-big', bytes([0, 3]) + u16(10) + u16(len(blob)) + blob + bytes([0] * 6))
    put(t, 'honest-empty', bytes([0, 1]) + u16(10) + u16(0) + bytes([1, 0, 3, 0, 0, 9]))
    def piece(flags, off, total, data): return bytes([flags]) + u16(off) + u16(total) + u16(len(data)) + data
    put(t, 'made-up', bytes([2, 3]) + u16(100) + u16(len(blob)) + blob +
        piece(0, 0, 0, blob[:16]) + piece(0, 0, 0, blob[16:]))
    put(t, 'made-up-bad', bytes([3, 3]) + u16(100) + u16(len(blob)) + blob +
        piece(1, 0, 0, blob[:16]) + piece(2, 7, 0, blob) + piece(4, 0, 30, blob[:30]) +
        piece(8, 0, 0, blob) + piece(0, 0, 0, b'') + piece(0, 0, 0, blob))

# gossip_transfer: elements u16, PeerInfo (u16 + bytes), then chunk stream
# messages [cuts u8, len u16, message]*.
def f_double(n, v): return varint((n << 3) | 1) + struct.pack('<d', v)
def gossip_transfer_seeds():
    t = 'gossip_transfer'
    info = f_varint(4, 6) + f_varint(30, 5) + f_double(31, 1200.0) + f_double(32, 0.4)
    put(t, 'whole', u16(6) + u16(len(info)) + info + msg(chunk(5, 0, [1, 2, 3, 4]), 3) +
        msg(chunk(5, 4, [5, 6])))
    put(t, 'short', u16(6) + u16(len(info)) + info + msg(chunk(5, 0, [1, 2, 3, 4])))
    put(t, 'overlap', u16(6) + u16(len(info)) + info + msg(chunk(5, 0, [1, 2, 3, 4])) +
        msg(chunk(5, 2, [5, 6, 7, 8])))
    put(t, 'past-end', u16(6) + u16(len(info)) + info + msg(chunk(5, 0, [1, 2, 3, 4, 5, 6, 7])))
    put(t, 'old-publication', u16(6) + u16(len(info)) + info + msg(chunk(4, 0, [1, 2, 3, 4, 5, 6])))
    for name, extra in [('nan-clock', f_double(31, float('nan'))),
                        ('inf-loss', f_double(32, float('inf'))),
                        ('negative-clock', f_double(31, -1.0))]:
        i = f_varint(4, 6) + f_varint(30, 5) + extra
        put(t, name, u16(6) + u16(len(i)) + i + msg(chunk(5, 0, [1, 2, 3, 4, 5, 6])))
    i = f_varint(4, 6) + f_varint(30, 5) + f_double(31, float('inf'))
    crash(t, 'infinite-clock', u16(6) + u16(len(i)) + i)
    i = f_varint(4, 7) + f_varint(30, 5)
    put(t, 'other-size', u16(6) + u16(len(i)) + i)
    i = f_varint(4, 6)
    put(t, 'unpublished', u16(6) + u16(len(i)) + i)

# model_file: flags u8, file (u16 + bytes), request offset u16, max u16, then
# made-up pieces [len u8, offset u16 (0xFFFF: as asked), total u16 (0xFFFF:
# the claimed size), data].
def model_file_seeds():
    t = 'model_file'
    f = b'PK\x03\x04 a torchscript archive, or not' * 3
    def mp(off, total, data):
        return bytes([len(data)]) + u16(off) + u16(total) + data
    put(t, 'honest-only', bytes([4 | 8]) + u16(len(f)) + f + u16(5) + u16(10))
    put(t, 'made-up-good', bytes([0]) + u16(len(f)) + f + u16(0) + u16(0) +
        mp(0xFFFF, 0xFFFF, f[:60]) + mp(0xFFFF, 0xFFFF, f[60:]))
    put(t, 'made-up-wrong-bytes', bytes([4]) + u16(len(f)) + f + u16(200) + u16(0) +
        mp(0xFFFF, 0xFFFF, b'x' * 60) + mp(0xFFFF, 0xFFFF, f[60:]))
    put(t, 'wrong-size', bytes([1 | 0x30 | 4]) + u16(len(f)) + f + u16(0) + u16(0) +
        mp(0xFFFF, 0xFFFF, f))
    put(t, 'bad-offset', bytes([2]) + u16(len(f)) + f + u16(1) + u16(1) +
        mp(3, 0xFFFF, f[:10]) + mp(0xFFFF, 5, f[:10]))
    put(t, 'empty-file', bytes([4]) + u16(0) + u16(0) + u16(0))

# auth: mode u8 (1 admin token, 2 the right header too, 4 capitalised key),
# token length a u8 b u8 (4a + b), the token file's text, then metadata
# values separated by newlines.
def auth_seeds():
    t = 'auth'
    tok = b'0123456789abcdef0123456789abcdef'
    def tl(n): return bytes([n // 4, n % 4])
    put(t, 'right', bytes([0]) + tl(len(tok) + 1) + tok + b'\n' + b'Bearer ' + tok)
    put(t, 'admin', bytes([1]) + tl(len(tok)) + tok + b'Bearer ' + tok + b'-admin')
    put(t, 'wrong', bytes([0]) + tl(len(tok)) + tok + b'Bearer nope\nBearer ' + tok)
    put(t, 'no-scheme', bytes([2]) + tl(len(tok)) + tok + tok)
    put(t, 'capital-key', bytes([6]) + tl(len(tok)) + tok)
    put(t, 'short-token', bytes([0]) + tl(5) + b'short')
    put(t, 'space-in-token', bytes([0]) + tl(20) + b'0123456789 123456789')
    put(t, 'spaces-around', bytes([2]) + tl(len(tok) + 4) + b'  ' + tok + b' \n')

# run_specs: selector u8 (0 codec, 1 aggregation, 2 interpolation, 3 data
# split, 4 outer optimizer, 5 input shape), the text.
def run_specs_seeds():
    t = 'run_specs'
    for i, (sel, text) in enumerate([
            (0, 'fp32'), (0, 'fp16'), (0, 'int8'), (0, 'topk:0.01'), (0, 'randomk:1'),
            (0, 'topk:0'), (0, 'topk:1e-300'), (0, 'randomk:nan'), (0, 'topk:'),
            (1, 'mean'), (1, 'median'), (1, 'trimmed_mean:2'), (1, 'trimmed_mean:0'),
            (1, 'trimmed_mean:1001'), (1, 'trimmed_mean:-1'), (1, 'trimmed_mean:+3'),
            (2, 'constant:0.5'), (2, 'clock'), (2, 'loss'), (2, 'constant:1.5'), (2, 'constant:nan'),
            (3, 'iid'), (3, 'label_skew:0.5'), (3, 'label_skew:inf'), (3, 'label_skew:0'),
            (4, 'nesterov'), (4, 'sgd'), (4, 'adam'),
            (5, '1,28,28'), (5, '3,32,32,1'), (5, '0,28,28'), (5, '1,,28'), (5, '1,28,65537')]):
        put(t, '%02d' % i, bytes([sel]) + text.encode())

# dataset_file: selector u8 (0 IDX, 1 npy), the file.
def dataset_file_seeds():
    t = 'dataset_file'
    put(t, 'idx-images', bytes([0]) + bytes([0, 0, 8, 3]) + struct.pack('>3I', 2, 3, 3) + bytes(18))
    put(t, 'idx-labels', bytes([0]) + bytes([0, 0, 8, 1]) + struct.pack('>I', 4) + bytes([1, 2, 3, 9]))
    put(t, 'idx-short', bytes([0]) + bytes([0, 0, 8, 3]) + struct.pack('>3I', 2, 3, 3) + bytes(17))
    put(t, 'idx-huge-dims', bytes([0]) + bytes([0, 0, 8, 4]) + struct.pack('>4I', 65536, 65536, 65536, 65536))
    put(t, 'idx-int-type', bytes([0]) + bytes([0, 0, 0xC, 1]) + struct.pack('>I', 1) + bytes(4))
    def npy(header, data, major=1):
        h = header.encode()
        if major == 1:
            return b'\x93NUMPY' + bytes([1, 0]) + u16(len(h)) + h + data
        return b'\x93NUMPY' + bytes([major, 0]) + struct.pack('<I', len(h)) + h + data
    put(t, 'npy-u1', bytes([1]) + npy("{'descr': '|u1', 'fortran_order': False, 'shape': (2, 3), }", bytes(6)))
    put(t, 'npy-i8', bytes([1]) + npy("{'descr': '<i8', 'fortran_order': False, 'shape': (3,), }", bytes(24), 2))
    put(t, 'npy-fortran', bytes([1]) + npy("{'descr': '|u1', 'fortran_order': True, 'shape': (2, 3), }", bytes(6)))
    put(t, 'npy-short', bytes([1]) + npy("{'descr': '<i4', 'fortran_order': False, 'shape': (3, 3), }", bytes(20)))
    put(t, 'npy-overflow', bytes([1]) + npy("{'descr': '<i8', 'fortran_order': False, 'shape': (4294967296, 4294967296, 2), }", b''))
    put(t, 'npy-scalar', bytes([1]) + npy("{'descr': '<f4', 'fortran_order': False, 'shape': (), }", bytes(4), 3))

# checkpoint_upload: flags u8 (1 raw UploadChunk protos, 2 right digests,
# 4 right CRCs, 8 a run id with ..), built: round u8, layers-1 u8, per
# layer elements u8 + 4 x elements bytes, chunk/4 - 1 u8; raw: [len u16,
# UploadChunk]*.
def checkpoint_upload_seeds():
    t = 'checkpoint_upload'
    body = bytes([7, 1]) + bytes([3]) + bytes(range(12)) + bytes([2]) + bytes(range(8)) + bytes([1])
    put(t, 'good', bytes([2 | 4]) + body)
    put(t, 'bad-digest', bytes([4]) + body)
    put(t, 'bad-crc', bytes([2]) + body)
    put(t, 'bad-run-id', bytes([2 | 4 | 8]) + body)
    put(t, 'empty-layer', bytes([2 | 4]) + bytes([1, 0, 0, 0]))
    data = bytes(range(8))
    layer = f_bytes(1, 'fc') + f_bytes(2, 'float32') + f_varint(3, 2) + f_varint(4, 8) + \
        f_bytes(5, hashlib.sha256(data).hexdigest())
    manifest = f_bytes(1, f_bytes(2, 'run') + f_varint(3, 4) + f_bytes(7, layer))
    def lc(layer_i, off, d, crc=None):
        return f_bytes(2, f_varint(1, layer_i) + f_varint(2, off) + f_bytes(3, d) +
                       f_fixed32(4, crc32c(d) if crc is None else crc))
    def raw(*ms): return bytes([1]) + b''.join(u16(len(m)) + m for m in ms)
    put(t, 'raw-good', raw(manifest, lc(0, 0, data[:4]), lc(0, 4, data[4:])))
    put(t, 'raw-gap', raw(manifest, lc(0, 0, data[:4]), lc(0, 6, data[4:6])))
    put(t, 'raw-overlap', raw(manifest, lc(0, 0, data[:4]), lc(0, 2, data[2:])))
    put(t, 'raw-past-end', raw(manifest, lc(0, 0, data + b'12')))
    put(t, 'raw-no-manifest', raw(lc(0, 0, data)))
    put(t, 'raw-two-manifests', raw(manifest, manifest))
    put(t, 'raw-unknown-layer', raw(manifest, lc(3, 0, data)))
    put(t, 'raw-short', raw(manifest, lc(0, 0, data[:4])))

# join_request: [len u16, JoinRequest]*.
def join_request_seeds():
    t = 'join_request'
    def jr(addr, prev=None, rank=None, h=None):
        b = f_bytes(1, addr)
        if prev is not None: b += f_bytes(3, prev)
        if h is not None: b += f_bytes(5, h)
        if rank is not None: b += f_varint(6, rank)
        return u16(len(b)) + b
    put(t, 'two', jr('127.0.0.1:5001') + jr('127.0.0.1:5002'))
    put(t, 'rejoin', jr('127.0.0.1:5001') + jr('127.0.0.1:5009', 'w1'))
    put(t, 'same-address', jr('127.0.0.1:5001') + jr('127.0.0.1:5001'))
    put(t, 'restart-ids', jr('h:1', 'w7', 2) + jr('h:2', 'w7', 2) + jr('h:3'))
    put(t, 'huge-id', jr('h:1', 'w18446744073709551615') + jr('h:2') + jr('h:3'))
    crash(t, 'id-wraps', jr('h:1') + jr('h:2', 'w18446744073709551614') + jr('h:3') + jr('h:4') +
        jr('h:5'))
    put(t, 'id-forms', jr('h:1', 'w01') + jr('h:2', 'w+1') + jr('h:3', 'w 1') + jr('h:4'))
    put(t, 'bad-hash', jr('h:1', h='XYZ') + jr('h:2', h='a' * 64))
    put(t, 'bad-address', jr('') + jr('host') + jr('h:0'))

# read_slice_rule: total u16, round u8, flags u8, attempt u8, own begin u16,
# own end u16, snapshot round u8, ReadSliceRequest (round 1, begin 2, end 3,
# kind 4: 1 CONTRIBUTION 2 AVERAGED 3 SNAPSHOT 4 GOSSIP, attempt 6).
def read_slice_rule_seeds():
    t = 'read_slice_rule'
    def st(total, rnd, flags, attempt, ob, oe, snap):
        return u16(total) + bytes([rnd, flags, attempt]) + u16(ob) + u16(oe) + bytes([snap])
    def rq(rnd, b, e, kind, attempt=0):
        return f_varint(1, rnd) + f_varint(2, b) + f_varint(3, e) + f_varint(4, kind) + f_varint(6, attempt)
    put(t, 'contribution', st(100, 4, 1 | 2, 0, 0, 50, 3) + rq(4, 10, 20, 1))
    put(t, 'averaged', st(100, 4, 1 | 2 | 4 | 8, 1, 0, 50, 3) + rq(4, 10, 20, 2, 1))
    put(t, 'averaged-not-own', st(100, 4, 1 | 2 | 4 | 8, 0, 0, 50, 3) + rq(4, 40, 60, 2))
    put(t, 'snapshot', st(100, 4, 1 | 16 | 32, 0, 0, 0, 3) + rq(3, 0, 100, 3))
    put(t, 'past-end', st(100, 4, 1 | 2, 0, 0, 0, 3) + rq(4, 90, 101, 1))
    put(t, 'reversed', st(100, 4, 1 | 2, 0, 0, 0, 3) + rq(4, 20, 10, 1))
    put(t, 'gossip', st(100, 4, 1, 0, 0, 0, 0) + rq(9, 0, 100, 4))
    put(t, 'gossip-past-end', st(100, 4, 1, 0, 0, 0, 0) + rq(9, 0, 1000, 4))
    put(t, 'unknown-kind', st(100, 4, 1 | 2, 0, 0, 0, 0) + rq(4, 0, 10, 9))

# join_limiter: per_minute u16, then per step op u8 (bits 0-2 host, bit 3 a
# clock step u16 ms follows, bit 4 backwards, bit 5 wait as told and retry).
def join_limiter_seeds():
    t = 'join_limiter'
    step = lambda op, ms=None: bytes([op]) + (u16(ms) if ms is not None else b'')
    put(t, 'burst', u16(3) + step(0) * 5)
    put(t, 'two-hosts', u16(2) + step(0) + step(1) + step(0 | 8, 30000) + step(1) + step(0) +
        step(2) + step(4) + step(6) + step(7))
    put(t, 'no-limit', u16(0) + step(0) * 4 + step(3 | 8, 500))
    put(t, 'wait-and-retry', u16(1) + step(0) + step(0 | 32) + step(0 | 32) + step(5 | 32))
    put(t, 'many', u16(65535) + step(0) * 20)
    # The wall clock set back a minute after a join: the host was told to
    # wait 120 s (the bucket went negative), more than a full refill.
    crash(t, 'clock-set-back', u16(1) + step(0) + step(0 | 8 | 16, 60000))

# read_encoded_request: ops (tests/fuzz/fuzz_targets.cc): 0 BeginRound
# round, attempt; 1 Publish kind (0 CONTRIBUTION 1 AVERAGED 2 STAGE_MODEL),
# begin, end-begin-1, stage, blob; 2 ReachStage; 3 SetState round, blob;
# 4 request round, attempt, stage, kind, begin, end, flag, offset, piece;
# 5 raw request bytes, piece.
def read_encoded_request_seeds():
    t = 'read_encoded_request'
    begin_round = lambda r, a=0: bytes([0, r, a])
    publish = lambda k, b, n, st, blob: bytes([1, k, b, n, st, len(blob)]) + blob
    reach = lambda st: bytes([2, st])
    set_state = lambda r, blob: bytes([3, r, len(blob)]) + blob
    def req(r, a, st, kind, b, e, flag=0, off=0, piece=7):
        return bytes([4, r, a, st, kind, b, e, flag, off, piece])
    def raw(m, piece=7): return bytes([5, len(m)]) + m + bytes([piece])
    put(t, 'publish-and-read', begin_round(5) + publish(1, 0, 9, 0, b'abcdefgh') +
        req(5, 0, 0, 2, 0, 10) + req(5, 0, 0, 2, 0, 10, off=3, piece=2) +
        req(5, 0, 0, 2, 0, 10, off=9) + req(5, 0, 0, 1, 0, 10) + req(5, 1, 0, 2, 0, 10) +
        req(4, 0, 0, 2, 0, 10) + req(6, 0, 0, 2, 0, 10))
    put(t, 'next-round-keeps-averages', begin_round(5) + publish(1, 0, 9, 0, b'avg') +
        publish(0, 10, 9, 0, b'contrib') + begin_round(6) + req(5, 0, 0, 2, 0, 10) +
        req(5, 0, 0, 1, 10, 20))
    put(t, 'attempts', begin_round(5, 0) + publish(0, 0, 3, 0, b'a0') + begin_round(5, 1) +
        req(5, 0, 0, 1, 0, 4) + req(5, 1, 0, 1, 0, 4) + req(5, 2, 0, 1, 0, 4))
    put(t, 'stages', begin_round(2) + publish(2, 0, 99, 1, b'stage1') + reach(2) +
        req(2, 0, 1, 4, 0, 100) + req(2, 0, 2, 4, 0, 100) + req(2, 0, 3, 4, 0, 100))
    put(t, 'state', set_state(4, b'momentum') + req(4, 0, 0, 3, 0, 0) + req(3, 0, 0, 3, 0, 0) +
        req(5, 0, 0, 3, 0, 0))
    put(t, 'bad-ranges', begin_round(1) + req(1, 0, 0, 1, 5, 5) + req(1, 0, 0, 1, 9, 2) +
        req(1, 0, 0, 0, 0, 4))
    put(t, 'raw', begin_round(3) + publish(1, 0, 9, 0, b'xyz') +
        raw(f_varint(1, 3) + f_varint(3, 2) + f_varint(4, 0) + f_varint(5, 10)) +
        raw(f_varint(1, 3) + f_varint(3, 2) + f_varint(4, 0) + f_varint(5, 10) + f_varint(6, 99)) +
        raw(f_varint(1, 3) + f_varint(3, 30) + f_varint(4, 0) + f_varint(5, 10)) +
        raw(f_varint(1, 3) + f_varint(2, 7) + f_varint(3, 2) + f_varint(8, 9)))
    # A kind the store never holds (5: no such SliceKind) for the current
    # round was UNAVAILABLE, "not encoded here yet": a reader would ask again
    # until its deadline for something that never comes.
    crash(t, 'unknown-kind', begin_round(1) + req(1, 0, 0, 5, 0, 10))

# audit_report: ops (tests/fuzz/fuzz_targets.cc): 0 join k fp; 1 next round;
# 2 ready k hash (255 none); 3 assign; 4 report audit auditor hash (254 an
# error, 255 the participant's own); 5 leave k; 6 drop pending; 7 record k
# event; 8 bad chunks k j; 9 check joins of k, then (odd u8) after the bans.
def audit_report_seeds():
    t = 'audit_report'
    joins = bytes([0, 0, 0, 0, 1, 0, 0, 2, 0])
    ready = bytes([2, 0, 0, 2, 1, 1, 2, 2, 2])
    put(t, 'honest-round', joins + bytes([1]) + ready + bytes([3]) +
        bytes([4, 0, 1, 255, 4, 1, 2, 255, 4, 2, 0, 255]))
    put(t, 'cheater-confirmed', joins + bytes([1]) + ready + bytes([3]) +
        bytes([4, 0, 1, 3, 4, 3, 2, 3, 9, 0, 0, 9, 1, 0]))
    put(t, 'wrong-auditor', joins + bytes([1]) + ready + bytes([3]) +
        bytes([4, 0, 5, 255, 4, 0, 4, 255, 4, 0, 1, 254]))
    put(t, 'fingerprints-differ', bytes([0, 0, 0, 0, 1, 1, 0, 2, 2, 1]) + ready + bytes([3]))
    put(t, 'leave-and-drop', joins + bytes([1]) + ready + bytes([3, 5, 1, 6, 4, 0, 0, 0]))
    put(t, 'scores-and-bans', joins + bytes([7, 0, 1, 9, 0, 0, 7, 1, 3, 7, 1, 3, 7, 1, 3, 9, 1, 0,
                                             8, 0, 2, 8, 1, 2, 7, 2, 6, 9, 2, 0, 9, 0, 1,
                                             9, 0, 0]))

# text_limits: [rule u8 (index in request_limits.cc's table)][value].
# Rule 1 is JoinRequest.name, 0 its peer_address, 4 its zone, 3 a hash.
def text_limits_seeds():
    t = 'text_limits'
    put(t, 'name-ok', bytes([1]) + 'trainer ünï 名前 🐟'.encode())
    put(t, 'name-osc-retitle', bytes([1]) + b'\x1b]0;owned\x07')
    put(t, 'name-clear', bytes([1]) + b'a\x1b[2Jb')
    put(t, 'name-long', bytes([1]) + b'n' * 200)
    put(t, 'name-bidi', bytes([1]) + 'a\u202eb'.encode())
    put(t, 'name-c1-csi', bytes([1]) + b'\xc2\x9b31m')
    put(t, 'name-not-utf8', bytes([1]) + b'\xff\xfe\xc0\xaf')
    put(t, 'address', bytes([0]) + b'10.0.0.1:50060')
    put(t, 'address-space', bytes([0]) + b'host name:1')
    put(t, 'zone', bytes([4]) + b'eu/paris/rack1')
    put(t, 'zone-ctl', bytes([4]) + b'eu/\x1b[2J')
    put(t, 'hash-upper', bytes([3]) + b'AB' * 32)
    # A JoinRequest as a whole (field 2: name).
    put(t, 'join-request', bytes([1]) + f_bytes(1, '127.0.0.1:1') + f_bytes(2, '\x1b]0;x\x07'))

# status_format: [status len u16][RunStatus][detail len u8][detail], then
# per worker: id, name, address, zone lengths (u8) and bytes, state, ...
def status_format_seeds():
    t = 'status_format'
    def s8(b):
        if isinstance(b, str): b = b.encode()
        return bytes([len(b)]) + b
    def worker(i, name, reason, zone=b'eu/paris'):
        return (s8(i) + s8(name) + s8('127.0.0.1:5000') + s8(zone) + bytes([1]) + s8(reason) +
                bytes([1, 0]) + s8('') + bytes([1]) + s8(reason) + bytes([0]) + s8(zone) +
                s8(reason) + bytes([0]) + s8(reason))
    put(t, 'empty', b'')
    put(t, 'plain', u16(0) + s8('waiting') + worker('w1', 'one', 'ok') + worker('w2', 'two', 'ok'))
    put(t, 'hostile', u16(0) + s8(b'\x1b[2J') + worker('w1', b'\x1b]0;pwned\x07', b'bye\nfake row') +
        worker(b'w\x1b2', 'a\u202eb'.encode(), b'\xc2\x9b') + worker('w3', b'\xff', b'\x07', b'\x1b'))
    put(t, 'gossip', u16(0) + s8('') + worker('w1', b'\x1b[31m', b'') + bytes([1]))

if __name__ == "__main__":
    encoded_slice_seeds()
    encoded_pieces_seeds()
    gossip_transfer_seeds()
    model_file_seeds()
    auth_seeds()
    run_specs_seeds()
    dataset_file_seeds()
    checkpoint_upload_seeds()
    join_request_seeds()
    read_slice_rule_seeds()
    join_limiter_seeds()
    read_encoded_request_seeds()
    audit_report_seeds()
    text_limits_seeds()
    status_format_seeds()
