"""A ZooKeeper election candidate, the reference `leaderd-bench handover`
times leaderd against: kazoo's lock recipe (an ephemeral sequential node,
a watch on the one before it), as Curator's LeaderLatch does.

    candidate.py HOSTS PATH ID FLAG

While it leads, FLAG exists (written atomically, as leaderd's flag file).
SIGTERM: the flag goes, the node is deleted, the session is closed, exit 0
(a graceful shutdown). SIGUSR1: the flag goes, the node is deleted, and it
asks again after HOLD_S (as `leaderd release --hold 500ms`).
"""

import os
import signal
import sys
import threading
import time

from kazoo.client import KazooClient

HOLD_S = 0.5

hosts, path, ident, flag = sys.argv[1:5]
zk = KazooClient(hosts=hosts, timeout=10.0)
zk.start(timeout=15)
lock = zk.Lock(path, ident)
state = threading.Lock()


def write_flag():
    tmp = flag + ".tmp"
    with open(tmp, "w") as f:
        f.write(ident + "\n")
    os.rename(tmp, flag)


def remove_flag():
    try:
        os.remove(flag)
    except FileNotFoundError:
        pass


def compete():
    lock.acquire()
    with state:
        if lock.is_acquired:
            write_flag()


def step_down():
    with state:
        remove_flag()
        lock.release()


def on_term(_sig, _frame):
    step_down()
    zk.stop()
    zk.close()
    os._exit(0)


def on_release(_sig, _frame):
    if not lock.is_acquired:
        return
    step_down()

    def again():
        time.sleep(HOLD_S)
        compete()

    threading.Thread(target=again, daemon=True).start()


signal.signal(signal.SIGTERM, on_term)
signal.signal(signal.SIGUSR1, on_release)
threading.Thread(target=compete, daemon=True).start()
print("ready", flush=True)
while True:
    signal.pause()
