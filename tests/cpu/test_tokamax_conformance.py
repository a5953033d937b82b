"""jax_cluster.ragged_dot against tokamax's own ragged_dot test base (from the
installed tokamax wheel, not copied): every test that needs no quantized
inputs. On a CPU they run the XLA paths; on an H200 the grouped kernels."""

import importlib.util
import pathlib
import sys

import pytest

import jax_cluster

if importlib.util.find_spec("tokamax") is None:
    pytest.skip("tokamax is not installed (pip install tokamax==0.0.17)", allow_module_level=True)
if importlib.util.find_spec("xprof") is None:  # tokamax imports it for a profiler hook these tests never use
    sys.path.insert(0, str(pathlib.Path(__file__).parents[1] / "stubs"))

from tokamax._src.ops.ragged_dot import test_base  # noqa: E402


class TestJaxClusterRaggedDot(test_base.RaggedDotTestBase):
    def __init__(self, *args):
        super().__init__(*args, dot_fn=jax_cluster.ragged_dot)

    def setUp(self):
        super().setUp()
        if self._testMethodName.startswith("test_quantized"):
            self.skipTest("needs quantized (qwix) inputs, which jax_cluster.ragged_dot does not take yet")
