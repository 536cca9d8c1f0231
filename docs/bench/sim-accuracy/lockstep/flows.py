import sys, subprocess, time; sys.path.insert(0, ".")
from trirace.testbed.cluster import held
SRV = r"""
import socket, sys, time
me, port, n = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1); s.bind((me, port)); s.listen(4)
c, _ = s.accept(); got = 0
while got < n:
    b = c.recv(1 << 20)
    if not b: break
    got += len(b)
print("recv", port, got, time.time(), flush=True)
"""
CLI = r"""
import socket, sys, time
peer, port, n = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
for _ in range(100):
    try: c = socket.create_connection((peer, port)); break
    except OSError: time.sleep(0.05)
t = time.time(); c.sendall(b"x" * n); print("sent", port, t, time.time(), flush=True); time.sleep(5)
"""
rate = sys.argv[1]; n = 4 << 20
with held(2, 2, rate) as tb:
    for flows in (1, 2):
        srv = [subprocess.Popen(["ip", "netns", "exec", tb.namespace(1), sys.executable, "-c", SRV, tb.address(1), str(5000 + i), str(n)], stdout=subprocess.PIPE, text=True) for i in range(flows)]
        time.sleep(0.5)
        t0 = time.time()
        cli = [subprocess.Popen(["ip", "netns", "exec", tb.namespace(0), sys.executable, "-c", CLI, tb.address(1), str(5000 + i), str(n)], stdout=subprocess.PIPE, text=True) for i in range(flows)]
        outs = [p.communicate(timeout=60)[0] for p in srv]
        for p in cli: p.kill()
        ends = [float(o.split()[-1]) for o in outs]
        print(rate, flows, "flows of", n >> 20, "MiB: done after", [round(e - t0, 2) for e in ends], "s; ideal shared", round(flows * n * 8 / float(rate.rstrip("mbit")) / 1e6, 2))
