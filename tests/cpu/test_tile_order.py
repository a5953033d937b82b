"""The work queue's cluster-tile walk (cc/common/cluster_tile_order.h), read
through the extension's host copy of the code the device runs."""

import itertools

import pytest

from jax_cluster import _ffi

order = getattr(_ffi.extension(), "cluster_tile_order", None)
pytestmark = pytest.mark.skipif(order is None, reason="the compiled extension is missing")


def _tiles(*args):
    return [tuple(t) for t in order(*args)]


def test_hand_cases():
    assert _tiles(5, 3, 1, 2, True) == [
        (0, 0, 0),
        (1, 0, 0),
        (0, 1, 0),
        (1, 1, 0),
        (0, 2, 0),
        (1, 2, 0),  # band 0, forward
        (2, 2, 0),
        (3, 2, 0),
        (2, 1, 0),
        (3, 1, 0),
        (2, 0, 0),
        (3, 0, 0),  # band 1, backward
        (4, 0, 0),
        (4, 1, 0),
        (4, 2, 0),
    ]  # band 2: one row
    # Along M the bands are columns of N; a swizzle wider than the grid is one band.
    assert _tiles(2, 3, 1, 8, False) == [(0, 0, 0), (0, 1, 0), (0, 2, 0), (1, 0, 0), (1, 1, 0), (1, 2, 0)]
    # Swizzle 1 is CUTLASS's plain raster, but serpentine.
    assert _tiles(2, 2, 2, 1, True) == [
        (0, 0, 0),
        (0, 1, 0),
        (1, 1, 0),
        (1, 0, 0),
        (0, 0, 1),
        (0, 1, 1),
        (1, 1, 1),
        (1, 0, 1),
    ]
    assert _tiles(0, 4, 1, 2, True) == []


@pytest.mark.parametrize(
    "tm,tn,batches,swizzle,along_n",
    [
        (33, 33, 1, 8, True),
        (33, 33, 1, 8, False),
        (7, 1, 3, 4, True),
        (1, 9, 2, 8, True),
        (64, 24, 1, 8, False),
        (17, 5, 2, 2, True),
    ],
)
def test_every_tile_once_with_no_padding(tm, tn, batches, swizzle, along_n):
    tiles = _tiles(tm, tn, batches, swizzle, along_n)
    assert len(tiles) == tm * tn * batches
    assert set(tiles) == set(itertools.product(range(tm), range(tn), range(batches)))
    # consecutive indices stay within one band of `swizzle` rows of the minor axis
    minor = [t[0] if along_n else t[1] for t in tiles]
    width = min(swizzle, tm if along_n else tn)
    per_batch = tm * tn
    for i in range(len(tiles)):
        band = (i % per_batch) // (width * (tn if along_n else tm))
        assert minor[i] // width == band


def test_a_wave_of_66_clusters_at_8448_squared_stays_in_a_band():
    # 8448^2 in 128x256 tiles, 2x1 clusters: 33 x 33 cluster tiles, 66 resident.
    wave = _tiles(33, 33, 1, 8, True)[:66]
    assert {m for m, _, _ in wave} == set(range(8))
    assert {n for _, n, _ in wave} == set(range(9))  # 66 / 8: 8 columns and 2 tiles of a 9th
