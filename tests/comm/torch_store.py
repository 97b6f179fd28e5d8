"""TorchStore (nanoddp/comm/torch_store.h) against PyTorch's own TCPStore server.

Serves a real torch.distributed.TCPStore on 127.0.0.1 (the store torchrun's agent serves), runs
nanoddp-test-torch-store against it, and reads back with PyTorch what nanoddp wrote.

    torch_store.py PROBE    (run by tests/comm/torch_store.sh)
"""
import subprocess
import sys
import threading
import time
from datetime import timedelta

from torch.distributed import TCPStore

probe = sys.argv[1]
store = TCPStore('127.0.0.1', 0, is_master=True, wait_for_workers=False,
                 timeout=timedelta(seconds=30))
store.set('from_torch', 'hello')
store.set('big', b'b' * 2000)


def set_late():
    # Its own client: once the probe says it is about to wait, 0.3 s later, set the key.
    client = TCPStore('127.0.0.1', store.port, is_master=False, wait_for_workers=False,
                      timeout=timedelta(seconds=30))
    client.wait(['about_to_wait'])
    time.sleep(0.3)
    client.set('late', 'x')


threading.Thread(target=set_late, daemon=True).start()
run = subprocess.run([probe, str(store.port)], capture_output=True, text=True, timeout=60)
print(run.stdout, run.stderr, sep='', end='')
failed = run.returncode != 0


def expect(cond, what):
    global failed
    print(('ok ' if cond else 'FAILED ') + what)
    failed |= not cond


expect(store.get('from_nanoddp') == b'\x00\x01 binary \xff', 'torch reads the bytes nanoddp set')
expect(store.get('counter') == b'12', "torch reads nanoddp's counter")
expect(store.add('counter', 1) == 13, "torch adds to nanoddp's counter")
expect(not store.delete_key('cas'), 'the key nanoddp removed is gone for torch too')
expect(store.get('nanoddp/restart0/rank0') == b'addr', 'prefixed keys land under nanoddp/')
sys.exit(1 if failed else 0)
