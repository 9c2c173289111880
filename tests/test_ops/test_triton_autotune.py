"""The kernels' autotuners on the installed Triton, without a GPU: the key each release
finds, and the pruning, driven through Triton's own ``Autotuner`` on CPU tensors up to the
point where it would time the configurations it kept (2.1.0 on the oldest stack, 3.7.1 on
the pinned one; .dev_scripts/check_tritons.py runs these beside other releases)."""
import os

import pytest
import torch

from polaformer_mm.utils.compat import triton_status

pytestmark = pytest.mark.skipif(
    not triton_status().usable or os.environ.get('TRITON_INTERPRET', '0') == '1',
    reason=f'{triton_status().reason or "TRITON_INTERPRET=1"} (the autotuners of the compiled '
    'kernels need a supported Triton, not its interpreter)')


def _kernels():
    from polaformer_mm.ops.pola_attention import triton_kernels
    return triton_kernels


def test_every_kernel_keys_on_head_width_and_precision():
    """The key is found by name (Triton 3.2+) or by position among the arguments a launch
    passes (2.x to 3.1): both name d and PRECISION, because the arguments the
    configurations supply come last in every kernel."""
    kernels = _kernels()
    for name, autotuner in kernels.KERNELS.items():
        jit_fn = autotuner.fn
        assert kernels.autotuned_parameters_last(jit_fn, kernels.CONFIGS[name]), name
        supplied = set().union(*(c.kwargs for c in kernels.CONFIGS[name]))
        passed = [n for n in autotuner.arg_names if n not in supplied]
        if hasattr(autotuner, 'key_idx'):  # by position
            assert [passed[i] for i in autotuner.key_idx] == kernels.KEY, name
        else:  # by name
            assert list(autotuner.keys) == kernels.KEY, name
        assert set(kernels.KEY) <= set(passed), name


def test_the_order_check_names_a_wrong_order():
    kernels = _kernels()
    jit_fn = kernels.KERNELS['key_backward'].fn
    assert kernels.autotuned_parameters_last(jit_fn, kernels.CONFIGS['key_backward'])
    # configurations supplying BLOCK_D, which comes before PRECISION, TINY and EXP_FLOOR
    wrong = [kernels.compat.make_config({'BLOCK_D': 32}, 4, 2)]
    assert not kernels.autotuned_parameters_last(jit_fn, wrong)


class _Pruned(Exception):
    """Raised by the test's pruning after the real one ran: the autotuner stops there,
    before it would time the kept configurations on a GPU."""

    def __init__(self, kept, named_args, launch):
        super().__init__('pruned')
        self.kept, self.named_args, self.launch = kept, named_args, launch


def test_pruning_runs_in_the_autotuner_and_drops_what_does_not_fit():
    """Triton's Autotuner, launched as the backend launches (CPU tensors), calls the
    pruning with its own arguments; compiled for sm_80 with a 16 KiB shared-memory
    limit, the configurations that need more are dropped, with the reason."""
    from polaformer_mm.ops.pola_attention import triton_backend
    from polaformer_mm.ops.pola_attention.triton_resources import Limits
    kernels = _kernels()
    compat = kernels.compat
    name = 'key_summary'
    jit_fn = kernels.KERNELS[name].fn
    configs = [kernels.CONFIGS[name][i] for i in (0, 2, 5)]  # BLOCK_N 64 / 32 / 16
    limit = 16 * 1024
    target = kernels.NamedTarget(80, Limits(shared=limit, registers=65536))

    def prune(configs, named_args, **launch):
        kept = kernels.fitting_configs(jit_fn, configs, named_args, target=target, **launch)
        raise _Pruned(kept, named_args, launch)

    autotuner = compat.autotune(configs, kernels.KEY, prune)(jit_fn)
    B, h, n, d = 1, 2, 40, 32
    g = torch.Generator().manual_seed(0)
    k, v = (torch.randn(B, h, n, d, generator=g) for _ in range(2))
    p = torch.full((h, d), 2.)
    rows, splits = 64, 1
    kv = torch.empty(B * h, splits, 2 * d, d)
    sums = torch.empty(B * h, splits, 2 * d)
    shifts = torch.empty(B * h, splits)
    meta = triton_backend.constants(d, 'ieee')
    with pytest.raises(_Pruned) as pruned:
        autotuner[(B * h, splits, 2)](k, v, p, kv, sums, shifts, *k.stride(), *v.stride(), h, n, d,
                                      rows, splits, *meta.values(), **compat.LAUNCH_OPTIONS)
    stop = pruned.value
    # the pruning saw every argument of the launch (Triton 2.x passes only the positional
    # ones), and no grid or warmup reached the compiler
    assert {k: stop.named_args[k] for k in meta} == meta
    assert 'grid' not in compat.split_launch(stop.launch)
    decisions = target.decisions
    assert [dec.config for dec in decisions] == configs
    assert stop.kept == [dec.config for dec in decisions if dec.dropped is None]
    assert stop.kept and len(stop.kept) < len(configs), decisions  # some dropped, some kept
    for dec in decisions:
        assert dec.usage is not None and dec.usage.threads == 32 * dec.config.num_warps
        if dec.usage.shared > limit:
            assert dec.dropped == f'{dec.usage.shared} B of shared memory > {limit} B', dec
        elif dec.dropped is not None:  # fits, but spills where another does not
            assert 'spill stores' in dec.dropped and dec.usage.spill_stores > 0, dec
            assert any(o.dropped is None and o.usage.spill_stores == 0 for o in decisions)
    # a larger block of rows needs at least as much shared memory for its double buffers
    shared = [dec.usage.shared for dec in decisions]
    assert shared[0] >= shared[1] >= shared[2], shared


def test_pruning_keeps_everything_when_nothing_fits():
    """With a limit no configuration meets, all are given back: the launch then names
    the problem (Triton's own error), instead of an empty list."""
    from polaformer_mm.ops.pola_attention.triton_resources import Limits
    kernels = _kernels()
    jit_fn = kernels.KERNELS['value_backward'].fn
    configs = [kernels.CONFIGS['value_backward'][5]]
    target = kernels.NamedTarget(80, Limits(shared=1024, registers=65536))
    g = torch.Generator().manual_seed(0)
    k = torch.randn(1, 1, 20, 16, generator=g)
    args = dict(
        K=k,
        P=torch.ones(1, 16),
        KMAX=torch.zeros(1),
        GKV=torch.zeros(1, 32, 16),
        GV=torch.empty_like(k))
    strides = dict(zip(('stride_kb', 'stride_kh', 'stride_kn', 'stride_kd'), k.stride()))
    strides.update(zip(('stride_gvb', 'stride_gvh', 'stride_gvn', 'stride_gvd'), k.stride()))
    from polaformer_mm.ops.pola_attention import triton_backend
    named = dict(args, **strides, H=1, n=20, d=16, rows_per_split=64)
    named.update(triton_backend.constants(16, 'ieee'))
    kept = kernels.fitting_configs(jit_fn, configs, named, target=target)
    assert kept == configs
    (decision, ) = target.decisions
    assert 'shared memory' in decision.dropped
