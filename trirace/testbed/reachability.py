"""Proof that every node reaches another over the emulated links, right after building them."""

from __future__ import annotations

import shutil
import subprocess
import sys

from ..errors import UsageError
from .shell import run
from .topology import Testbed

PROBE_PORT = 47177  # fresh namespaces: nothing else can hold it
PROBE_TIMEOUT_S = 15

# Each node listens on its own address and connects to the next node, so one concurrent round
# exercises every uplink and every downlink; exits 0 only when both halves succeed.
_TCP_PROBE = r"""
import socket, sys, threading, time
me, peer, port = sys.argv[1], sys.argv[2], int(sys.argv[3])
srv = socket.socket(); srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
srv.bind((me, port)); srv.listen(8); srv.settimeout(10)
got = []
def serve():
    try:
        conn, _ = srv.accept(); got.append(conn.recv(4) == b"ping"); conn.close()
    except OSError:
        pass
t = threading.Thread(target=serve); t.start()
deadline = time.monotonic() + 10
while True:
    try:
        c = socket.create_connection((peer, port), timeout=2); c.sendall(b"ping"); c.close(); break
    except OSError as e:
        if time.monotonic() > deadline:
            sys.exit(f"connect {peer}: {e}")
        time.sleep(0.05)
t.join()
sys.exit(0 if got == [True] else f"nothing reached {me}")
"""


def _peer(testbed: Testbed, node: int) -> int:
    return (node + 1) % testbed.nodes


def verify(testbed: Testbed, use_ping: bool | None = None) -> None:
    """Raise UsageError when some node cannot reach its neighbour; ping if present, else TCP."""
    if use_ping is None:
        use_ping = shutil.which("ping") is not None
    if use_ping:
        for node in range(testbed.nodes):
            peer = testbed.address(_peer(testbed, node))
            proc = run(["ip", "netns", "exec", testbed.namespace(node), "ping", "-c", "1", "-W", "2", peer], check=False)
            if proc.returncode != 0:
                raise UsageError(f"testbed: node {node} cannot ping {peer}; the kernel accepted the setup but drops its traffic")
        return
    procs = []
    for node in range(testbed.nodes):
        argv = ["timeout", "-k", "2", str(PROBE_TIMEOUT_S), "ip", "netns", "exec", testbed.namespace(node), sys.executable,
                "-c", _TCP_PROBE, testbed.address(node), testbed.address(_peer(testbed, node)), str(PROBE_PORT)]
        procs.append(subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True))
    failures = []
    for node, proc in enumerate(procs):
        _, err = proc.communicate()
        if proc.returncode != 0:
            lines = err.strip().splitlines()
            failures.append(f"node {node}: {lines[-1] if lines else f'exit status {proc.returncode}'}")
    if failures:
        raise UsageError(f"testbed: nodes cannot reach each other ({'; '.join(failures)})")
