"""mmdet's ``RPNHead`` proposals in a graph (mmdeploy lays its own rewrite out in
``mmdeploy/codebase/mmdet/models/dense_heads/rpn_head.py``)."""
import torch

from ..bbox_nms import nms_within
from .base_dense_head import drop_small, gather_rows, level_maps

__all__ = ['rpn_predict_by_feat']


def rpn_predict_by_feat(self,
                        cls_scores,
                        bbox_preds,
                        score_factors=None,
                        batch_img_metas=None,
                        cfg=None,
                        rescale=False,
                        with_nms=True):
    """mmdet's ``RPNHead`` proposals in a graph (onnxruntime): per level the ``nms_pre``
    best anchors, decoded and clipped to the input, boxes not wider / higher than
    ``min_bbox_size`` dropped, NMS within each level (mmdet's ``batched_nms`` over level
    ids), then the ``max_per_img`` best. Returns (dets (B, K, 5), level ids), as
    mmdeploy's own rewrite, which instead suppresses across levels and drops proposals
    scoring 0.05 or less."""
    cfg = self.test_cfg if cfg is None else cfg
    priors = self.prior_generator.grid_priors([c.shape[-2:] for c in cls_scores],
                                              device=cls_scores[0].device)
    nms_pre = cfg.get('nms_pre', -1)
    boxes, scores, levels = [], [], []
    for level, (cls_score, bbox_pred, prior) in enumerate(zip(cls_scores, bbox_preds, priors)):
        score, delta = level_maps(self, cls_score, bbox_pred)
        score = score[..., 0]  # the object score (sigmoid, or softmax's foreground)
        prior = prior[None].expand(score.shape[0], -1, -1)
        if nms_pre > 0:
            score, index = score.topk(nms_pre, dim=1)  # mmdeploy's rewrite: k <= the size
            delta, prior = gather_rows(delta, index), gather_rows(prior, index)
        boxes.append(
            self.bbox_coder.decode(prior, delta, max_shape=batch_img_metas[0]['img_shape']))
        scores.append(score)
        levels.append(torch.full_like(score[0], level, dtype=torch.long))
    boxes, scores = torch.cat(boxes, 1), torch.cat(scores, 1)
    # every proposal scores > 0 (mmdet keeps all): the threshold 0 only drops the zeros
    return nms_within(boxes, drop_small(boxes, scores, cfg), torch.cat(levels), len(cls_scores),
                      cfg.nms.iou_threshold, 0., cfg.max_per_img)
