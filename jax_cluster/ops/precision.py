"""The `precision=` argument the ops share with lax's: refused as lax refuses
it, and honoured where it changes the result.

The kernels take bf16 and fp16 inputs, whose products are exact in their fp32
accumulators, so a precision level changes nothing there. For wider inputs it
does (float32 on a GPU: TF32 by default, full float32 when asked), and so
does a dot algorithm at any width (`lax.DotAlgorithmPreset` or its name, a
`lax.DotAlgorithm`: F16_F16_F32 rounds bf16 inputs to fp16, BF16_BF16_BF16
accumulates in bf16); only XLA's dot reads them, so such calls go to XLA's
path with the precision."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax import lax

_EXACT_PRODUCTS = (jnp.dtype(jnp.bfloat16), jnp.dtype(jnp.float16))
_ONE = jax.ShapeDtypeStruct((1,), jnp.float32)


def check_precision(who: str, precision) -> None:
    """A clear error, at trace time, for a precision lax would refuse."""
    if precision is None:
        return
    key = tuple(precision) if isinstance(precision, list) else precision
    try:
        hash(key)
    except TypeError:  # checked, not cached
        check = _lax_takes.__wrapped__
    else:
        check = _lax_takes
    try:
        check(key)
    except (TypeError, ValueError) as e:
        raise ValueError(f"{who}: {e}") from None


def needs_xla(precision, dtype) -> bool:
    """Whether `precision` changes a product of `dtype` inputs, so XLA's dot must run it."""
    if precision is None:
        return False
    return jnp.dtype(dtype) not in _EXACT_PRODUCTS or _names_an_algorithm(precision)


def _names_an_algorithm(precision) -> bool:
    if isinstance(precision, lax.DotAlgorithm):
        return True
    if isinstance(precision, str) and precision.upper() in lax.DotAlgorithmPreset.__members__:
        precision = lax.DotAlgorithmPreset[precision.upper()]
    return isinstance(precision, lax.DotAlgorithmPreset) and precision != lax.DotAlgorithmPreset.DEFAULT


@functools.lru_cache(maxsize=64)
def _lax_takes(precision) -> None:
    """lax's own check: a dot traced, not run, with the precision."""
    dot = functools.partial(lax.dot_general, dimension_numbers=(((0,), (0,)), ((), ())), precision=precision)
    jax.eval_shape(dot, _ONE, _ONE)
