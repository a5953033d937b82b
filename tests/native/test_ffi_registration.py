"""An extension whose FFI handlers XLA refuses (built against another jax's
XLA FFI, say) leaves every call on XLA's path with a warning that says why,
instead of failing each jit that lowers a kernel call."""

import json
import os
import subprocess
import sys

import pytest

from jax_cluster import _ffi

# XLA's words when a handler was built against a newer FFI than the installed jaxlib's
REFUSED = (
    "INVALID_ARGUMENT: XLA FFI handler registration for jax_cluster_gemm on platform CUDA (canonical cuda) "
    "failed because the handler's API version (0.5) is incompatible with the framework's API version (0.4)."
)

# A fresh process: registration happens once per process.
CODE = f"""
import json, warnings
import jax, jax.numpy as jnp

def refuse(*args, **kwargs):
    raise jax.errors.JaxRuntimeError({REFUSED!r})

jax.ffi.register_ffi_type = jax.ffi.register_ffi_target = refuse
import jax_cluster
from jax_cluster import _ffi
from jax_cluster.planning.device import DeviceInfo

h200 = DeviceInfo("cuda", "NVIDIA H200", (9, 0), 132, 232448, 60 << 20)
before = jax_cluster.plan(4096, 4096, 4096, dtype=jnp.bfloat16, device=h200, path="kernel")
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    registered = _ffi.register_targets()
after = jax_cluster.plan(4096, 4096, 4096, dtype=jnp.bfloat16, device=h200, path="kernel")
print(json.dumps({{
    "registered": registered,
    "warnings": [str(w.message) for w in caught],
    "with_kernels": _ffi.with_kernels(),
    "why": _ffi.why_no_kernels(),
    "before": before.path,
    "after": [after.path, after.reason],
    "info": str(jax_cluster.info()),
}}))
"""


@pytest.mark.skipif(not _ffi.with_kernels(), reason="built without kernels")
def test_refused_handlers_leave_every_call_on_xla_with_the_reason():
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    run = subprocess.run([sys.executable, "-c", CODE], capture_output=True, text=True, env=env, cwd="/")
    assert run.returncode == 0, run.stdout + run.stderr
    out = json.loads(run.stdout.strip().splitlines()[-1])
    assert out["registered"] is False and not out["with_kernels"]
    assert len(out["warnings"]) == 1 and "falls back to XLA's dot" in out["warnings"][0]
    assert "XLA refused the extension's FFI handlers" in out["why"] and "rebuild it against this one" in out["why"]
    assert out["before"] == "kernel"  # planned for the kernel until XLA refused it
    assert out["after"][0] == "xla" and "XLA refused" in out["after"][1]
    assert "kernels: no: XLA refused" in out["info"]
