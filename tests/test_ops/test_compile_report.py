"""The compile report of the fused Triton kernels: real compilations for named targets,
without a GPU (Triton's compile path and its bundled ptxas)."""
import json
import os.path as osp

import pytest

from polaformer_mm.ops.pola_attention import compile_report as cr
from polaformer_mm.ops.pola_attention.triton_resources import TARGET_LIMITS
from polaformer_mm.utils.compat import triton_status
from tests._tools import load_tool

needs_triton = pytest.mark.skipif(
    not triton_status().usable,
    reason=f'{triton_status().reason} (the compile report needs Triton >= 2.1)')

# `ptxas -v` (Triton 3.7.1's bundled ptxas) on the PTX of one kernel for sm_80
PTXAS_LOG = """ptxas info    : 11 bytes gmem, 8 bytes cmem[4]
ptxas info    : Compiling entry function 'query_forward_kernel' for 'sm_80'
ptxas info    : Function properties for query_forward_kernel
    0 bytes stack frame, 200 bytes spill stores, 164 bytes spill loads
ptxas info    : Used 255 registers, used 1 barriers, 480 bytes cmem[0]
ptxas info    : Compile time = 333.220 ms
"""


def test_parse_ptxas_reads_registers_and_spills():
    assert cr.parse_ptxas(PTXAS_LOG) == (255, 200, 164)
    with pytest.raises(ValueError, match='registers'):
        cr.parse_ptxas(PTXAS_LOG.replace('Used 255 registers', 'Used some'))


def test_targets_are_named_clearly():
    assert cr.parse_target('sm_80') == 80
    assert cr.parse_target('90') == 90
    assert cr.parse_target('sm_90a') == 90
    assert cr.parse_target(86) == 86
    with pytest.raises(ValueError, match=r'no limits known for sm_61 \(known: sm_70'):
        cr.parse_target('sm_61')
    with pytest.raises(ValueError, match="bad target 'gfx90a'"):
        cr.parse_target('gfx90a')
    assert cr.ptxas_arch(90) == 'sm_90a' and cr.ptxas_arch(80) == 'sm_80'


@pytest.mark.skipif(triton_status().usable, reason='a supported Triton is installed')
def test_an_old_or_missing_triton_is_named():
    with pytest.raises(cr.CompileReportUnavailable, match='Triton'):
        cr.compile_report(targets=[80], head_dims=[32])


@pytest.fixture(scope='module')
def one_variant():
    """The first kernel's first configuration, float32 IEEE, width 32, for sm_80."""
    return cr.compile_report(
        targets=['sm_80'],
        dtypes=['float32'],
        precisions=['ieee'],
        head_dims=[32],
        kernels=[next(iter(_kernels().KERNELS))],
        configs=[0])


def _kernels():
    from polaformer_mm.ops.pola_attention import triton_kernels
    return triton_kernels


@needs_triton
def test_one_variant_compiles_and_fits(one_variant):
    assert not one_variant.failed
    (variant, ) = one_variant.variants
    (summary, ) = one_variant.summaries
    u = variant.usage
    config = _kernels().CONFIGS[variant.case.kernel][0]
    assert 0 < u.registers <= 255 and u.shared > 0 and u.threads == 32 * config.num_warps
    assert variant.config == config.kwargs and variant.num_warps == config.num_warps
    assert variant.case.precision == 'ieee' and variant.case.target == 80
    assert variant.fits and variant.candidate
    assert (summary.configs, summary.fitting, summary.errors) == (1, 1, 0)
    assert summary.spill_free == int(u.spill_stores == 0)
    row = one_variant.as_dict()['variants'][0]
    assert row['registers'] == u.registers and row['shared'] == u.shared and row['fits']
    json.dumps(one_variant.as_dict())
    assert variant.case.kernel in cr.summary_table(one_variant)
    assert cr.config_label(variant) in cr.variant_table(one_variant)


@needs_triton
def test_candidates_drop_spills_and_misfits(one_variant):
    (real, ) = one_variant.variants
    u = real.usage._replace(spill_stores=0)
    limits = TARGET_LIMITS[80]
    spilling = real._replace(config_index=1, usage=u._replace(spill_stores=16))
    too_big = real._replace(config_index=2, usage=u._replace(shared=limits.shared + 1))
    failed = real._replace(config_index=3, usage=None, error='CompilationError: x')
    variants, (summary, ) = cr.summarize([real._replace(usage=u), spilling, too_big, failed])
    assert [v.candidate for v in variants] == [True, False, False, False]
    assert 'shared memory' in variants[2].misfit and not variants[2].fits
    assert (summary.configs, summary.fitting, summary.spill_free, summary.errors) == (4, 2, 1, 1)
    # when every fitting configuration spills, the autotuner keeps those that fit
    variants, (summary, ) = cr.summarize([spilling, too_big])
    assert [v.candidate for v in variants] == [True, False]
    # nothing fits: no candidate, and the report names the case
    variants, (summary, ) = cr.summarize([too_big])
    assert summary.candidates == [] and summary.fitting == 0
    assert cr.Report(variants, [summary]).unfit_cases == [summary]


