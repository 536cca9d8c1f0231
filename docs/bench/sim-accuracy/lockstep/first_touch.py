"""What touching memory costs on this host, the first time and again: a fresh process fills
argv[1] GB of new memory, then fills it again. Stop 43, run in sequence 2 2 18 18 2 an hour
after boot: the first fill cost 1.5-1.7 s/GB at 2 GB, 2.7 s/GB at 18 GB (pages never touched
since boot), 1.2 s/GB at 18 GB again and 0.37 s/GB at 2 GB after that; every second fill
0.1-0.2 s/GB. The VM's balloon reports freed pages to the host (virtio_balloon feature bit 5),
so memory left free a while costs a first touch again."""
import sys, time, torch

gb = float(sys.argv[1])
x = torch.empty(int(gb * 2**30 / 4))
t0 = time.perf_counter()
x.fill_(1.0)
t1 = time.perf_counter()
x.fill_(2.0)
t2 = time.perf_counter()
print(f"{gb:5.1f} GB: first touch {(t1 - t0) / gb:.3f} s/GB, again {(t2 - t1) / gb:.3f} s/GB")
