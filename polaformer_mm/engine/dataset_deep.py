"""The ``--deep`` part of the dataset check: every image file opened (its header only).

:func:`check_coco_images` (COCO-style mmdet datasets) and :func:`check_seg_pairs`
(mmseg datasets) read the header of every image (and segmentation map) with Pillow,
which decodes no pixel, plus the last bytes of JPEG and PNG files, and report

* zero-byte files, files that cannot be read or are not images, JPEG / PNG files cut short
  (errors: the pipeline would stop on them, or train on a partly grey image);
* images whose size differs from the ``width`` / ``height`` of the annotation file
  (error: the boxes and masks would not fit the image; EXIF rotations are taken into
  account, as OpenCV applies them);
* segmentation maps of another size than their image (error: a crash in ``torch.stack``
  a few iterations in, or labels that do not fit the pixels).

Cost: one ``open`` + header read + a seek to the end per file; measured in
``docs/advanced_guides/runner.md`` ("Dataset check").
"""
import os
import os.path as osp
from typing import List, Optional, Sequence, Tuple

from .image_check import truncation

_ROTATED = (5, 6, 7, 8)  # EXIF orientations that swap width and height


def image_header(path: str) -> Tuple[Optional[Tuple[int, int]], Optional[str]]:
    """((width, height) as OpenCV decodes the image, None) or (None, the problem)."""
    from PIL import Image, UnidentifiedImageError
    try:
        size = os.path.getsize(path)
        if size == 0:
            return None, 'empty (0 bytes)'
        with open(path, 'rb') as f:
            head = f.read(16)
            f.seek(max(0, size - 64))
            tail = f.read()
        truncated = truncation(head + tail)
        if truncated:
            return None, truncated.replace('it is ', '')
        with Image.open(path) as im:
            w, h = im.size
            try:
                orientation = im.getexif().get(0x0112)
            except Exception:  # a damaged EXIF block: OpenCV ignores it as well
                orientation = None
    except (OSError, UnidentifiedImageError, SyntaxError, ValueError) as err:
        if isinstance(err, UnidentifiedImageError):
            return None, 'not an image (Pillow cannot identify it)'
        return None, f'cannot be read ({err})'
    return ((h, w) if orientation in _ROTATED else (w, h)), None


def check_coco_images(report, img_prefix: str, images: Sequence[dict]) -> None:
    """Open the header of every image of a COCO file (entries whose file exists) and
    add the findings to ``report``."""
    broken: List[str] = []
    wrong_size: List[str] = []
    for im in images:
        name = im.get('file_name')
        if not isinstance(name, str):
            continue
        path = osp.join(img_prefix, name)
        if not osp.isfile(path):
            continue  # reported as missing already
        size, problem = image_header(path)
        if problem:
            broken.append(f'{name}: {problem}')
        elif (im.get('width'), im.get('height')) != size:
            wrong_size.append(f"{name}: {size[0]}x{size[1]}, annotated "
                              f"{im.get('width')}x{im.get('height')}")
    if broken:
        report.add('error', f'image files that cannot be used (under {img_prefix})', broken)
    if wrong_size:
        report.add(
            'error', 'images whose size (W x H) differs from the width / height of the '
            'annotation file (the boxes and masks would not fit them)', wrong_size)


def check_seg_pairs(report, img_dir: str, seg_dir: str, pairs: Sequence[Tuple[str, str]]) -> None:
    """Open the header of every image and segmentation map of ``pairs`` (image name,
    map name; both existing) and add the findings to ``report``."""
    broken: List[str] = []
    mismatched: List[str] = []
    for img_name, seg_name in pairs:
        img_size, img_problem = image_header(osp.join(img_dir, img_name))
        seg_size, seg_problem = image_header(osp.join(seg_dir, seg_name))
        if img_problem:
            broken.append(f'{img_name}: {img_problem}')
        if seg_problem:
            broken.append(f'{seg_name} (segmentation map): {seg_problem}')
        if img_size and seg_size and img_size != seg_size:
            mismatched.append(f'{seg_name}: {seg_size[0]}x{seg_size[1]}, image '
                              f'{img_size[0]}x{img_size[1]}')
    if broken:
        report.add('error', f'files that cannot be used (under {img_dir} / {seg_dir})', broken)
    if mismatched:
        report.add('error', 'segmentation maps of another size (W x H) than their image',
                   mismatched)
