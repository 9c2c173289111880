"""tools/analysis_tools/profile_onnx.py and polaformer_mm.deployment.profile: a real
onnxruntime trace is read node by node (the fastest run after the warm-up, Scan nodes
left out for their bodies' nodes), nodes are put in their stage and kind by their scope
names, and a pair of configs is profiled, reported and compared end to end."""
import json

import pytest

from polaformer_mm.deployment import profile
from tests import REPO
from .._tools import load_tool

cli = load_tool('analysis_tools/profile_onnx.py', '_profile_onnx')

POLA = f'{REPO}/configs/pola_pvt/fpn_pola-pvt-t_8xb2-40k_ade20k-512x512.py'
BASE = f'{REPO}/configs/pola_pvt/fpn_pvt-t_8xb2-40k_ade20k-512x512.py'
MATMUL = '/model/layers.0/blocks.0/attn/MatMul'
LOG = '/model/layers.0/blocks.0/attn/Log'
BODY_MUL = '/model/layers.1/blocks.0/mlp/fc1/Mul'


def test_fastest_run_after_the_warmup():
    # 3 runs + warm-up, 2 events a run (a node in a Scan body runs twice a run)
    durations = [100, 100, 5, 6, 3, 4, 9, 1]
    assert profile.group_fastest(durations, 3) == 7  # not the warm-up's 200, not 10 or 11
    assert profile.group_fastest([50, 8, 2], 2) == 2
    with pytest.raises(ValueError, match='do not split'):
        profile.group_fastest([1, 2, 3], 3)


@pytest.mark.parametrize(
    'name, part',
    [
        ('/model/layers.0/blocks.1/attn/MatMul_3', ('0', 'attention')),
        ('/model/stages.2/blocks.0/ffn/layers.0/Gemm', ('2', 'mlp')),
        ('/model/layers.0.1.1/attn/sr/Conv_output_0_nchwc', ('0', 'attention')),
        ('/model/layers.3/blocks.0/attn/MatMul/MatmulTransposeFusion/', ('3', 'attention')),
        ('/model/layers.1/blocks.0/mlp/fc1/Gemm', ('1', 'mlp')),
        ('/model/layers.2/blocks.1/norm1/Mul/LayerNormFusion/', ('2', 'norm')),
        ('/model/layers.2/patch_embed/proj/Conv', ('2', 'other')),
        ('/model/Concat_1', ('-', 'other')),
        ('/blocked_mlp4/Pad_13', ('1', 'mlp')),  # a blocked MLP's own node: the stage before it
        ('Gelu_token_9', ('1', 'norm')),  # no scope (made by onnxruntime): the part before it
    ])
def test_parts_come_from_the_scope_names(name, part):
    assert profile.node_part(name, before=('1', 'norm')) == part


def _event(name, op, dur):
    """A kernel event of onnxruntime's trace."""
    return dict(cat='Node', name=f'{name}_kernel_time', dur=dur, args=dict(op_name=op))


def test_unscoped_nodes_take_the_part_before_them_within_each_run():
    fc1 = '/model/layers.{}/blocks.0/mlp/fc1/Gemm'
    run = [
        _event('ReorderInput', 'ReorderInput', 1),  # first of a run: no node before it
        _event(fc1.format(0), 'Gemm', 10),
        _event('Gelu', 'Gelu', 2),  # two fused nodes of the same name, in two stages
        _event(fc1.format(1), 'Gemm', 20),
        _event('Gelu', 'Gelu', 3),
        dict(cat='Session', name='model_run', dur=40),
    ]
    warmup = [dict(e, dur=e['dur'] * 10) for e in run]
    nodes = profile.node_times(warmup + run + run, runs=2)
    assert [(n.name, n.stage, n.kind, n.ms)
            for n in nodes] == [('ReorderInput', '-', 'other', 0.001),
                                (fc1.format(0), '0', 'mlp', 0.01), ('Gelu', '0', 'mlp', 0.002),
                                (fc1.format(1), '1', 'mlp', 0.02), ('Gelu', '1', 'mlp', 0.003)]


def _scan_model():
    """MatMul -> Log -> Scan over the 4 rows, whose body squares its row (Mul)."""
    from onnx import TensorProto, helper
    F = TensorProto.FLOAT
    body = helper.make_graph([helper.make_node('Mul', ['xi', 'xi'], ['yi'], name=BODY_MUL)], 'body',
                             [helper.make_tensor_value_info('xi', F, [4])],
                             [helper.make_tensor_value_info('yi', F, [4])])
    nodes = [
        helper.make_node('MatMul', ['x', 'x'], ['m'], name=MATMUL),
        helper.make_node('Log', ['m'], ['l'], name=LOG),
        helper.make_node(
            'Scan', ['l'], ['y'], name='/blocked_mlp0/Scan', body=body, num_scan_inputs=1),
    ]
    graph = helper.make_graph(nodes, 'g', [helper.make_tensor_value_info('x', F, [4, 4])],
                              [helper.make_tensor_value_info('y', F, [4, 4])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid('', 13)])
    model.ir_version = 7
    return model


def _node_events(trace):
    """name -> (op, durations in ms) of the kernel events of a trace."""
    events = {}
    for e in trace:
        if e.get('cat') == 'Node' and e['name'].endswith('_kernel_time'):
            op, durs = events.setdefault(e['name'][:-len('_kernel_time')],
                                         (e['args']['op_name'], []))
            durs.append(e['dur'] / 1e3)
    return events


