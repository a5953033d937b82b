"""jax_cluster.ragged_dot against tokamax's own ragged_dot test base (from the
installed tokamax wheel, not copied): every test but those that pass
tokamax's own AsQArray type. On a CPU they run the XLA paths; on a GPU with
JAX_CLUSTER_ROUTE=kernel (gpu_check.sh's conformance step) the grouped kernels."""

import importlib.util
import pathlib
import sys
import unittest

import pytest

import jax_cluster

if importlib.util.find_spec("tokamax") is None:
    pytest.skip("tokamax is not installed (pip install tokamax==0.0.17)", allow_module_level=True)
if importlib.util.find_spec("xprof") is None:  # tokamax imports it for a profiler hook these tests never use
    sys.path.insert(0, str(pathlib.Path(__file__).parents[1] / "stubs"))

from tokamax._src import quantization  # noqa: E402
from tokamax._src.ops.ragged_dot import test_base  # noqa: E402


def _ragged_dot(lhs, rhs, group_sizes, **kwargs):
    # tokamax's AsQArray is a bf16 array with a request to quantize it inside
    # tokamax's kernel: a type of tokamax's own, which no other ragged_dot takes
    if any(isinstance(x, quantization.AsQArray) for x in (lhs, rhs)):
        raise unittest.SkipTest("tokamax's AsQArray (quantize inside tokamax's kernel) is tokamax's own type")
    return jax_cluster.ragged_dot(lhs, rhs, group_sizes, **kwargs)


class TestJaxClusterRaggedDot(test_base.RaggedDotTestBase):
    """Quantized inputs are qwix QArrays of int8 or int4 values in many
    tilings: jax_cluster dequantizes them and runs the grouped product."""

    def __init__(self, *args):
        super().__init__(*args, dot_fn=_ragged_dot)
