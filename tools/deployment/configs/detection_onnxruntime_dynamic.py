# Detectors without masks (RetinaNet, Faster R-CNN, ... with a Pola backbone) end to end:
# the graph takes the preprocessed image (1, 3, H, W) of any size and returns dets (1, N, 5:
# x1, y1, x2, y2 in input pixels, score) and labels (1, N; rows past the detections are
# zero). The score threshold, the NMS IoU and the detections kept per image are the model's
# own test_cfg (score_thr, nms.iou_threshold, max_per_img); post_processing below gives the
# rest of mmdeploy's one-stage post-processing (pre_top_k candidates before NMS, at most
# max_output_boxes_per_class per class) and the values where a test_cfg has none.
_base_ = ['./_base_/onnxruntime.py']
onnx_config = dict(
    output_names=['dets', 'labels'],
    dynamic_axes=dict(
        input={
            0: 'batch',
            2: 'height',
            3: 'width'
        },
        dets={
            0: 'batch',
            1: 'num_dets'
        },
        labels={
            0: 'batch',
            1: 'num_dets'
        }))
codebase_config = dict(
    type='mmdet',
    task='ObjectDetection',
    model_type='end2end',
    post_processing=dict(
        score_threshold=0.05,
        confidence_threshold=0.005,
        iou_threshold=0.5,
        max_output_boxes_per_class=200,
        pre_top_k=5000,
        keep_top_k=100,
        background_label_id=-1))
