"""The transformer MLPs of an exported graph run over blocks of tokens: an ONNX rewrite.

The graph form of :func:`polaformer_mm.ops.mlp_gelu`. An MLP ``fc2(gelu(fc1(x)))``
exports as ``Gemm`` (or ``MatMul`` + ``Add``), the GELU nodes and another ``Gemm``, and
onnxruntime runs each node over all tokens: at detection sizes it writes the whole hidden
activation to main memory and reads it back between them (66,800 tokens x 512 channels,
137 MB, in the first stage of Pola-PVT-T at 800x1333). :func:`block_mlps` finds these
chains in an ONNX model and runs each inside a ``Scan`` over blocks of rows, so that the
hidden activation of a block stays in the CPU's caches from the first product to the
second. The nodes of the chain move into the ``Scan`` body unchanged (they read the same
weights), so every row is computed by the same operators as before; the rows are padded
to whole blocks and the padding is cut off again.

The rewrite changes the graph file only; the model and its eager forward are untouched.
:func:`~.export.export_onnx` and :func:`~.end2end.export_end2end` apply it to every graph
they write (``block_mlps=False`` leaves it out); the measurements are in
docs/user_guides/deployment.md ("Speed").
"""
from typing import Dict, List, Optional, Sequence, Tuple

from ..ops.blocked_mlp import BLOCK_ELEMENTS

__all__ = ['block_mlps', 'block_mlps_file', 'renamed_nodes', 'BLOCK_ELEMENTS']


class _Graph:
    """Producers, consumers and constants of one ONNX graph."""

    def __init__(self, graph):
        from onnx import numpy_helper
        self.graph = graph
        self.producer = {}
        self.consumers: Dict[str, List] = {}
        for node in graph.node:
            for name in node.output:
                self.producer[name] = node
            for name in node.input:
                self.consumers.setdefault(name, []).append(node)
        self.constants = {t.name: numpy_helper.to_array(t) for t in graph.initializer}
        for node in graph.node:  # in topological order
            if node.op_type == 'Constant' and node.attribute[0].name == 'value':
                self.constants[node.output[0]] = numpy_helper.to_array(node.attribute[0].t)
            elif node.op_type == 'Identity' and node.input[0] in self.constants:
                # the exporter's stand-in for an initializer equal to another one (e.g.
                # the zero biases of untrained layers)
                self.constants[node.output[0]] = self.constants[node.input[0]]
        self.outputs = {o.name for o in graph.output}

    def only_consumer(self, name: str, op_type: str):
        """The single node that reads ``name``, if it is an ``op_type`` (and ``name`` is no
        graph output); else None."""
        users = self.consumers.get(name, [])
        if len(users) != 1 or name in self.outputs or users[0].op_type != op_type:
            return None
        return users[0]

    def scalar(self, name: str) -> Optional[float]:
        value = self.constants.get(name)
        if value is None or value.size != 1:
            return None
        return float(value.reshape(()))


def _attr(node, name, default):
    from onnx import helper
    for a in node.attribute:
        if a.name == name:
            return helper.get_attribute_value(a)
    return default


def _other_input(node, name: str) -> str:
    """The input of the two-input ``node`` that is not ``name``."""
    return node.input[1] if node.input[0] == name else node.input[0]


def _linear(g: _Graph, node) -> Optional[Tuple[List, str, int, int]]:
    """``(nodes, output, in_channels, out_channels)`` of the token-wise linear layer that
    starts at ``node`` (a ``Gemm`` with a constant weight, or a ``MatMul`` by a constant
    2-d weight and its bias ``Add``), else None."""
    if node.op_type == 'Gemm':
        weight = g.constants.get(node.input[1])
        if (weight is None or weight.ndim != 2 or _attr(node, 'transA', 0)
                or _attr(node, 'alpha', 1.0) != 1.0):
            return None
        c_out, c_in = weight.shape if _attr(node, 'transB', 0) else weight.shape[::-1]
        # a bias per output channel (one per row would not split into blocks)
        bias = g.constants.get(node.input[2]) if len(node.input) > 2 and node.input[2] else 0
        if bias is None or getattr(bias, 'size', 1) not in (1, c_out):
            return None
        return [node], node.output[0], int(c_in), int(c_out)
    if node.op_type == 'MatMul':
        weight = g.constants.get(node.input[1])
        if weight is None or weight.ndim != 2:
            return None
        nodes, out = [node], node.output[0]
        add = g.only_consumer(out, 'Add')
        if add is not None:
            bias = g.constants.get(_other_input(add, out))
            if bias is not None and bias.size == weight.shape[1] == bias.shape[-1]:
                nodes, out = nodes + [add], add.output[0]
        return nodes, out, int(weight.shape[0]), int(weight.shape[1])
    return None


