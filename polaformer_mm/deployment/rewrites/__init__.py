"""The project's mmdeploy rewrites for the onnxruntime backend, laid out as mmdeploy lays
out its own: one module per head family (``dense_heads/rpn_head.py``,
``dense_heads/base_dense_head.py``, ``roi_heads/bbox_head.py``), the NMS they share
(``bbox_nms.py``) and adaptive pooling (``adaptive_pool.py``).

Importing them imports neither mmdeploy nor mmdet: :func:`register_mmdeploy_rewrites`
registers them with mmdeploy when the end-to-end export runs
(:func:`polaformer_mm.deployment.end2end.export_end2end`).
"""
from .adaptive_pool import adaptive_avg_pool2d__onnxruntime, adaptive_avg_pool2d_matmul
from .dense_heads import dense_predict_by_feat, rpn_predict_by_feat
from .roi_heads import bbox_predict_by_feat

__all__ = [
    'REWRITES', 'adaptive_avg_pool2d_matmul', 'bbox_predict_by_feat', 'dense_predict_by_feat',
    'register_mmdeploy_rewrites', 'rpn_predict_by_feat'
]

#: What the project rewrites for onnxruntime: (the function mmdeploy replaces, the rewrite).
REWRITES = (
    ('torch.nn.functional.adaptive_avg_pool2d', adaptive_avg_pool2d__onnxruntime),
    ('mmdet.models.dense_heads.rpn_head.RPNHead.predict_by_feat', rpn_predict_by_feat),
    ('mmdet.models.dense_heads.retina_head.RetinaHead.predict_by_feat', dense_predict_by_feat),
    ('mmdet.models.roi_heads.bbox_heads.bbox_head.BBoxHead.predict_by_feat', bbox_predict_by_feat),
)

_MMDEPLOY_REWRITES = []


def register_mmdeploy_rewrites() -> None:
    """Register the project's mmdeploy rewrites for the onnxruntime backend (once), which
    take precedence over mmdeploy's defaults there:

    * ``F.adaptive_avg_pool2d`` (other than global pooling) by
      :func:`adaptive_avg_pool2d_matmul`, exact at every size, instead of mmdeploy's
      ``avg_pool2d`` with a kernel fixed at the export size;
    * ``RPNHead.predict_by_feat`` by :func:`rpn_predict_by_feat`,
      ``RetinaHead.predict_by_feat`` by :func:`dense_predict_by_feat` and
      ``BBoxHead.predict_by_feat`` by :func:`bbox_predict_by_feat`: the proposals and
      detections mmdet computes, where mmdeploy's rewrites approximate them.

    The Pola modules need none: under an export they take their plain tensor
    formulations (:func:`polaformer_mm.utils.capture.graph_capture`).
    """
    if _MMDEPLOY_REWRITES:
        return
    from mmdeploy.core import FUNCTION_REWRITER

    for name, rewrite in REWRITES:
        FUNCTION_REWRITER.register_rewriter(func_name=name, backend='onnxruntime')(rewrite)
        _MMDEPLOY_REWRITES.append(name)
