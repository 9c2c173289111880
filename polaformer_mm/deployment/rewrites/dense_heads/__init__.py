"""Rewrites of mmdet's dense heads (one module per head, as mmdeploy lays them out)."""
from .base_dense_head import dense_predict_by_feat
from .rpn_head import rpn_predict_by_feat

__all__ = ['dense_predict_by_feat', 'rpn_predict_by_feat']
