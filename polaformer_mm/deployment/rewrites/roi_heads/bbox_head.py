"""mmdet's ``BBoxHead`` (R-CNN) detections in a graph (mmdeploy lays its own rewrite out in
``mmdeploy/codebase/mmdet/models/roi_heads/bbox_head.py``)."""
import torch
import torch.nn.functional as F

from ..bbox_nms import nms_within

__all__ = ['bbox_predict_by_feat']


def bbox_predict_by_feat(self,
                         rois,
                         cls_scores,
                         bbox_preds,
                         batch_img_metas,
                         rcnn_test_cfg=None,
                         rescale=False):
    """mmdet's ``BBoxHead`` detections in a graph (onnxruntime): every (RoI, class)
    pair with its class's own box and score above ``score_thr``, NMS within each class,
    the ``max_per_img`` best (mmdet's ``multiclass_nms``). mmdeploy's own rewrite gives
    every class of a RoI the box of its best class. Returns (dets (B, K, 5), labels)."""
    from mmdet.structures.bbox import get_box_tensor
    if self.custom_cls_channels:
        scores = self.loss_cls.get_activation(cls_scores)
    else:
        scores = F.softmax(cls_scores, dim=-1)
    scores = scores[..., :self.num_classes]
    batch, classes = scores.shape[0], self.num_classes
    boxes = get_box_tensor(
        self.bbox_coder.decode(
            rois[..., 1:], bbox_preds, max_shape=batch_img_metas[0]['img_shape']))
    labels = torch.arange(classes, device=scores.device).expand_as(scores[0])
    if self.reg_class_agnostic:  # one box of the RoI for every class, as mmdet
        boxes = boxes[:, :, None].expand(-1, -1, classes, -1)
    boxes = boxes.reshape(batch, -1, 4)  # (B, N * C, 4): (RoI, class) pairs
    return nms_within(boxes, scores.reshape(batch, -1), labels.reshape(-1), classes,
                      rcnn_test_cfg.nms.iou_threshold, rcnn_test_cfg.score_thr,
                      rcnn_test_cfg.max_per_img)
