# Segmentors (Semantic FPN, UperNet, ... with a Pola backbone) end to end: the graph takes the
# preprocessed image (1, 3, H, W) of any size and returns the class map (1, 1, H, W) of int64
# (the argmax of the logits resized to the input, mode 'whole').
_base_ = ['./_base_/onnxruntime.py']
onnx_config = dict(
    output_names=['output'],
    dynamic_axes=dict(
        input={
            0: 'batch',
            2: 'height',
            3: 'width'
        }, output={
            0: 'batch',
            2: 'height',
            3: 'width'
        }))
codebase_config = dict(type='mmseg', task='Segmentation', with_argmax=True)
