# Mask R-CNN (and other detectors with a mask head) end to end: as
# detection_onnxruntime_dynamic.py, plus masks (1, N, 28, 28): each detection's mask
# probabilities inside its box, to be pasted into the image outside the graph (as mmdeploy's
# runtime does).
_base_ = ['./detection_onnxruntime_dynamic.py']
onnx_config = dict(
    output_names=['dets', 'labels', 'masks'],
    dynamic_axes=dict(masks={
        0: 'batch',
        1: 'num_dets',
        2: 'height',
        3: 'width'
    }))
codebase_config = dict(post_processing=dict(export_postprocess_mask=False))
