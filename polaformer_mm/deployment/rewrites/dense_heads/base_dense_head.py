"""mmdet's one-stage detections (``BaseDenseHead.predict_by_feat``) in a graph, and the
per-level steps the dense heads share (mmdeploy lays its own rewrite out in
``mmdeploy/codebase/mmdet/models/dense_heads/base_dense_head.py``)."""
import torch
from torch import Tensor

from ..bbox_nms import nms_within

__all__ = ['dense_predict_by_feat', 'drop_small', 'gather_rows', 'level_maps']


def gather_rows(x: Tensor, index: Tensor) -> Tensor:
    """``x`` (B, N, D) at the rows ``index`` (B, K) -> (B, K, D)."""
    return torch.gather(x, 1, index[..., None].expand(-1, -1, x.shape[-1]))


def drop_small(boxes: Tensor, scores: Tensor, cfg) -> Tensor:
    """Scores of boxes not wider and higher than ``cfg.min_bbox_size`` set to 0 (mmdet
    drops them; a negative or missing size keeps all)."""
    min_size = cfg.get('min_bbox_size', -1)
    if min_size < 0:
        return scores
    wide = (boxes[..., 2] - boxes[..., 0] > min_size) & (boxes[..., 3] - boxes[..., 1] > min_size)
    return scores * wide.to(scores.dtype)


def level_maps(head, cls_score: Tensor, bbox_pred: Tensor):
    """One level's head maps -> scores (B, A, C) and box deltas (B, A, 4), per anchor."""
    batch = cls_score.shape[0]
    score = cls_score.permute(0, 2, 3, 1).reshape(batch, -1, head.cls_out_channels)
    score = score.sigmoid() if head.use_sigmoid_cls else score.softmax(-1)[..., :-1]
    delta = bbox_pred.permute(0, 2, 3, 1).reshape(batch, -1, head.bbox_coder.encode_size)
    return score, delta


def dense_predict_by_feat(self,
                          cls_scores,
                          bbox_preds,
                          score_factors=None,
                          batch_img_metas=None,
                          cfg=None,
                          rescale=False,
                          with_nms=True):
    """mmdet's one-stage detections (``BaseDenseHead.predict_by_feat`` of a head without
    score factors, e.g. ``RetinaHead``) in a graph (onnxruntime): per level the
    ``nms_pre`` best (anchor, class) pairs scoring above ``score_thr``, decoded and
    clipped to the input, NMS within each class, the ``max_per_img`` best. mmdeploy's own
    rewrite takes the ``nms_pre`` best anchors by their best class instead. Returns
    (dets (B, K, 5), labels)."""
    if score_factors is not None and score_factors[0] is not None:
        raise NotImplementedError(f'{type(self).__name__}: heads with score factors '
                                  '(centerness) have no end-to-end rewrite here')
    cfg = self.test_cfg if cfg is None else cfg
    priors = self.prior_generator.grid_priors([c.shape[-2:] for c in cls_scores],
                                              device=cls_scores[0].device)
    nms_pre, score_thr = cfg.get('nms_pre', -1), cfg.get('score_thr', 0)
    boxes, scores, labels = [], [], []
    for cls_score, bbox_pred, prior in zip(cls_scores, bbox_preds, priors):
        score, delta = level_maps(self, cls_score, bbox_pred)
        classes = score.shape[-1]
        score = torch.where(score > score_thr, score, score.new_zeros(())).flatten(1)
        if nms_pre > 0:
            score, index = score.topk(nms_pre, dim=1)  # mmdeploy's rewrite: k <= the size
        else:
            index = torch.arange(score.shape[1], device=score.device).expand_as(score)
        anchor = index // classes  # non-negative: ONNX Div truncation is floor here
        prior = prior[anchor]  # (B, K, 4)
        boxes.append(
            self.bbox_coder.decode(
                prior, gather_rows(delta, anchor), max_shape=batch_img_metas[0]['img_shape']))
        scores.append(score)
        labels.append(index - anchor * classes)
    boxes, scores = torch.cat(boxes, 1), torch.cat(scores, 1)
    return nms_within(boxes, drop_small(boxes, scores, cfg), torch.cat(labels, 1), self.num_classes,
                      cfg.nms.iou_threshold, score_thr, cfg.max_per_img)
