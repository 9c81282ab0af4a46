"""Loads every visible GPU with bf16 matrix products for the given seconds (gpucheck)."""
import sys
import time

import torch

seconds = float(sys.argv[1]) if len(sys.argv) > 1 else 15.0
devices = [torch.device("cuda", i) for i in range(torch.cuda.device_count())]
if not devices:
    sys.exit("matmul.py: no CUDA device")
n = 8192
mats = [(torch.randn(n, n, device=d, dtype=torch.bfloat16), torch.randn(n, n, device=d, dtype=torch.bfloat16)) for d in devices]
print(f"matmul.py: {n}x{n} bf16 products on {len(devices)} GPU(s) for {seconds:.0f}s", flush=True)
end = time.time() + seconds
products = 0
while time.time() < end:
    for a, b in mats:
        for _ in range(20):
            torch.mm(a, b)
    for d in devices:
        torch.cuda.synchronize(d)
    products += 20 * len(mats)
print(f"matmul.py: {products} products, {products * 2 * n**3 / seconds / 1e12:.0f} TFLOP/s overall", flush=True)
