"""The fit policy shared by the launches' pruning and the compile report."""
import pytest

from polaformer_mm.ops.pola_attention.triton_resources import (TARGET_LIMITS, Limits, Usage,
                                                               candidates, fits, limits_of,
                                                               misfit_reason)

A100 = limits_of(80)


def test_limits_of_known_targets_and_an_unknown_one_named():
    assert A100 == Limits(163 * 1024, 65536)
    assert limits_of(86).shared == limits_of(89).shared == 99 * 1024  # RTX 30xx / 40xx, L4
    assert limits_of(90).shared == 227 * 1024
    with pytest.raises(ValueError, match=r'sm_61.*sm_80'):
        limits_of(61)
    assert all(limits.registers == 65536 for limits in TARGET_LIMITS.values())


def test_shared_memory_and_registers_per_block_decide_the_fit():
    assert fits(Usage(255, 0, 0, 163 * 1024, 256), A100)
    # the 176 KiB the first query backward kernel asked for with TF32 at width 64
    reason = misfit_reason(Usage(255, 0, 0, 176 * 1024, 128), A100)
    assert reason == f'{176 * 1024} B of shared memory > {163 * 1024} B'
    # 255 registers x 512 threads is more than a block's 64 K registers
    assert 'registers per block' in misfit_reason(Usage(255, 0, 0, 1024, 512), A100)


def test_candidates_fit_and_do_not_spill_unless_every_fitting_one_spills():
    free = Usage(200, 0, 0, 40 * 1024, 256)
    spills = Usage(255, 588, 600, 40 * 1024, 128)
    too_big = Usage(128, 0, 0, 200 * 1024, 256)
    assert candidates([('a', spills), ('b', free), ('c', too_big)], A100) == ['b']
    assert candidates([('a', spills), ('c', too_big)], A100) == ['a']  # all fitting ones spill
    assert candidates([('c', too_big)], A100) == []
    # a configuration whose use is not known stays: its launch decides
    assert candidates([('a', spills), ('u', None)], A100) == ['u']
