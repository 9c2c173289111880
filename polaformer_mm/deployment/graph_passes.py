"""What an exported graph goes through after the exporter, before it is written for good.

:func:`finish_graph_file` is called by :func:`~.export.export_onnx` and
:func:`~.end2end.export_end2end` on every file they write; it loads the graph once and
applies, in turn:

* :func:`drop_omitted_inputs`: the optional inputs the exporter writes as empty names at
  the end of a node's inputs are left out (ONNX reads a missing trailing input as an
  omitted one: the same graph). onnxruntime folds a constant ``Pad`` into the ``Conv``
  that reads it only when the ``Pad`` has no such empty input: the patch embeddings'
  padding (:func:`polaformer_mm.models.utils.pad_for_patches`) then costs no copy of the
  image or of the stage map;
* :func:`~.blocked_mlp.block_mlps` (unless ``block_mlps=False``): the transformer MLPs over
  blocks of tokens;
* :func:`~.window_scan.scan_windows` (for the modules of ``window_scopes``): attention
  within windows one window at a time.

The model and its eager forward are untouched.
"""
from typing import Dict, Sequence

from .blocked_mlp import block_mlps as _block_mlps
from .window_scan import scan_windows

__all__ = ['drop_omitted_inputs', 'finish_graph', 'finish_graph_file']


def drop_omitted_inputs(model) -> int:
    """Drop the empty trailing input names of every node of the main graph of ``model``
    (an ``onnx.ModelProto``, changed in place); returns how many nodes changed."""
    changed = 0
    for node in model.graph.node:
        if node.input and not node.input[-1]:
            while node.input and not node.input[-1]:
                node.input.pop()
            changed += 1
    return changed


def finish_graph(model,
                 block_mlps: bool = True,
                 window_scopes: Sequence[str] = ()) -> Dict[str, int]:
    """Apply the passes of the module docstring to ``model`` in place; returns how many
    nodes or modules each one changed (``'omitted_inputs'``, ``'blocked_mlps'``,
    ``'scanned_windows'``). ``window_scopes``: the dotted names of the modules that
    attend within windows (:func:`~.window_scan.window_attention_scopes` of the exported
    module)."""
    counts = {'omitted_inputs': drop_omitted_inputs(model), 'blocked_mlps': 0}
    if block_mlps:
        counts['blocked_mlps'] = _block_mlps(model)
    counts['scanned_windows'] = scan_windows(model, window_scopes)
    return counts


def finish_graph_file(path: str,
                      block_mlps: bool = True,
                      window_scopes: Sequence[str] = ()) -> Dict[str, int]:
    """:func:`finish_graph` on an .onnx file, written again when anything changed."""
    import onnx
    model = onnx.load(path)
    counts = finish_graph(model, block_mlps=block_mlps, window_scopes=window_scopes)
    if any(counts.values()):
        onnx.save(model, path)
    return counts