@needs_triton
def test_signatures_follow_the_jit_parameters():
    kernels = _kernels()
    for name, kernel in kernels.KERNELS.items():
        fn = cr._jit_function(kernel)
        params = kernels.compat.parameters(fn)
        constexprs = {p.name: 1 for p in params if p.is_constexpr}
        sig = cr.kernel_signature(name, 'bfloat16', constexprs)
        assert list(sig) == [p.name for p in params]
        for arg in kernels.STORAGE_ARGS[name]:
            assert sig[arg] == '*bf16', (name, arg)
        assert '*fp32' in sig.values() and 'i32' in sig.values(), (name, sig)
        assert all(sig[p] == 'i32' for p in sig if not p.isupper()), (name, sig)
        assert sig['H'] == 'i32' and sig['P'] == '*fp32', (name, sig)  # upper case, not a pointer
    with pytest.raises(ValueError, match='unknown storage dtype'):
        cr.kernel_signature(name, 'float64', constexprs)


def test_cli_refuses_an_unwritable_output_before_compiling(tmp_path):
    tool = load_tool('analysis_tools/compile_kernels.py')
    missing = tmp_path / 'no_such_folder' / 'report.md'
    # a bad target too: the output path is checked first, before anything compiles
    with pytest.raises(SystemExit, match='--out-md .*does not exist'):
        tool.main(['--out-md', str(missing), '--targets', 'sm_61'])
    with pytest.raises(SystemExit, match='--json .*is a folder'):
        tool.main(['--json', str(tmp_path), '--targets', 'sm_61'])
    assert not missing.parent.exists()
    # the same file for both outputs: one would overwrite the other
    same = str(tmp_path / 'r.txt')
    with pytest.raises(SystemExit, match=f'--json and --out-md both name {same}'):
        tool.main(['--json', same, '--out-md', same, '--targets', 'sm_61'])
    assert list(tmp_path.iterdir()) == []


@pytest.mark.skipif(not osp.isdir('/proc'), reason='no /proc (not Linux)')
def test_cli_refuses_a_folder_that_takes_no_file_before_compiling():
    """/proc takes no new file, though root passes an access check there: refused by
    creating a file where the report would go, before anything compiles (the report
    used to be lost after every compilation)."""
    tool = load_tool('analysis_tools/compile_kernels.py')
    with pytest.raises(SystemExit, match='--out-md /proc/report.md: cannot write in /proc'):
        tool.main(['--out-md', '/proc/report.md', '--targets', 'sm_61'])


@needs_triton
def test_cli_names_a_bad_target():
    tool = load_tool('analysis_tools/compile_kernels.py')
    with pytest.raises(SystemExit, match='no limits known for sm_61'):
        tool.main(['--targets', '80', 'sm_61'])


@needs_triton
@pytest.mark.slow
def test_cli_writes_tables_and_json(tmp_path, capsys):
    tool = load_tool('analysis_tools/compile_kernels.py')
    name = next(iter(_kernels().KERNELS))
    md, js = tmp_path / 'r.md', tmp_path / 'r.json'
    report, status = tool.main([
        '--targets', 'sm_80', '--dtypes', 'float16', '--precisions', 'tf32', '--head-dims', '64',
        '--kernels', name, '--jobs', '2', '--out-md',
        str(md), '--json',
        str(js), '--details'
    ])
    assert status == 0 and not report.failed
    printed = capsys.readouterr().out
    assert md.read_text() == printed
    data = json.loads(js.read_text())
    assert len(data['variants']) == len(_kernels().CONFIGS[name]) == data['summary'][0]['configs']
    assert {v['dtype'] for v in data['variants']} == {'float16'}


@needs_triton
@pytest.mark.slow
def test_every_kernel_and_configuration_compiles_for_sm80_and_sm90():
    report = cr.compile_report(
        targets=[80, 90],
        dtypes=['float32', 'bfloat16'],
        precisions=['ieee', 'tf32'],
        head_dims=[64],
        jobs=2)
    kernels = _kernels()
    assert len(report.variants) == 2 * 2 * 2 * sum(len(kernels.CONFIGS[k]) for k in kernels.KERNELS)
    assert not report.failed, cr.variant_table(report._replace(variants=report.failed))
    assert not report.unfit_cases, cr.summary_table(report._replace(summaries=report.unfit_cases))
    for summary in report.summaries:
        assert summary.candidates and all(v.fits for v in summary.candidates), summary.case