def test_real_trace_sums_nodes_without_the_scan(tmp_path):
    import onnx
    path = str(tmp_path / 'tiny.onnx')
    onnx.save(_scan_model(), path)
    runs = 3
    wall, nodes = profile.profile_session(path, (4, 4), runs, 1, str(tmp_path))
    traces = list(tmp_path.glob('tiny_profile*.json'))
    assert len(traces) == 1 and wall > 0
    events = _node_events(profile.load_trace(str(traces[0])))
    assert events['/blocked_mlp0/Scan'][0] == 'Scan'
    assert len(events[BODY_MUL][1]) == 4 * (runs + 1)  # 4 rows a run, warm-up included
    by_name = {n.name: n for n in nodes}
    assert set(by_name) == {MATMUL, LOG, BODY_MUL}  # the Scan is left out
    for name, (op, durs) in events.items():
        if op == 'Scan':
            continue
        size = len(durs) // (runs + 1)
        runs_ms = [sum(durs[i * size:(i + 1) * size]) for i in range(1, runs + 1)]
        assert by_name[name].ms == pytest.approx(min(runs_ms)) and by_name[name].op == op
    assert [(n.stage, n.kind) for n in nodes] == [('0', 'attention'), ('0', 'attention'),
                                                  ('1', 'mlp')]
    summary = profile.summarize(nodes)
    assert summary['total'] == pytest.approx(sum(n.ms for n in nodes))
    assert summary['attention_products'] == pytest.approx(by_name[MATMUL].ms)
    assert summary['attention_elementwise'] == pytest.approx(by_name[LOG].ms)
    assert summary['parts']['1']['mlp'] == pytest.approx(by_name[BODY_MUL].ms)
    assert {op for op, _, count in summary['ops']} == {'MatMul', 'Log', 'Mul'}


def _profile(config, ms_by_op_kind):
    """A Profile of nodes (op, kind, ms) in stage 0."""
    nodes = tuple(
        profile.NodeTime(f'/n{i}', op, ms, '0', kind)
        for i, (op, kind, ms) in enumerate(ms_by_op_kind))
    return profile.Profile(config, 'backbone', 'what', 8, 8, 11, 1.0, nodes)


def test_pairs_compare_sums_and_the_first_with_free_elementwise():
    a = _profile('pola.py', [('MatMul', 'attention', 4.0), ('Exp', 'attention', 3.0),
                             ('Gemm', 'mlp', 3.0)])
    b = _profile('base.py', [('MatMul', 'attention', 2.0), ('Gemm', 'mlp', 3.0)])
    line, = profile.compare_pairs([a, b])
    assert line == ("pola.py / base.py: 10.0 / 5.0 ms = 2.00x; the first with its attention's "
                    'elementwise and layout nodes free: 7.0 ms = 1.40x')
    assert profile.compare_pairs([a, b, a]) == []
    report = profile.format_markdown([a, b], top=1)
    assert '| MatMul | 4.00 | 40.0% | 1 |' in report and '| Exp |' not in report
    assert '| 0 | 7.00 | 3.00 | 0.00 | 0.00 | 10.00 |' in report
    assert 'attention: products 4.00 ms, elementwise and layout 3.00 ms' in report


@pytest.mark.parametrize('args, message', [
    (['a.py', '64'], 'CONFIG H W triples'),
    (['a.py', '64', 'x'], 'no integer H W'),
    (['a.py', '64', '64', '--runs', '0'], '--runs and --top'),
    (['a.py', '64', '64', '--parts', 'end2end'], 'invalid choice'),
    (['a.py', '64', '64', '--out-md', 'p.txt', '--out-json', 'p.txt'
      ], '--out-md and --out-json both name p.txt: one output would overwrite the other'),
    (['a.py', '64', '64', '--out-json', 'w', '--work-dir', 'w'
      ], '--out-json and --work-dir both name w'),
])
def test_bad_arguments_are_named(args, message, capsys):
    with pytest.raises(SystemExit):
        cli.parse_args(args)
    assert message in capsys.readouterr().err


@pytest.mark.slow
def test_pair_is_profiled_reported_and_compared(tmp_path, capsys):
    md, js = tmp_path / 'p.md', tmp_path / 'p.json'
    profiles = cli.main([
        POLA, '64', '64', BASE, '64', '64', '--runs', '1', '--threads', '1', '--top', '5',
        '--work-dir',
        str(tmp_path / 'work'), '--out-md',
        str(md), '--out-json',
        str(js)
    ])
    assert [p.error for p in profiles] == [None, None]
    assert [p.opset for p in profiles] == [11, 13]  # mmdet's PVT needs 13, as benchmark_onnx
    out = capsys.readouterr().out
    assert 'load average' in out and out.count('| op type | ms | share | nodes |') == 2
    assert 'the first with its attention\'s elementwise and layout nodes free' in out
    for p in profiles:
        summary = profile.summarize(p.nodes)
        assert all(n.op != 'Scan' for n in p.nodes)
        assert set(summary['parts']) >= {'0', '1', '2', '3'}
        assert summary['attention_products'] > 0 and summary['attention_elementwise'] > 0
        assert all(summary['parts'][s]['mlp'] > 0 for s in '0123')
    pola_ops = {n.op for n in profiles[0].nodes}
    assert 'Gemm' in pola_ops  # the blocked MLPs' products, counted from their Scan bodies
    helpers = [n for n in profiles[0].nodes if n.name.startswith('/blocked_mlp')]
    assert helpers and all(n.kind == 'mlp' and n.stage != '-' for n in helpers)
    assert md.read_text().startswith('command: python tools/analysis_tools/profile_onnx.py')
    data = json.loads(js.read_text())
    assert len(data['profiles']) == 2 and len(data['pairs']) == 1
    assert data['profiles'][0]['summary']['total'] == pytest.approx(
        sum(n['ms'] for n in data['profiles'][0]['nodes']))