def _gelu(g: _Graph, name: str) -> Optional[Tuple[List, str]]:
    """``(nodes, output)`` of the exact GELU of ``name``: one ``Gelu`` node, or the form the
    TorchScript exporter writes before opset 20, ``x * (erf(x / sqrt(2)) + 1) * 0.5`` as
    ``Div``, ``Erf``, ``Add``, ``Mul``, ``Mul``; else None."""
    users = g.consumers.get(name, [])
    if name in g.outputs:
        return None
    if len(users) == 1 and users[0].op_type == 'Gelu' and \
            _attr(users[0], 'approximate', b'none') in (b'none', 'none'):
        return [users[0]], users[0].output[0]
    if len(users) != 2:
        return None
    div = next((u for u in users if u.op_type == 'Div'), None)
    mul = next((u for u in users if u.op_type == 'Mul'), None)
    if div is None or mul is None or div.input[0] != name or \
            abs((g.scalar(div.input[1]) or 0) - 2**0.5) > 1e-6:
        return None
    erf = g.only_consumer(div.output[0], 'Erf')
    add = erf and g.only_consumer(erf.output[0], 'Add')
    if add is None or g.scalar(_other_input(add, erf.output[0])) != 1.0:
        return None
    if add.output[0] not in mul.input or g.consumers.get(add.output[0]) != [mul]:
        return None
    half = g.only_consumer(mul.output[0], 'Mul')
    if half is None or g.scalar(_other_input(half, mul.output[0])) != 0.5:
        return None
    return [div, erf, add, mul, half], half.output[0]


def _find_mlps(g: _Graph) -> List[Tuple[List, str, str, int, int, int]]:
    """Every ``linear -> GELU -> linear`` chain: (nodes, input, output, in, hidden, out
    channels)."""
    found = []
    for node in g.graph.node:
        first = _linear(g, node)
        if first is None:
            continue
        nodes1, hidden_name, c_in, hidden = first
        gelu = _gelu(g, hidden_name)
        if gelu is None:
            continue
        gelu_nodes, act = gelu
        users = g.consumers.get(act, [])
        if len(users) != 1 or act in g.outputs:
            continue
        second = _linear(g, users[0]) if users[0].input[0] == act else None
        if second is None or second[2] != hidden:
            continue
        nodes2, out, _, c_out = second
        found.append((nodes1 + gelu_nodes + nodes2, node.input[0], out, c_in, hidden, c_out))
    return found


def renamed_nodes(nodes: Sequence, renamed: Dict[str, str]) -> List:
    """Copies of ``nodes`` (same operators, attributes, names and domains) whose inputs and
    outputs named in ``renamed`` take the new names: the body of a ``Scan`` that runs them."""
    from onnx import helper
    copies = []
    for node in nodes:
        copy = helper.make_node(
            node.op_type, [renamed.get(i, i) for i in node.input],
            [renamed.get(o, o) for o in node.output],
            name=node.name,
            domain=node.domain)
        copy.attribute.extend(node.attribute)
        copies.append(copy)
    return copies


