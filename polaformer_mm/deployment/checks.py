"""Agreement checks and timing: an exported file run in onnxruntime (CPU) against the
PyTorch module it came from.

* the tensor and backbone exports (:mod:`polaformer_mm.deployment.export`): every output's
  largest difference at several input sizes (:func:`compare_onnxruntime`,
  :func:`other_shapes`);
* the end-to-end export (:mod:`polaformer_mm.deployment.end2end`): PyTorch's boxes matched
  one-to-one to onnxruntime's (:func:`match_boxes`, :class:`BoxAgreement`), or the class maps
  pixel by pixel (:class:`MapAgreement`), over a set of images at several sizes
  (:func:`compare_end2end`);
* the median time per image of both runtimes (:func:`time_runs`, :func:`time_end2end`);
  :func:`runners` and :func:`end2end_runners` give the two calls they time.
"""
import time
from typing import Callable, Dict, List, NamedTuple, Optional, Sequence, Tuple, Union

import numpy as np
import torch
import torch.nn as nn
from torch import Tensor

from .end2end import End2EndExport, preprocess_image
from .export import evaluating

__all__ = [
    'BoxAgreement', 'Difference', 'MapAgreement', 'compare_end2end', 'compare_onnxruntime',
    'match_boxes', 'median_seconds', 'other_shapes', 'time_end2end', 'time_runs', 'runners',
    'end2end_runners', 'run_seconds'
]


class Difference(NamedTuple):
    """One output at one input size: onnxruntime against PyTorch eager."""
    shape: Tuple[int, int]  #: (H, W) of the input
    name: str  #: output name
    out_shape: Tuple[int, ...]  #: its shape
    max_abs: float  #: max |onnxruntime - torch|
    max_rel: float  #: max_abs / max |torch| (relative to the output's peak)


def _session(path: str, threads: Optional[int] = None):
    import onnxruntime as ort
    options = ort.SessionOptions()
    options.log_severity_level = 3  # no warnings on the dynamic output shapes
    if threads:
        options.intra_op_num_threads = threads
    return ort.InferenceSession(path, options, providers=['CPUExecutionProvider'])


def compare_onnxruntime(module: nn.Module,
                        path: str,
                        shapes: Sequence[Sequence[int]],
                        in_channels: int = 3,
                        seed: int = 0) -> List[Difference]:
    """Run the file in onnxruntime (CPU) and ``module`` in PyTorch, in eval mode as the
    graph was recorded (:func:`~polaformer_mm.deployment.export.evaluating`), on the same
    random (1, in_channels, H, W) input for every (H, W) of ``shapes``; one
    :class:`Difference` per output and size."""
    session = _session(path)
    names = [o.name for o in session.get_outputs()]
    generator = torch.Generator().manual_seed(seed)
    rows = []
    for H, W in shapes:
        images = torch.randn(1, in_channels, int(H), int(W), generator=generator)
        with torch.no_grad(), evaluating(module):
            expected = module(images)
        got = session.run(None, {session.get_inputs()[0].name: images.numpy()})
        if len(got) != len(expected):
            raise RuntimeError(f'{path} returns {len(got)} outputs, PyTorch {len(expected)}')
        for name, ref, out in zip(names, expected, got):
            ref = ref.numpy()
            if ref.shape != out.shape:
                raise RuntimeError(f'{path} at input {H}x{W}: output {name} has shape '
                                   f'{out.shape}, PyTorch {ref.shape}')
            diff = float(np.abs(ref - out).max()) if ref.size else 0.
            peak = float(np.abs(ref).max()) if ref.size else 0.
            rows.append(
                Difference((int(H), int(W)), name, tuple(ref.shape), diff,
                           diff / peak if peak > 0 else diff))
    return rows


