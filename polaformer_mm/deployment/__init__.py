"""ONNX export of Pola backbones and of whole detectors / segmentors, and its checks, by
role:

* :mod:`~polaformer_mm.deployment.export` -- tensor export with torch's TorchScript
  exporter alone: ``part='backbone'``, the backbone's stage maps, or ``part='model'``, the
  tensor part of the whole model (no post-processing) (:class:`ExportableModel`,
  :func:`export_onnx`); :func:`build_model` builds and loads the model for every export;
* :mod:`~polaformer_mm.deployment.graph_passes` -- what both exports do to the written
  file (:func:`finish_graph_file`): empty trailing inputs dropped, so that onnxruntime
  folds the patch embeddings' padding into their convolutions
  (:func:`drop_omitted_inputs`), and the rewrite of
  :mod:`~polaformer_mm.deployment.blocked_mlp`: the transformer MLPs over blocks of tokens
  in a ``Scan`` (:func:`block_mlps`), the graph form of the eager ``mlp_gelu``;
* :mod:`~polaformer_mm.deployment.rewrites` -- the project's mmdeploy rewrites for
  onnxruntime, one module per head family as mmdeploy lays them out, and adaptive pooling
  exact at every size (:func:`register_mmdeploy_rewrites`);
* :mod:`~polaformer_mm.deployment.end2end` -- end-to-end export: the whole detector /
  segmentor with its post-processing through mmdeploy (:func:`export_end2end`), its deploy
  configs and inputs;
* :mod:`~polaformer_mm.deployment.checks` -- onnxruntime against PyTorch: every output of
  a tensor export (:func:`compare_onnxruntime`), the boxes or class maps of an end-to-end
  one (:func:`compare_end2end`), and timing;
* :mod:`~polaformer_mm.deployment.benchmark` -- the rows of
  ``tools/analysis_tools/benchmark_onnx.py``: one export timed in both runtimes at the
  opset it needs, or the reason it failed (:func:`benchmark_run`; a table's rows timed
  in rounds over all of them: ``benchmark.prepare_run``, ``benchmark.time_prepared``),
  as Markdown and JSON.

Every graph takes the model's *preprocessed* input: normalised by the data
preprocessor's mean / std and padded as it pads, as mmdeploy's exported graphs do.

The exports record a trace with the TorchScript exporter and set the graph-capture switch
(:func:`polaformer_mm.utils.capture.exportable`); under it the Pola modules take their
plain tensor formulations, so that every size-dependent step is in the graph and one file
serves any input size. They also enter :func:`polaformer_mm.utils.graph_forms.graph_forms`,
so that the modules with a registered graph form (the Pola attention channels first) record
it. The graphs use the operators of opset 11 (mmdeploy's default).
Those plain forms are also laid out for graph runtimes (token-wise layers on 2-D rows,
one ``Gemm`` each; the attention's products taken per sign of the features, without
concatenations or slices of its intermediates; resizes as matrix products; paddings the
runtime folds into convolutions), with the results of the eager forms up to rounding.

Importing the package imports neither mmdeploy nor mmdet / mmseg: the end-to-end export
imports mmdeploy and registers the rewrites when it runs.
"""
from .benchmark import BenchmarkRow, benchmark_run
from .blocked_mlp import block_mlps, block_mlps_file
from .checks import (BoxAgreement, Difference, MapAgreement, compare_end2end, compare_onnxruntime,
                     end2end_runners, match_boxes, median_seconds, other_shapes, run_seconds,
                     runners, time_end2end, time_runs)
from .end2end import (DEPLOY_CONFIGS, MMDEPLOY_INSTALL, MMDEPLOY_VERSION, DeployConfigError,
                      End2EndExport, deploy_config_file, end2end_task, export_end2end,
                      folder_images, load_deploy_config, mmdeploy_missing, preprocess_image,
                      random_images, sample_images)
from .export import (DEFAULT_OPSET, PARTS, ExportableModel, build_exportable, build_model,
                     check_onnx, export_onnx)
from .graph_passes import drop_omitted_inputs, finish_graph, finish_graph_file
from .rewrites import adaptive_avg_pool2d_matmul, register_mmdeploy_rewrites

__all__ = [
    'PARTS', 'DEFAULT_OPSET', 'Difference', 'ExportableModel', 'build_exportable', 'build_model',
    'check_onnx', 'compare_onnxruntime', 'export_onnx', 'median_seconds', 'other_shapes',
    'time_end2end', 'time_runs', 'runners', 'end2end_runners', 'run_seconds', 'MMDEPLOY_VERSION',
    'MMDEPLOY_INSTALL', 'DEPLOY_CONFIGS', 'BoxAgreement', 'DeployConfigError', 'End2EndExport',
    'MapAgreement', 'adaptive_avg_pool2d_matmul', 'compare_end2end', 'deploy_config_file',
    'end2end_task', 'export_end2end', 'folder_images', 'load_deploy_config', 'match_boxes',
    'mmdeploy_missing', 'preprocess_image', 'random_images', 'sample_images',
    'register_mmdeploy_rewrites', 'BenchmarkRow', 'benchmark_run', 'block_mlps', 'block_mlps_file',
    'drop_omitted_inputs', 'finish_graph', 'finish_graph_file'
]