def _scan_nodes(prefix: str, nodes: Sequence, x: str, y: str, c_in: int, c_out: int, elem_type: int,
                block_rows: int) -> Tuple[List, List]:
    """(nodes, initializers) computing ``y`` from ``x`` (..., c_in) by ``nodes`` over
    blocks of at most ``block_rows`` rows in a ``Scan``."""
    import numpy as np
    from onnx import helper, numpy_helper

    def n(name):
        return f'{prefix}/{name}'

    def const(name, values):
        return numpy_helper.from_array(np.asarray(values, dtype=np.int64), n(name))

    inits = [
        const('rows2d', [-1, c_in]),
        const('out2d', [-1, c_out]),
        const('c_out', [c_out]),
        const('c_in', [c_in]),
        const('block', block_rows),
        const('one', 1),
        const('zero1d', [0]),
        const('zero2', [0, 0]),
        const('minus1', [-1]),
    ]
    # the body: the chain's nodes, renamed to read the block and write its output
    inner_in, inner_out = n('block_in'), n('block_out')
    renamed = {x: inner_in, y: inner_out}
    body_nodes = renamed_nodes(nodes, renamed)
    body = helper.make_graph(body_nodes, n('body'),
                             [helper.make_tensor_value_info(inner_in, elem_type, [None, c_in])],
                             [helper.make_tensor_value_info(inner_out, elem_type, [None, c_out])])
    # blocks: iters = ceil(rows / block); each of ceil(rows / iters) rows (padding < iters)
    out = [
        helper.make_node('Shape', [x], [n('shape')]),
        helper.make_node('Reshape', [x, n('rows2d')], [n('x2d')]),
        helper.make_node('Shape', [n('x2d')], [n('shape2d')]),
        helper.make_node('Gather', [n('shape2d'), n('zero1d')], [n('rows')]),  # (1,)
        helper.make_node('Add', [n('rows'), n('block')], [n('rows_plus')]),
        helper.make_node('Sub', [n('rows_plus'), n('one')], [n('rows_plus_1')]),
        helper.make_node('Div', [n('rows_plus_1'), n('block')], [n('iters')]),
        helper.make_node('Add', [n('rows'), n('iters')], [n('rows_iters')]),
        helper.make_node('Sub', [n('rows_iters'), n('one')], [n('rows_iters_1')]),
        helper.make_node('Div', [n('rows_iters_1'), n('iters')], [n('each')]),
        helper.make_node('Mul', [n('iters'), n('each')], [n('padded')]),
        helper.make_node('Sub', [n('padded'), n('rows')], [n('pad')]),
        helper.make_node('Concat', [n('zero2'), n('pad'), n('zero1d')], [n('pads')], axis=0),
        helper.make_node('Pad', [n('x2d'), n('pads')], [n('x_padded')]),
        helper.make_node('Concat', [n('iters'), n('each'), n('c_in')], [n('shape3d')], axis=0),
        helper.make_node('Reshape', [n('x_padded'), n('shape3d')], [n('x3d')]),
        helper.make_node(
            'Scan', [n('x3d')], [n('y3d')], num_scan_inputs=1, body=body, name=n('Scan')),
        helper.make_node('Reshape', [n('y3d'), n('out2d')], [n('y_padded')]),
        helper.make_node('Slice',
                         [n('y_padded'), n('zero1d'),
                          n('rows'), n('zero1d')], [n('y2d')]),
        helper.make_node('Slice', [n('shape'), n('zero1d'),
                                   n('minus1'), n('zero1d')], [n('lead')]),
        helper.make_node('Concat', [n('lead'), n('c_out')], [n('out_shape')], axis=0),
        helper.make_node('Reshape', [n('y2d'), n('out_shape')], [y]),
    ]
    for k, node in enumerate(out):  # named in the rewrite's scope, for profiles
        node.name = node.name or n(f'{node.op_type}_{k}')
    return out, inits


def block_mlps(model, block_elements: int = BLOCK_ELEMENTS, min_hidden: int = 1) -> int:
    """Rewrite every ``linear -> GELU -> linear`` chain of the main graph of ``model``
    (an ``onnx.ModelProto``, opset 11 or later, changed in place) to run over blocks of
    ``block_elements // hidden`` rows; returns how many were rewritten.

    A chain qualifies when both layers have constant 2-d weights, the GELU is the exact
    one (``Gelu`` or its erf form), every value inside the chain is read by the chain
    alone, and its hidden width is at least ``min_hidden``.
    """
    from onnx import TensorProto
    opset = next((o.version for o in model.opset_import if o.domain in ('', 'ai.onnx')), 0)
    if opset < 11:
        return 0
    g = _Graph(model.graph)
    chains = [c for c in _find_mlps(g) if c[4] >= min_hidden]
    if not chains:
        return 0
    weights = {t.name: t.data_type for t in model.graph.initializer}
    replace = {}  # id of the chain's last node -> (new nodes); its other nodes dropped
    drop = set()
    new_inits = []
    for i, (nodes, x, y, c_in, hidden, c_out) in enumerate(chains):
        elem_type = weights.get(nodes[0].input[1], TensorProto.FLOAT)
        block_rows = max(1, block_elements // hidden)
        new_nodes, inits = _scan_nodes(f'/blocked_mlp{i}', nodes, x, y, c_in, c_out, elem_type,
                                       block_rows)
        replace[id(nodes[-1])] = new_nodes
        drop.update(id(node) for node in nodes[:-1])
        new_inits.extend(inits)
    order = []
    for node in model.graph.node:
        if id(node) in replace:
            order.extend(replace[id(node)])
        elif id(node) not in drop:
            order.append(node)
    del model.graph.node[:]
    model.graph.node.extend(order)
    model.graph.initializer.extend(new_inits)
    return len(chains)


def block_mlps_file(path: str, **kwargs) -> int:
    """:func:`block_mlps` on an .onnx file, rewritten in place when any chain was found;
    returns how many were."""
    import onnx
    model = onnx.load(path)
    count = block_mlps(model, **kwargs)
    if count:
        onnx.save(model, path)
    return count
