"""The one check that a plan fits a call (planning.call.fits), which every
binder and partition rule applies through primitives.plans."""

import dataclasses

import jax
import jax.numpy as jnp
import pytest

import jax_cluster
from jax_cluster.planning.call import Call, fits
from jax_cluster.planning.device import DeviceInfo
from jax_cluster.primitives import plans
from jax_cluster.primitives.gemm import gemm

H200 = DeviceInfo("cuda", "NVIDIA H200", (9, 0), 132, 232448, 50 << 20)
CALL = Call("dense", 256, 512, 1024, 1, "k", "n", "bf16", "bf16")


def test_a_plan_fits_the_call_it_was_made_for():
    p = jax_cluster.plan(256, 512, 1024, dtype=jnp.bfloat16, device=H200)
    assert p.call == CALL and fits(p, CALL) == ""


@pytest.mark.parametrize(
    "field,value",
    [
        ("m", 128),
        ("n", 256),
        ("k", 512),
        ("count", 2),
        ("a_major", "m"),
        ("b_major", "k"),
        ("dtype", "f16"),
        ("out_dtype", "f32"),
        ("epilogue", "bias_act"),
        ("problem", "ragged_m"),
    ],
)
def test_every_field_the_kernel_obeys_is_checked(field, value):
    p = jax_cluster.plan(256, 512, 1024, dtype=jnp.bfloat16, device=H200)
    why = fits(p, dataclasses.replace(CALL, **{field: value}))
    assert why.startswith("the plan was made for dense M=256 N=512 K=1024"), why


def test_a_shard_with_other_majors_is_planned_afresh():
    """A plan for B [K,N] is not reused for a shard whose B is [N,K], even with the same sizes."""
    p = jax_cluster.plan(256, 512, 1024, dtype=jnp.bfloat16, device=H200)
    other = dataclasses.replace(CALL, b_major="k")
    assert plans.for_shard(p, CALL) is p
    fresh = plans.for_shard(p, other)
    assert fresh is not p and (fresh.b_major, fresh.device) == ("k", H200)


def test_a_binder_refuses_a_plan_for_another_layout():
    p = jax_cluster.plan(256, 512, 1024, dtype=jnp.bfloat16, device=H200)
    a, b = jax.ShapeDtypeStruct((256, 1024), jnp.bfloat16), jax.ShapeDtypeStruct((512, 1024), jnp.bfloat16)
    with pytest.raises(ValueError, match="B n-major .* but this call is .* B k-major"):
        jax.eval_shape(lambda a, b: gemm(a, b, a_major="k", b_major="k", plan=p), a, b)
