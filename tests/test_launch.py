"""attnbench.launch: the driver structures cuLaunchKernelEx reads are laid out as cuda.h lays them
out, and kernel arguments pack to the C types the kernels declare (CPU; the launch itself is tested
on the GPU in tests/test_decode.py)."""
import ctypes

import numpy as np
import pytest

from attnbench import launch


def test_the_launch_structures_have_cuda_hs_layout():
    # CUlaunchAttribute: a 4-byte id, padding to 8, a 64-byte value union
    assert ctypes.sizeof(launch._Attribute) == 72 and launch._Attribute.value.offset == 8
    # CUlaunchConfig: seven unsigned ints, the stream pointer aligned to 8, the attributes, their count
    assert launch._Config.hStream.offset == 32 and launch._Config.attrs.offset == 40
    assert launch._Config.numAttrs.offset == 48 and ctypes.sizeof(launch._Config) == 56


@pytest.mark.parametrize("value, ctype, want", [
    (np.int32(-7), ctypes.c_int32, -7),
    (np.uint64(1 << 40), ctypes.c_uint64, 1 << 40),
    (np.float32(0.5), ctypes.c_float, 0.5),
])
def test_scalars_pack_to_their_sized_c_types(value, ctype, want):
    p = launch._param(value)
    assert isinstance(p, ctype) and p.value == want


def test_none_packs_as_a_null_pointer_and_an_unsized_number_is_refused():
    assert launch._param(None).value in (None, 0)
    with pytest.raises(TypeError, match="pdl_launch: an argument of type int"):
        launch._param(3)


def test_a_launch_grid_is_three_dimensions():
    assert launch._dims((5,)) == (5, 1, 1) and launch._dims(7) == (7, 1, 1) and launch._dims((2, 3, 4)) == (2, 3, 4)


def test_without_the_drivers_occupancy_call_no_cluster_fits_and_the_result_says_why(monkeypatch):
    monkeypatch.setattr(launch, "_occupancy", lambda: None)
    assert launch.max_active_clusters(object(), (4, 8, 1), 128, 0) == (0, -1)
