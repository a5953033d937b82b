"""The record stage is on by default (JAX_CLUSTER_RECORD=0 turns it off),
and a host whose XLA never calls the probe target (no CUDA backend here)
keeps the traced calls, saying so."""

import warnings

import pytest

import jax_cluster
from jax_cluster import _ffi


@pytest.fixture
def fresh_registration():
    _ffi.recorded_targets.cache_clear()
    yield
    _ffi.recorded_targets.cache_clear()


def test_on_by_default_and_off_on_request(monkeypatch, fresh_registration):
    monkeypatch.delenv("JAX_CLUSTER_RECORD", raising=False)
    assert _ffi.record_stage_requested() and jax_cluster.info().record_stage
    monkeypatch.setenv("JAX_CLUSTER_RECORD", "0")
    assert not _ffi.record_stage_requested() and not jax_cluster.info().record_stage
    assert _ffi.recorded_targets() == frozenset()


def test_counts_start_at_zero_without_a_gpu(fresh_registration):
    assert _ffi.record_counts() == {"created": 0, "updated": 0, "captured": 0, "reused": 0}


def test_requested_without_the_probe_called_records_nothing(monkeypatch, fresh_registration):
    monkeypatch.delenv("JAX_CLUSTER_RECORD", raising=False)
    monkeypatch.setenv("JAX_CLUSTER_COMMAND_BUFFERS", "1")
    assert jax_cluster.info().record_stage
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert _ffi.recorded_targets() == frozenset()
    if _ffi.with_kernels():  # the probe was registered, but no CUDA runtime called it
        assert any("did not call the probe handler" in str(w.message) for w in caught)
    if _ffi.with_kernels():
        assert "recorded as kernel nodes where they can be" in str(jax_cluster.info())


def test_not_requested_when_calls_stay_out_of_the_graphs(monkeypatch, fresh_registration):
    monkeypatch.setenv("JAX_CLUSTER_RECORD", "1")
    monkeypatch.setenv("JAX_CLUSTER_COMMAND_BUFFERS", "0")
    assert _ffi.recorded_targets() == frozenset()
