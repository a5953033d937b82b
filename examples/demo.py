"""What jax_cluster does on this machine, and what it would do on an H200.

Runs anywhere: without a GPU every call takes XLA's dot, and the plan for a
described H200 shows the kernel choice it would make there.
"""

import jax
import jax.numpy as jnp
import numpy as np

import jax_cluster
from jax_cluster import DeviceInfo

print(jax_cluster.info(), "\n")

h200 = DeviceInfo("cuda", "NVIDIA H200 (described)", (9, 0), sm_count=132)
for shape in [(8192, 8192, 8192), (2304, 2304, 16384), (16, 14336, 4096), (64, 64, 7)]:
    p = jax_cluster.plan(*shape, dtype=jnp.bfloat16, device=h200)
    print(f"plan{shape} on the H200:\n{p.explain()}\n")

key_a, key_b = jax.random.split(jax.random.key(0))
a = jax.random.normal(key_a, (512, 1024), jnp.float32).astype(jnp.bfloat16)
b = jax.random.normal(key_b, (1024, 256), jnp.float32).astype(jnp.bfloat16)
c = jax.jit(jax_cluster.matmul)(a, b)
ref = np.asarray(a, np.float64) @ np.asarray(b, np.float64)
err = np.linalg.norm(np.asarray(c, np.float64) - ref) / np.linalg.norm(ref)
here = jax_cluster.plan(512, 256, 1024, dtype=jnp.bfloat16)
print(f"matmul on {jax.devices()[0].platform}: {here.path} path ({here.reason}); relative error {err:.1e}")
g = jax.grad(lambda a, b: jax_cluster.matmul(a, b, out_dtype=jnp.float32).sum())(a, b)
print("grad shape", g.shape, g.dtype)
