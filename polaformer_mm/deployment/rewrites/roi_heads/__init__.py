"""Rewrites of mmdet's RoI heads (one module per head, as mmdeploy lays them out)."""
from .bbox_head import bbox_predict_by_feat

__all__ = ['bbox_predict_by_feat']
