#!/usr/bin/env python3
"""The GPU machine's copy floor, with PyTorch (there, not here): 84 MB (the
MLP of docs/gpu.md check b) off and onto the device, pageable and pinned."""
import time, torch
n = 21_030_000  # the 1024-4096-4096-10 MLP's f32 values, 84 MB
x = torch.randn(n, device="cuda")
def rate(f, reps=5):
    f(); torch.cuda.synchronize()
    best = 1e9
    for _ in range(reps):
        t = time.perf_counter(); f(); torch.cuda.synchronize(); best = min(best, time.perf_counter() - t)
    return n * 4 / best / 1e9, best * 1e3
page = torch.empty(n); pinned = torch.empty(n, pin_memory=True)
for name, f in [("d2h new pageable (x.cpu())", lambda: x.cpu()),
                ("d2h into pageable", lambda: page.copy_(x)),
                ("d2h into pinned", lambda: pinned.copy_(x)),
                ("h2d from pageable", lambda: x.copy_(page)),
                ("h2d from pinned", lambda: x.copy_(pinned)),
                ("device copy (cat of two halves)", lambda: torch.cat([x[: n // 2], x[n // 2 :]]))]:
    gbs, ms = rate(f)
    print(f"{name}: {gbs:.2f} GB/s, {ms:.1f} ms for 84 MB")
