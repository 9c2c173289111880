"""NMS within groups (classes, levels) in a graph, as mmdet's ``batched_nms`` (mmdeploy
lays its own out in ``mmdeploy/codebase/mmdet/models/layers/bbox_nms.py``)."""
import torch
from torch import Tensor

__all__ = ['nms_within']


def nms_within(boxes: Tensor, scores: Tensor, groups: Tensor, num_groups: int, iou_threshold: float,
               score_threshold: float, keep: int):
    """mmdet's ``batched_nms`` in a graph: NMS of ``boxes`` (B, N, 4) with ``scores``
    (B, N) within each group (``groups``: (N, ) or (B, N) ids below ``num_groups``),
    scores above ``score_threshold`` only, then the ``keep`` best. Each score goes into
    its group's column of a (B, N, num_groups) score map, 0 elsewhere, for mmdeploy's
    multi-class NMS (ONNX ``NonMaxSuppression``, which keeps scores above the threshold).

    Returns:
        tuple: dets (B, keep, 5: box, score; rows past the detections zero) and their
        groups (B, keep).
    """
    from mmdeploy.mmcv.ops import multiclass_nms
    hot = groups[..., None] == torch.arange(num_groups, device=scores.device)
    return multiclass_nms(
        boxes,
        scores[..., None] * hot.to(scores.dtype),
        keep,
        iou_threshold=iou_threshold,
        score_threshold=score_threshold,
        pre_top_k=-1,
        keep_top_k=keep)