def other_shapes(shape: Sequence[int]) -> List[Tuple[int, int]]:
    """Two further input sizes for an (H, W) export: one smaller in height and larger
    in width, one the other way round, neither a multiple of 32 (the graph must handle
    padding and odd grids)."""
    H, W = (int(s) for s in shape)
    return [(max(H * 3 // 4, 1) + 5, W * 5 // 4 + 3), (H * 5 // 4 + 7, max(W * 3 // 4, 1) + 1)]


def run_seconds(run: Callable[[], object], repeats: int = 10, warmup: int = 2) -> List[float]:
    """Wall-clock seconds of ``repeats`` calls of ``run()`` after ``warmup`` untimed
    ones."""
    for _ in range(warmup):
        run()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        run()
        times.append(time.perf_counter() - start)
    return times


def median_seconds(run: Callable[[], object], repeats: int = 10, warmup: int = 2) -> float:
    """Median wall-clock seconds of ``repeats`` calls of ``run()`` after ``warmup``
    untimed ones."""
    return float(np.median(run_seconds(run, repeats, warmup)))


def _medians(runs: Tuple[Callable, Callable], repeats: int, warmup: int) -> Dict[str, float]:
    """Medians of the two calls (PyTorch, onnxruntime), one after the other."""
    eager, session_run = runs
    return {
        'torch': median_seconds(eager, repeats, warmup),
        'onnxruntime': median_seconds(session_run, repeats, warmup)
    }


def runners(module: nn.Module,
            path: str,
            shape: Sequence[int],
            in_channels: int = 3,
            threads: Optional[int] = None) -> Tuple[Callable[[], object], Callable[[], object]]:
    """The two calls :func:`time_runs` times: one (1, in_channels, H, W) forward of
    ``module`` in PyTorch eager (no gradients) and one run of the file in a new
    onnxruntime (CPU) session with ``threads`` intra-op threads (None: its default), on
    the same random input."""
    session = _session(path, threads)
    images = torch.randn(1, in_channels, *(int(s) for s in shape))
    feed = {session.get_inputs()[0].name: images.numpy()}

    def eager():
        with torch.no_grad():
            return module(images)

    return eager, lambda: session.run(None, feed)


def time_runs(module: nn.Module,
              path: str,
              shape: Sequence[int],
              repeats: int = 10,
              warmup: int = 2,
              in_channels: int = 3,
              threads: Optional[int] = None) -> Dict[str, float]:
    """Median seconds per (1, in_channels, H, W) forward of ``module`` in PyTorch eager
    (no gradients) and of the file in onnxruntime (CPU), on this machine with torch's
    thread count and ``threads`` intra-op threads of onnxruntime (None: its default)."""
    return _medians(runners(module, path, shape, in_channels, threads), repeats, warmup)


class BoxAgreement(NamedTuple):
    """Detections of onnxruntime against PyTorch eager over a set of images at one size.

    PyTorch's boxes are matched one-to-one to onnxruntime's, greedily, same-label pairs
    first and then by IoU."""
    image: Tuple[int, int]  #: (H, W) the images were resized to
    shape: Tuple[int, int]  #: (H, W) of the graph input (the preprocessed image)
    images: int  #: images compared
    torch_boxes: int  #: detections of PyTorch, all images
    onnx_boxes: int  #: detections of onnxruntime, all images
    matched: float  #: pairs with IoU >= the threshold / max(torch_boxes, onnx_boxes)
    iou_min: float  #: smallest IoU of a PyTorch box with its match (0 if unmatched)
    iou_median: float  #: median of the same
    label_agreement: float  #: matched pairs (IoU >= threshold) with the same label
    box_max_abs: float  #: max |box corner difference| (pixels) over matched pairs
    score_max_abs: float  #: max |score difference| over matched pairs


class MapAgreement(NamedTuple):
    """Class maps of onnxruntime against PyTorch eager over a set of images at one size."""
    image: Tuple[int, int]  #: (H, W) the images were resized to
    shape: Tuple[int, int]  #: (H, W) of the graph input (the preprocessed image)
    images: int  #: images compared
    pixels: int  #: pixels compared, all images
    agreement: float  #: fraction of pixels with the same class


def match_boxes(ref_boxes: Tensor, ref_labels: Tensor, boxes: Tensor,
                labels: Tensor) -> Tuple[Tensor, Tensor]:
    """One-to-one matching of ``ref_boxes`` (N, 4) to ``boxes`` (M, 4): greedily, the
    pair with the same label and the highest IoU first, then pairs of different labels.

    Returns:
        tuple: for every reference box the index of its match (-1: none) and the IoU
        with it (0 for none).
    """
    from mmdet.structures.bbox import bbox_overlaps
    n, m = len(ref_boxes), len(boxes)
    index = torch.full((n, ), -1, dtype=torch.long)
    ious = torch.zeros(n)
    if n == 0 or m == 0:
        return index, ious
    overlaps = bbox_overlaps(ref_boxes.float(), boxes.float())
    same = (ref_labels[:, None] == labels[None, :]).float()
    order = torch.argsort((overlaps + 2 * same * (overlaps > 0)).flatten(), descending=True)
    used_ref, used = torch.zeros(n, dtype=torch.bool), torch.zeros(m, dtype=torch.bool)
    for flat in order.tolist():
        i, j = divmod(flat, m)
        if used_ref[i] or used[j] or overlaps[i, j] <= 0:
            continue
        used_ref[i] = used[j] = True
        index[i], ious[i] = j, overlaps[i, j]
    return index, ious


def _session_outputs(session, inputs: Tensor, names: Sequence[str]) -> List[Tensor]:
    """The graph's outputs of these ``names`` (in this order) for ``inputs``."""
    outputs = session.run(list(names), {session.get_inputs()[0].name: inputs.numpy()})
    return [torch.from_numpy(o) for o in outputs]


def compare_end2end(export: End2EndExport,
                    images: Sequence[np.ndarray],
                    shapes: Sequence[Sequence[int]],
                    iou_threshold: float = 0.99) -> List[Union[BoxAgreement, MapAgreement]]:
    """Run the exported file in onnxruntime (CPU) and the model in PyTorch eager
    (``model.predict``, mmdet's / mmseg's own inference, boxes not rescaled) on every
    image resized to every (H, W) of ``shapes``; one agreement row per size."""
    session = _session(export.path)
    model = export.model
    rows = []
    for shape in shapes:
        shape = tuple(int(s) for s in shape)
        if export.task == 'segmentation':
            same = total = 0
            for image in images:
                inputs, sample = preprocess_image(model, image, shape)
                with torch.no_grad():
                    ref = model.predict(inputs, [sample])[0].pred_sem_seg.data[0]
                got = _session_outputs(session, inputs, export.output_names[:1])[0]
                if got.dim() == 4 and got.shape[1] > 1:  # logits (with_argmax=False)
                    got = got.argmax(1)
                got = got.reshape(got.shape[-2:])
                if got.shape != ref.shape:
                    raise RuntimeError(f'{export.path}: class map {tuple(got.shape)}, PyTorch '
                                       f'{tuple(ref.shape)} at input {tuple(inputs.shape)}')
                same += int((got == ref).sum())
                total += ref.numel()
            rows.append(
                MapAgreement(
                    tuple(shape), tuple(inputs.shape[2:]), len(images), total,
                    same / max(total, 1)))
            continue
        per_box, n_ref, n_got, n_matched, n_same, box_diff, score_diff = [], 0, 0, 0, 0, 0., 0.
        for image in images:
            inputs, sample = preprocess_image(model, image, shape)
            with torch.no_grad():
                ref = model.predict(inputs, [sample], rescale=False)[0].pred_instances
            dets, labels = (
                o[0] for o in _session_outputs(session, inputs, export.output_names[:2]))
            keep = dets[:, 4] > 0  # rows past the detections are zero
            dets, labels = dets[keep], labels[keep]
            index, ious = match_boxes(ref.bboxes, ref.labels, dets[:, :4], labels)
            good = ious >= iou_threshold
            per_box.append(ious)
            n_ref, n_got, n_matched = n_ref + len(ref.bboxes), n_got + len(dets), n_matched + int(
                good.sum())
            if good.any():
                pairs = index[good]
                n_same += int((ref.labels[good] == labels[pairs]).sum())
                box_diff = max(box_diff, float((ref.bboxes[good] - dets[pairs, :4]).abs().max()))
                score_diff = max(score_diff, float((ref.scores[good] - dets[pairs, 4]).abs().max()))
        ious = torch.cat(per_box)
        rows.append(
            BoxAgreement(
                tuple(shape), tuple(inputs.shape[2:]), len(images), n_ref, n_got,
                n_matched / max(n_ref, n_got) if max(n_ref, n_got) else 1.,
                float(ious.min()) if len(ious) else 1.,
                float(ious.median()) if len(ious) else 1., n_same / n_matched if n_matched else 1.,
                box_diff, score_diff))
    return rows


def end2end_runners(
        export: End2EndExport,
        image: np.ndarray,
        shape: Sequence[int],
        threads: Optional[int] = None) -> Tuple[Callable[[], object], Callable[[], object]]:
    """The two calls :func:`time_end2end` times: PyTorch eager ``model.predict`` (no
    gradients; for Mask R-CNN the masks pasted into the input) and one run of the
    end-to-end file in a new onnxruntime (CPU) session (masks M x M per detection), on
    ``image`` resized to ``shape`` and preprocessed (once, here); ``threads`` as
    :func:`runners`."""
    session = _session(export.path, threads)
    inputs, sample = preprocess_image(export.model, image, shape)
    feed = {session.get_inputs()[0].name: inputs.numpy()}
    kwargs = {} if export.task == 'segmentation' else {'rescale': False}

    def eager():
        with torch.no_grad():
            return export.model.predict(inputs, [sample], **kwargs)

    return eager, lambda: session.run(None, feed)


def time_end2end(export: End2EndExport,
                 image: np.ndarray,
                 shape: Sequence[int],
                 repeats: int = 10,
                 warmup: int = 2,
                 threads: Optional[int] = None) -> Dict[str, float]:
    """Median seconds per image of the whole model, PyTorch eager and onnxruntime (the
    calls of :func:`end2end_runners`; preprocessing not timed)."""
    return _medians(end2end_runners(export, image, shape, threads), repeats, warmup)
