"""Attention within windows, one window at a time in an exported graph: an ONNX rewrite.

A Pola-Swin block with Pola attention in windows (``linear_window_size``) calls its
:class:`~polaformer_mm.models.PolaLinearAttention` once on all windows of the map, the
windows as the batch. Exported as it is, every node of the attention (about seventy
operators at run time) runs over every window before the next node starts: at 800x1333
each intermediate of the first stage is 24 windows x 3,136 tokens x 96 channels (29 MB),
written to main memory and read back by the next node. :func:`scan_windows` moves the
attention's nodes into the body of a ``Scan`` over the batch axis, so that one window
(1.2 MB per intermediate) goes through all of them while its intermediates stay in the
CPU's caches. The windows are independent: every window is computed by the same
operators as before, on a batch of one.

Which modules: :func:`window_attention_scopes` lists those of a model whose blocks say
so (``pola_windows``); the rewrite finds their nodes by the scope names the TorchScript
exporter gives (``/…/stages.0/blocks.1/attn/MatMul_3``). A module's nodes qualify when
they give one value read outside them and read, besides constants and initializers, only
values whose first axis is the batch (the windows and their padding mask). The model and
its eager forward are untouched; :func:`~.graph_passes.finish_graph` applies the rewrite
to every graph the project's exports write.
"""
from typing import Dict, List, Optional, Sequence, Set

from torch import nn

from .blocked_mlp import renamed_nodes

__all__ = ['window_attention_scopes', 'scan_windows']


def window_attention_scopes(module: nn.Module) -> List[str]:
    """The dotted names (relative to ``module``, the module the exporter is given) of the
    attention modules that attend within windows: ``<block>.attn`` of every submodule
    whose ``pola_windows`` is True."""
    return [
        f'{name}.attn' if name else 'attn' for name, m in module.named_modules()
        if getattr(m, 'pola_windows', False) is True
    ]


def _scope(node_name: str) -> str:
    """The module scope of an exported node, dotted: ``/model/stages.0/attn/MatMul_3``
    -> ``model.stages.0.attn``."""
    return '.'.join(part for part in node_name.split('/')[:-1] if part)


def _in_scope(node_name: str, scope: str) -> bool:
    return f'.{scope}.' in f'.{_scope(node_name)}.'


def _constants(graph) -> Set[str]:
    """Initializers and the outputs of ``Constant`` nodes and of ``Identity`` nodes of
    those (the exporter's stand-ins for shared initializers)."""
    found = {t.name for t in graph.initializer}
    for node in graph.node:
        if node.op_type == 'Constant' or (node.op_type == 'Identity' and node.input[0] in found):
            found.update(node.output)
    return found


def _axes_node(op: str, value: str, out: str, opset: int, axes_name: str):
    """``Unsqueeze`` / ``Squeeze`` of axis 0, in the form of the opset (axes an attribute
    before 13, an input from 13)."""
    from onnx import helper
    if opset >= 13:
        return helper.make_node(op, [value, axes_name], [out])
    return helper.make_node(op, [value], [out], axes=[0])


def _rewrite_scope(graph, outside: List, index: int, nodes: List, constants: Set[str], ranks: Dict,
                   opset: int) -> Optional[List]:
    """The ``Scan`` that replaces ``nodes`` (one module's; ``outside``: the graph's other
    nodes) by a ``Scan`` over their batch, as a list of one node, or None when they do
    not qualify (module docstring)."""
    from onnx import helper
    made = {name for node in nodes for name in node.output}
    inputs: List[str] = []
    for node in nodes:
        for name in node.input:
            if name and name not in made and name not in constants and name not in inputs:
                inputs.append(name)
    graph_outputs = {o.name for o in graph.output}
    read_outside = {name for node in outside for name in node.input}
    outputs = sorted(name for name in made if name in graph_outputs or name in read_outside)
    if len(outputs) != 1 or not inputs or any(ranks.get(n) is None for n in inputs + outputs):
        return None
    y = outputs[0]
    if ranks[y][0] is None:
        return None
    prefix = f'/window_scan{index}'
    axes = f'{prefix}/axis0'
    renamed = {name: f'{name}{prefix}' for name in inputs + [y]}
    if any(ranks[name][0] == 0 for name in inputs):
        return None  # a scalar has no batch axis to scan over
    body_nodes, body_inputs = [], []
    for name in inputs:  # the scan gives one window without its batch axis
        rank, elem = ranks[name]
        shape = None if rank is None else [None] * (rank - 1)
        body_inputs.append(helper.make_tensor_value_info(f'{prefix}/{name}', elem, shape))
        body_nodes.append(_axes_node('Unsqueeze', f'{prefix}/{name}', renamed[name], opset, axes))
    body_nodes.extend(renamed_nodes(nodes, renamed))
    rank, elem = ranks[y]
    body_nodes.append(_axes_node('Squeeze', renamed[y], f'{prefix}/{y}', opset, axes))
    body = helper.make_graph(
        body_nodes, f'{prefix}/body', body_inputs,
        [helper.make_tensor_value_info(f'{prefix}/{y}', elem, [None] * (rank - 1))])
    return [
        helper.make_node(
            'Scan', inputs, [y], num_scan_inputs=len(inputs), body=body, name=f'{prefix}/Scan')
    ]


