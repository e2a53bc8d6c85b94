"""Launch each tensor-core chunked kernel once (both ops, T = 8192, B = 4, H = 16, K = V = 128, bf16), for a
profiler to look at:

    ncu --clock-control none -k regex:"chunked|wy_prepare" python tools/profile_chunked.py

Arguments op:version (e.g. linear:7 delta:10) launch only those versions. tools/ncu_regions.py splits a
report's source page by the kernel's block barriers. Needs minilin installed with its extension built
(`pip install -e .` on a GPU machine), or `python -m tools.profile_chunked` from the checkout's root.
"""
import sys

import cupy

from minilin import cuda

B, T, H, K, V = 4, 8192, 16, 128, 128
rng = cupy.random.default_rng(0)
q, k, v = (cuda.to_bf16(rng.standard_normal((B, T, H, d), dtype=cupy.float32)) for d in (K, K, V))
k = cuda.to_bf16(cuda.from_bf16(k) / cupy.linalg.norm(cuda.from_bf16(k), axis=-1, keepdims=True))
g = rng.uniform(-1.0, -0.01, (B, T, H), dtype=cupy.float32)
beta = rng.uniform(0.0, 1.0, (B, T, H), dtype=cupy.float32)
wanted = {tuple(a.split(":")) for a in sys.argv[1:]}
chosen = [i for i in cuda.versions() if i["op"] in ("linear", "delta") and i["bfloat16"] and i["version"] >= 3
          and (not wanted or (i["op"], str(i["version"])) in wanted)]
for info in chosen:
    if info["op"] == "linear":
        cuda.simple_gla(q, k, v, g, version=info["version"], check_values=False)
    else:
        cuda.gated_deltanet(q, k, v, g, beta, version=info["version"], check_values=False)
cupy.cuda.get_current_stream().synchronize()
print("launched:", [f"{i['op']} v{i['version']}" for i in chosen])
