#!/usr/bin/python3
"""Writes the seed corpora in fuzz/corpus/<target>/ (small valid and invalid inputs).

The files are committed; run this again only to change them: /usr/bin/python3 fuzz/make_corpus.py
(needs numpy, Debian's python3-numpy).
"""
import io
import json
import os
import struct

import numpy as np

os.chdir(os.path.join(os.path.dirname(os.path.abspath(__file__)), 'corpus'))
for d in ('store_protocol', 'torch_store_protocol', 'safetensors', 'npy'):
    os.makedirs(d, exist_ok=True)


def u32(v): return struct.pack('<I', v)
def u64(v): return struct.pack('<Q', v)
def i64(v): return struct.pack('<q', v)
def key(k): return u32(len(k)) + k
def val(v): return u64(len(v)) + v


# store_protocol: the first byte picks the decoder (see store_protocol_fuzzer.cpp):
# 0 request, 1 hello, 2 hello reply, 3..9 response to opcode 1..7.
sp = {
    'req_set': b'\x00\x01' + key(b'rank0/addr') + val(b'127.0.0.1:29500'),
    'req_get': b'\x00\x02' + key(b'nccl_id') + i64(60000),
    'req_add': b'\x00\x03' + key(b'counter') + i64(-1),
    'req_wait': b'\x00\x04' + u32(2) + key(b'a') + key(b'bb') + i64(1500),
    'req_check': b'\x00\x05' + u32(1) + key(b'a'),
    'req_cas': b'\x00\x06' + key(b'k') + val(b'') + val(b'new'),
    'req_delete': b'\x00\x07' + key(b'k'),
    'req_bad_opcode': b'\x00\x09' + key(b'k'),
    'req_huge_value': b'\x00\x01' + key(b'k') + u64(1 << 40),
    'req_negative_timeout': b'\x00\x02' + key(b'k') + i64(-5),
    'hello': b'\x01' + b'NDDPSTOR' + u32(1) + u32(6) + b'secret',
    'hello_bad_magic': b'\x01' + b'GET / HTTP/1.1\r\n',
    'hello_reply_refused': b'\x02\x00' + u32(9) + b'bad token',
    'resp_set_error': b'\x03\x02' + u32(5) + b'oops!',
    'resp_get_ok': b'\x04\x00' + val(b'value'),
    'resp_add_ok': b'\x05\x00' + i64(42),
    'resp_wait_timeout': b'\x06\x01' + u32(2) + key(b'x') + key(b'y'),
    'resp_check_ok': b'\x07\x00\x01',
}
for name, data in sp.items():
    open(f'store_protocol/{name}', 'wb').write(data)

# torch_store_protocol: the first byte picks the query whose answer follows (see
# torch_store_protocol_fuzzer.cpp): 0 compare_set, 1 get, 2 add, 3 check, 4 wait, 5 delete.
tsp = {
    'compare_set_value': b'\x00' + u64(2) + b'v1',
    'get_value': b'\x01' + u64(5) + b'hello',
    'get_empty': b'\x01' + u64(0),
    'get_huge_length': b'\x01' + u64(1 << 40),
    'get_truncated': b'\x01' + u64(9) + b'abc',
    'add_number': b'\x02' + i64(-12),
    'check_ready': b'\x03\x00',
    'check_not_ready': b'\x03\x01',
    'check_bad_status': b'\x03\x07',
    'wait_stop_waiting': b'\x04\x00',
    'delete_one': b'\x05' + i64(1),
    'delete_bad_count': b'\x05' + i64(3),
}
for name, data in tsp.items():
    open(f'torch_store_protocol/{name}', 'wb').write(data)


def safetensors(tensors, meta=None, extra=b''):
    header, buf = {}, b''
    for name, (dtype, shape, data) in tensors.items():
        header[name] = {'dtype': dtype, 'shape': shape,
                        'data_offsets': [len(buf), len(buf) + len(data)]}
        buf += data
    if meta is not None:
        header['__metadata__'] = meta
    h = json.dumps(header, separators=(',', ':')).encode()
    h += b' ' * (-len(h) % 8)
    return u64(len(h)) + h + buf + extra


f32 = np.arange(6, dtype='<f4').tobytes()
st = {
    'two_tensors': safetensors({'layers.0.weight': ('F32', [2, 3], f32),
                                'layers.0.bias': ('BF16', [2], b'\x80\x3f\x00\x40')},
                               {'step': '7', 'checksum': '0123456789abcdef'}),
    'f64_f16_i64': safetensors({'a': ('F64', [1], np.array([1.5]).tobytes()),
                                'b': ('F16', [1, 1], b'\x00\x3c'), 'c': ('I64', [0], b'')}),
    'empty': safetensors({}),
    'trailing_bytes': safetensors({'x': ('F32', [1], f32[:4])}, extra=b'junk'),
    'overlap': u64(96) + json.dumps(
        {'a': {'dtype': 'F32', 'shape': [1], 'data_offsets': [0, 4]},
         'b': {'dtype': 'F32', 'shape': [1], 'data_offsets': [0, 4]}}).encode().ljust(96) + f32[:4],
    'truncated': safetensors({'layers.0.weight': ('F32', [2, 3], f32)})[:-5],
    'not_json': u64(8) + b'{"a": [1',
}
for name, data in st.items():
    open(f'safetensors/{name}', 'wb').write(data)


def npy(arr):
    b = io.BytesIO()
    np.save(b, arr)
    return b.getvalue()


h = b"{'descr': '<f4', 'fortran_order': False, 'shape': (1, 2), }"
h += b' ' * (-(12 + len(h) + 1) % 64) + b'\n'
np_files = {
    'f32_matrix.npy': npy(np.arange(6, dtype='<f4').reshape(2, 3)),
    'f64_vector.npy': npy(np.array([1.0, float('nan'), 3.0])),
    'scalar.npy': npy(np.float32(2.5)),
    'empty.npy': npy(np.zeros((0, 4), dtype='<f4')),
    'int_dtype.npy': npy(np.arange(3, dtype='<i4')),
    'fortran.npy': npy(np.asfortranarray(np.ones((2, 2), dtype='<f4'))),
    'truncated.npy': npy(np.ones((4, 4), dtype='<f4'))[:-3],
    'v2.npy': b'\x93NUMPY\x02\x00' + u32(len(h)) + h + np.ones(2, dtype='<f4').tobytes(),
}
for name, data in np_files.items():
    open(f'npy/{name}', 'wb').write(data)
