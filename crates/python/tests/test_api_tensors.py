"""Registering KV cache tensors: what is accepted (any dtype with the right page size, a
contiguous slice of a larger tensor) and every refusal, each a LayoutError (or, for
memory the device layer refuses, a DeviceError) that names the group, the expected page
bytes and what was given."""

import numpy as np
import pytest
import torch

import kv_connector as kvc
from api_support import PAGE_SHAPE, PAGES, SMALL_STAGING, caches, layout

PAGE_BYTES = 8192


def connect(kv, lay=None, **kwargs):
    return kvc.Connector(layout=lay or layout(), kv_caches=kv, pool=kvc.MemoryPool(1 << 24), config=SMALL_STAGING, **kwargs)


def refused(kv, error=kvc.LayoutError, **kwargs) -> str:
    with pytest.raises(error) as raised:
        connect(kv, **kwargs)
    return str(raised.value)


def test_accepted_shapes_and_dtypes():
    with connect(caches()) as conn:
        assert conn.devices == ["cpu"] and conn.pool_backend == "memory"
    # Any dtype whose pages come out at the page size: bf16 with twice the elements.
    bf16 = [torch.zeros((PAGES, 2, 2, 16, 2, 32), dtype=torch.bfloat16) for _ in range(2)]
    connect(bf16).shutdown()
    # Flat pages, and a contiguous run of pages cut out of a larger tensor.
    flat = [torch.zeros((PAGES, PAGE_BYTES), dtype=torch.uint8) for _ in range(2)]
    connect(flat).shutdown()
    big = torch.zeros((3 * PAGES, *PAGE_SHAPE))
    connect([big[:PAGES], big[2 * PAGES :]]).shutdown()


def test_wrong_page_size_names_group_expected_and_given():
    kv = caches()
    kv[1] = torch.zeros((PAGES, 2, 2, 16, 2, 8))
    message = refused(kv)
    assert "group 1" in message and "8192 bytes" in message
    assert "[64, 2, 2, 16, 2, 8]" in message and "torch.float32" in message and "4096 bytes" in message


def test_wrong_dtype_changes_the_page_size_and_is_refused():
    kv = caches()
    kv[0] = kv[0].to(torch.float16)
    message = refused(kv)
    assert "group 0" in message and "torch.float16" in message and "4096" in message


def test_page_index_must_be_dim_0():
    kv = caches()
    kv[0] = torch.zeros((2, PAGES, 2, 16, 2, 16))  # layers first: pages are not dim 0
    assert "dim 0 must be the page index" in refused(kv)


def test_non_contiguous_views_are_refused_with_their_strides():
    kv = caches()
    kv[1] = torch.zeros((PAGES, 2, 2, 16, 16, 2)).transpose(4, 5)
    message = refused(kv)
    assert "group 1" in message and "not C-contiguous" in message and "strides" in message
    every_other = torch.zeros((2 * PAGES, *PAGE_SHAPE))[::2]
    assert "not C-contiguous" in refused([caches()[0], every_other])


def test_empty_scalar_and_non_tensor_caches_are_refused():
    kv = caches()
    kv[0] = torch.zeros((0, *PAGE_SHAPE))
    assert "1 to" in refused(kv)
    kv[0] = torch.tensor(1.0)
    assert "0-dimensional" in refused(kv)
    kv[0] = np.zeros((PAGES, *PAGE_SHAPE), dtype=np.float32)
    message = refused(kv)
    assert "ndarray" in message and "not a torch tensor" in message


def test_unsupported_devices_and_layouts_are_refused():
    kv = caches()
    kv[0] = torch.zeros((PAGES, *PAGE_SHAPE), device="meta")
    assert 'device "meta"' in refused(kv)
    kv = caches()
    kv[1] = kv[1].reshape(PAGES, -1).to_sparse()
    assert "torch.sparse_coo" in refused(kv)


def test_group_and_rank_counts_must_match_the_layout():
    assert "has 1 tensors" in refused(caches(groups=1))
    assert "has 3 tensors" in refused(caches(groups=3))
    assert "2 ranks" in refused([caches(), caches()])
    with pytest.raises(kvc.LayoutError, match="list of tensors"):
        connect(caches()[0])


def test_overlapping_caches_are_refused_by_the_device_layer():
    shared = torch.zeros((PAGES, *PAGE_SHAPE))
    with pytest.raises(kvc.DeviceError) as raised:
        connect([shared, shared])
    assert raised.value.kind == "borrowed_overlap"
    assert "groups 0 and 1 overlap" in str(raised.value)


def test_the_connector_holds_its_tensors_until_shutdown():
    import sys

    kv = caches()
    before = [sys.getrefcount(t) for t in kv]
    conn = connect(kv)
    assert [sys.getrefcount(t) for t in kv] == [b + 1 for b in before]
    conn.shutdown()
    assert [sys.getrefcount(t) for t in kv] == before, "released at shutdown"
    conn.shutdown()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_caches_are_registered_on_their_device():
    kv = [t.cuda() for t in caches()]
    with connect(kv) as conn:
        assert conn.devices == ["cuda:0"]
    mixed = [caches()[0], kv[1]]
    assert "mixes devices" in refused(mixed)
    with pytest.raises(kvc.ConfigError, match="device.kind"):
        kvc.Connector(layout=layout(), kv_caches=kv, config={"device": {"kind": "host"}, **SMALL_STAGING})
