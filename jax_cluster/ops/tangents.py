"""Tangents in the ops' custom JVP rules (linear, gated_ragged_dot), whose
products are bilinear: transposed by jax.grad, the two terms of a product's
tangent are its two gradient products."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp


def is_zero(tangent) -> bool:
    """An absent operand (None), or one not differentiated (a symbolic zero)."""
    return tangent is None or isinstance(tangent, jax.custom_derivatives.SymbolicZero)


def bilinear_tangent(product, a, b, da, db, like):
    """product(da, b) + product(a, db), a term only where its tangent is not
    zero; zeros like `like` where both are."""
    terms = ([] if is_zero(da) else [product(da, b)]) + ([] if is_zero(db) else [product(a, db)])
    return functools.reduce(jnp.add, terms) if terms else jnp.zeros_like(like)
