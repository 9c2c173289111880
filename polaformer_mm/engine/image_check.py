"""Images that cannot be read or transformed, named.

mmcv reads images with OpenCV, whose errors name neither the file nor the reason (a
zero-byte image: ``cv2.error ... !buf.empty() in function 'imdecode_'``; an image a
``Resize`` shrinks below one pixel: ``inv_scale_x > 0 in function 'resize'``).

* :func:`image_problem` says what is wrong with an image file (empty, unreadable, not
  decodable, truncated), or None;
* :class:`NamedImagePipeline` wraps a dataset's pipeline: an image that a loading
  transform cannot read, or that OpenCV fails on in another transform, stops with an
  :class:`ImageError` naming the file, its size where known, the transform and the reason.
  :class:`~.runner.PolaRunner` wraps the pipelines of every dataset it builds
  (training, validation, testing).
"""
import os
import os.path as osp
from typing import Optional

import numpy as np


class ImageError(RuntimeError):
    """An image of the data that cannot be read or transformed (the message names it)."""


def truncation(data: bytes) -> Optional[str]:
    """Why ``data`` (the first and last bytes of a file suffice) is a JPEG or PNG cut
    short, as a phrase; None when it is not one."""
    if data[:3] == b'\xff\xd8\xff' and b'\xff\xd9' not in data[-64:]:
        return 'it is truncated (a JPEG without its end marker)'
    if data[:8] == b'\x89PNG\r\n\x1a\n' and b'IEND' not in data[-16:]:
        return 'it is truncated (a PNG without its IEND chunk)'
    return None


def image_problem(path: str, decode: bool = True) -> Optional[str]:
    """What makes the image file ``path`` unusable, as a phrase; None when it is fine.

    Args:
        path (str): a local file.
        decode (bool): decode the image (else only the size, the first bytes and the
            end markers of JPEG and PNG files are read). Default: True.
    """
    import cv2
    try:
        size = os.path.getsize(path)
    except OSError as err:
        return f'it cannot be read ({err.strerror or err})'
    if size == 0:
        return 'the file is empty (0 bytes)'
    try:
        with open(path, 'rb') as f:
            if decode:
                data = f.read()
            else:
                head = f.read(16)
                f.seek(max(0, size - 64))
                data = head + f.read()
    except OSError as err:
        return f'it cannot be read ({err.strerror or err})'
    truncated = truncation(data)
    if truncated:
        return truncated
    if decode:
        try:
            image = cv2.imdecode(np.frombuffer(data, np.uint8), cv2.IMREAD_UNCHANGED)
        except cv2.error:
            image = None
        if image is None:
            return 'it cannot be decoded as an image (not an image file, or damaged)'
    return None


def _path_of(results) -> Optional[str]:
    if isinstance(results, dict):
        for key in ('img_path', 'filename', 'img_info'):
            value = results.get(key)
            if isinstance(value, dict):
                value = value.get('filename')
            if isinstance(value, str):
                return value
    return None


def _size_of(results) -> str:
    img = results.get('img') if isinstance(results, dict) else None
    if isinstance(img, np.ndarray) and img.ndim >= 2:
        return f' ({img.shape[1]}x{img.shape[0]} pixels, W x H)'
    return ''


def _is_load(transform) -> bool:
    return type(transform).__name__.startswith('Load')


def describe_failure(transform, results, err: Exception) -> Optional[str]:
    """The message for ``err`` raised by ``transform`` on ``results``; None when the
    error is not one of an image (it is then left as it is)."""
    import cv2
    path = _path_of(results)
    name = type(transform).__name__
    if path is None or not (_is_load(transform) or isinstance(err, cv2.error)):
        return None
    detail = str(err).strip().splitlines()[-1] if str(err).strip() else type(err).__name__
    if _is_load(transform):
        seg_map = results.get('seg_map_path')
        for what, file in (('image', path), ('segmentation map', seg_map)):
            if isinstance(file, str):
                reason = image_problem(file) if osp.isfile(file) else 'the file does not exist'
                if reason is not None:
                    return f'{what} {file}: {reason} ({name}: {detail})'
        return None  # the files are fine: not a problem of an image (e.g. an annotation)
    if 'inv_scale' in detail or 'dsize' in detail or 'ssize' in detail:
        detail = f'a side would be resized below one pixel ({detail})'
    return f'image {path}{_size_of(results)}: the transform {name} failed: {detail}'


class NamedImagePipeline:
    """Runs the transforms of an mmengine ``Compose`` one by one; an image that cannot be
    read or transformed becomes an :class:`ImageError` (see the module docstring). Other
    errors pass unchanged."""

    def __init__(self, compose) -> None:
        self.compose = compose

    def __call__(self, results):
        """Apply the transforms in turn, as ``Compose`` does."""
        for transform in self.compose.transforms:
            try:
                results = transform(results)
            except Exception as err:
                message = describe_failure(transform, results, err)
                if message is None:
                    raise
                raise ImageError(message) from err
            if results is None:
                return None
        return results

    def __getattr__(self, name):
        if name.startswith('__') or name == 'compose':
            raise AttributeError(name)
        return getattr(self.compose, name)

    def __repr__(self) -> str:
        return repr(self.compose)


def name_image_errors(dataset) -> None:
    """Wrap the pipeline of ``dataset`` and of the datasets it wraps (repeat, concat,
    class-balanced ...) in :class:`NamedImagePipeline`; in place."""
    seen = []
    stack = [dataset]
    while stack:
        ds = stack.pop()
        if ds is None or any(ds is s for s in seen):
            continue
        seen.append(ds)
        pipeline = getattr(ds, 'pipeline', None)
        if pipeline is not None and hasattr(pipeline, 'transforms') and \
                not isinstance(pipeline, NamedImagePipeline):
            ds.pipeline = NamedImagePipeline(pipeline)
        stack.append(getattr(ds, 'dataset', None))
        stack.extend(getattr(ds, 'datasets', None) or [])
