# mmdeploy (1.3.1) settings shared by the project's deploy configs: ONNX at opset 11 (every
# operator of the Pola backbones and of mmdeploy's onnxruntime post-processing is in it),
# run by onnxruntime with its standard operators only (NonMaxSuppression, RoiAlign, TopK:
# no custom-op library is needed). Used by tools/deployment/deploy.py and
# tools/deployment/pytorch2onnx.py (see docs/user_guides/deployment.md).
onnx_config = dict(
    type='onnx',
    export_params=True,
    keep_initializers_as_inputs=False,
    opset_version=11,
    save_file='end2end.onnx',
    input_names=['input'],
    output_names=['output'],
    input_shape=None)
backend_config = dict(type='onnxruntime')