def _ranks(model) -> Dict[str, tuple]:
    """(rank or None, element type) of the values of the main graph whose type ONNX's
    shape inference finds; the rank of a ``Transpose`` output is that of its ``perm``
    where inference gives none (the exporter's reshapes to computed sizes leave the ranks
    after them unknown)."""
    from onnx import helper, shape_inference
    inferred = shape_inference.infer_shapes(model, data_prop=True).graph
    ranks = {}
    for info in list(inferred.value_info) + list(inferred.input) + list(inferred.output):
        tensor = info.type.tensor_type
        if tensor.elem_type:
            rank = len(tensor.shape.dim) if tensor.HasField('shape') else None
            ranks[info.name] = (rank, tensor.elem_type)
    for node in model.graph.node:
        known = ranks.get(node.output[0]) if node.output else None
        if node.op_type == 'Transpose' and known is not None and known[0] is None:
            perm = next((helper.get_attribute_value(a) for a in node.attribute if a.name == 'perm'),
                        None)
            if perm is not None:
                ranks[node.output[0]] = (len(perm), known[1])
    return ranks


def scan_windows(model, scopes: Sequence[str]) -> int:
    """Rewrite the nodes of every module of ``scopes`` (dotted names,
    :func:`window_attention_scopes`) in the main graph of ``model`` (an
    ``onnx.ModelProto``, opset 11 or later, changed in place) into a ``Scan`` over their
    batch, one window per step; returns how many were rewritten (modules whose nodes do
    not qualify are left as they are)."""
    import numpy as np
    from onnx import numpy_helper
    opset = next((o.version for o in model.opset_import if o.domain in ('', 'ai.onnx')), 0)
    if opset < 11 or not scopes:
        return 0
    graph = model.graph
    nodes = list(graph.node)  # positions identify the nodes from here on
    groups = [[i for i, n in enumerate(nodes) if _in_scope(n.name, scope)] for scope in scopes]
    groups = [group for group in groups if group]
    if not groups:
        return 0
    ranks, constants = _ranks(model), _constants(graph)
    replace: Dict[int, List] = {}  # the position of a module's last node -> the Scan
    drop: Set[int] = set()
    for index, group in enumerate(groups):
        members = set(group)
        outside = [n for i, n in enumerate(nodes) if i not in members]
        scan = _rewrite_scope(graph, outside, index, [nodes[i] for i in group], constants, ranks,
                              opset)
        if scan is None:
            continue
        # the Scan takes the place of the module's last node: every reader of its
        # output must come after that
        last, y = group[-1], scan[0].output[0]
        if any(y in n.input for i, n in enumerate(nodes) if i not in members and i < last):
            continue
        replace[last] = scan
        drop.update(group)
        if opset >= 13:
            graph.initializer.append(
                numpy_helper.from_array(
                    np.array([0], dtype=np.int64), f'/window_scan{index}/axis0'))
    if not replace:
        return 0
    order = []
    for i, node in enumerate(nodes):
        if i in replace:
            order.extend(replace[i])
        elif i not in drop:
            order.append(node)
    del graph.node[:]
    graph.node.extend(order)
    return len(replace)
