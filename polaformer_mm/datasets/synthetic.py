"""A small deterministic synthetic dataset: textured images with circles, squares, triangles.

:func:`generate_synthetic_dataset` writes, under ``root``::

    images/{train,val}/000000.jpg ...          RGB JPEG images (quality 90)
    annotations/instances_{train,val}.json     COCO instances, polygon masks
    seg_maps/{train,val}/000000.png ...        uint8 labels: 0 background, 1..K classes
    meta.json                                  written last; arguments, version, counts

One layout serves both tasks:

* mmdet ``CocoDataset(data_root=root, ann_file='annotations/instances_train.json',
  data_prefix=dict(img='images/train/'), metainfo=dict(classes=SYNTHETIC_CLASSES))``;
* mmseg ``BaseSegDataset(data_root=root, data_prefix=dict(img_path='images/train',
  seg_map_path='seg_maps/train'), img_suffix='.jpg', seg_map_suffix='.png', ...)`` with
  ``metainfo=dict(classes=SYNTHETIC_SEG_CLASSES, palette=SYNTHETIC_SEG_PALETTE)`` and
  ``reduce_zero_label=False`` (K + 1 classes, background is class 0), or with
  ``metainfo=dict(classes=SYNTHETIC_CLASSES, palette=SYNTHETIC_PALETTE)`` and
  ``reduce_zero_label=True`` (ADE20K style: background becomes 255 and is ignored).

:func:`write_cityscapes_layout` copies a generated dataset into Cityscapes' folder layout
(``cityscapes/leftImg8bit/{train,val}/synthetic/*_leftImg8bit.png`` and
``cityscapes/gtFine/{train,val}/synthetic/*_gtFine_labelTrainIds.png`` under ``root``),
which mmseg's ``CityscapesDataset`` (19 classes) reads unchanged; the label maps hold
Cityscapes train ids (:data:`SYNTHETIC_CITYSCAPES_TRAIN_IDS`).

Every image has 1..``max_shapes`` shapes of random class, size, position and colour on a
textured background (smooth colour noise, stripes, gradients). The shapes are upright
(squares axis-aligned, triangles with a corner up, their corners jittered a little): a model
trained from random weights tells them apart within the quickstart's budget (with random
rotations, version 3, the quickstart's Semantic FPN reached mIoU 40 after 1200 iterations,
with upright shapes 69). Shape colours and background colours come from the same
distribution, so colour alone does not give the class; each shape's colour is drawn so that
it differs from what lies beneath it. Shapes may overlap: later shapes occlude earlier ones,
an earlier shape keeps at least 60 % of its area and never gets a hole, and masks, boxes and
areas describe what stays visible. Each visible mask is
stored as pixel-edge polygons, which pycocotools (and so mmdet's ``LoadAnnotations``) decodes
back to exactly the same pixels; the image and the semantic map are drawn from those decoded
masks, so all annotations agree with each other and with the image to the pixel.

The output depends only on the arguments (one ``numpy`` generator per image, seeded with
``[seed, split, index]``): the same arguments give byte-identical files. Only numpy, OpenCV
and pycocotools are imported here.
"""
import json
import os
import os.path as osp
import shutil
import time
import warnings

import cv2
import numpy as np
from pycocotools import mask as mask_utils

__all__ = [
    'SYNTHETIC_CLASSES', 'SYNTHETIC_PALETTE', 'SYNTHETIC_SEG_CLASSES', 'SYNTHETIC_SEG_PALETTE',
    'SYNTHETIC_DEFAULTS', 'SYNTHETIC_GENERATOR_VERSION', 'SYNTHETIC_CITYSCAPES_TRAIN_IDS',
    'generate_synthetic_dataset', 'write_cityscapes_layout'
]

SYNTHETIC_CLASSES = ('circle', 'square', 'triangle')
SYNTHETIC_PALETTE = ((220, 20, 60), (0, 130, 255), (255, 190, 0))
SYNTHETIC_SEG_CLASSES = ('background', ) + SYNTHETIC_CLASSES
SYNTHETIC_SEG_PALETTE = ((0, 0, 0), ) + SYNTHETIC_PALETTE
SYNTHETIC_DEFAULTS = dict(num_train=3000, num_val=200, img_size=(64, 64), seed=0, max_shapes=4)
# Cityscapes train id of each semantic-map value (background, circle, square, triangle):
# road, traffic sign, car, person (classes 0, 7, 13, 11 of Cityscapes' 19).
SYNTHETIC_CITYSCAPES_TRAIN_IDS = (0, 7, 13, 11)
# Bump whenever the same arguments would produce different files.
SYNTHETIC_GENERATOR_VERSION = 4

_GENERATOR = 'polaformer_mm.datasets.synthetic'
_SPLITS = ('train', 'val')
_SUBDIRS = ('images', 'annotations', 'seg_maps')
_META = 'meta.json'
_INCOMPLETE = '.incomplete'  # present while a generation runs
_JPEG_QUALITY = 90
_MIN_VISIBLE_FRACTION = 0.6  # an occluded shape keeps at least this much of its area
_MIN_CONTRAST = 60.0  # RGB distance from the shape colour to 90 % of the pixels below it
_PLACEMENT_TRIES = 25
# Background textures are scaled to this fraction of their full colour range around their
# mean colour: still textured, but a shape's outline is a stronger edge than the texture's,
# so a detector trained from scratch for a few minutes learns to find the shapes (version 1
# used full-range textures and did not learn within the quickstart's budget).
_TEXTURE_CONTRAST = 0.35
_COLOUR_TRIES = 32
# shape diameters (squares and triangles: of a circle of the same area), as a fraction of
# the image's short side
_DIAMETER_RANGE = (0.2, 0.5)
_CONTRAST_SAMPLES = 256  # pixels the contrast check looks at
_RENDER_CHUNK = 64  # images per task of a rendering worker


def _check_args(num_train, num_val, img_size, seed, max_shapes):
    if isinstance(img_size, (int, np.integer)):
        img_size = (img_size, img_size)
    try:
        height, width = (int(v) for v in img_size)
    except (TypeError, ValueError):
        raise ValueError(f'img_size must be an int or (height, width), got {img_size!r}')
    if min(height, width) < 32:
        raise ValueError(f'img_size must be at least 32x32, got {height}x{width}')
    for name, value, low in (('num_train', num_train, 1), ('num_val', num_val, 1),
                             ('seed', seed, 0), ('max_shapes', max_shapes, 1)):
        if not isinstance(value, (int, np.integer)) or isinstance(value, bool) \
                or value < low:
            raise ValueError(f'{name} must be an int >= {low}, got {value!r}')
    return dict(
        num_train=int(num_train),
        num_val=int(num_val),
        img_size=[height, width],
        seed=int(seed),
        max_shapes=int(max_shapes))


# ----------------------------------------------------------------------------- textures
def _grid(height, width):
    ys, xs = np.mgrid[0:height, 0:width].astype(np.float32)
    return xs, ys


def _pattern(rng, height, width):
    """A scalar field in [0, 1]: smooth noise, stripes or a linear gradient."""
    kind = rng.integers(3)
    xs, ys = _grid(height, width)
    if kind == 0:
        cells = rng.integers(2, 9, size=2)
        low = rng.random((int(cells[0]), int(cells[1]))).astype(np.float32)
        field = cv2.resize(low, (width, height), interpolation=cv2.INTER_CUBIC)
        field -= field.min()
        return field / max(float(field.max()), 1e-6)
    theta = rng.uniform(0, np.pi)
    proj = xs * np.cos(theta) + ys * np.sin(theta)
    if kind == 1:
        period = rng.uniform(6, 32)
        sharpness = rng.uniform(1, 4)
        wave = np.tanh(sharpness * np.sin(2 * np.pi * proj / period + rng.uniform(0, 2 * np.pi)))
        return (0.5 + 0.5 * wave / np.tanh(sharpness)).astype(np.float32)
    proj -= proj.min()
    return proj / max(float(proj.max()), 1e-6)


def _background(rng, height, width):
    if rng.random() < 0.3:  # colourful smooth noise
        cells = rng.integers(2, 7, size=2)
        low = rng.uniform(0, 255, (int(cells[0]), int(cells[1]), 3)).astype(np.float32)
        image = cv2.resize(low, (width, height), interpolation=cv2.INTER_CUBIC)
    else:  # a pattern between two colours
        colours = rng.uniform(0, 255, (2, 3)).astype(np.float32)
        field = _pattern(rng, height, width)[..., None]
        image = colours[0] * (1 - field) + colours[1] * field
    if rng.random() < 0.5:  # a second, fainter texture on top
        field = _pattern(rng, height, width)[..., None]
        colour = rng.uniform(0, 255, 3).astype(np.float32)
        weight = rng.uniform(0.15, 0.4)
        image = image * (1 - weight * field) + colour * (weight * field)
    mean = image.reshape(-1, 3).mean(0)
    image = mean + _TEXTURE_CONTRAST * (image - mean)
    return np.clip(image, 0, 255)


def _shape_fill(rng, colour, center, size, full):
    """The shape's own texture on the pixels of ``full``: its colour with a mild gradient
    and grain. Returns an (H, W, 3) float32 image, zero outside ``full``."""
    ys, xs = np.nonzero(full)
    theta = rng.uniform(0, 2 * np.pi)
    ramp = ((xs - center[0]) * np.cos(theta) + (ys - center[1]) * np.sin(theta)) / size
    values = colour[None, :] + (rng.uniform(0, 40) * ramp)[:, None]
    values = values + rng.normal(0, 4, (len(ys), 1))
    fill = np.zeros(full.shape + (3, ), np.float32)
    fill[ys, xs] = np.clip(values, 0, 255)
    return fill


# ----------------------------------------------------------------------------- geometry
def _shape_outline(rng, label, diameter):
    """Vertices (N, 2) of an upright shape centred at the origin; None for a circle."""
    if label == 0:
        return None
    if label == 1:  # an axis-aligned square of the circle's area
        half = 0.5 * np.sqrt(np.pi) / 2 * diameter
        return np.array([[-1, -1], [1, -1], [1, 1], [-1, 1]], np.float64) * half
    # a roughly equilateral triangle of about the circle's area, one corner up (image rows
    # grow downwards), each corner's distance and angle jittered a little
    radius = 0.777 * diameter * rng.uniform(0.9, 1.1, size=3)
    angles = np.arange(3) * 2 * np.pi / 3 - np.pi / 2 + rng.uniform(-0.14, 0.14, size=3)
    return np.stack([radius * np.cos(angles), radius * np.sin(angles)], 1)


def _draw_shape(label, outline, center, diameter, height, width):
    mask = np.zeros((height, width), np.uint8)
    shift = 4  # sub-pixel positions
    if label == 0:
        cv2.circle(mask, tuple(int(round(v * 16)) for v in center), int(round(diameter / 2 * 16)),
                   1, -1, cv2.LINE_8, shift)
    else:
        pts = np.round((outline + center) * 16).astype(np.int32)
        cv2.fillPoly(mask, [pts], 1, cv2.LINE_8, shift)
    return mask.astype(bool)


def _sample_shape(rng, label, height, width):
    short = min(height, width)
    diameter = rng.uniform(*_DIAMETER_RANGE) * short
    outline = _shape_outline(rng, label, diameter)
    if outline is None:
        low = np.array([-diameter / 2] * 2)
        high = -low
    else:
        low, high = outline.min(0), outline.max(0)
    span = high - low
    limit = np.array([width - 2, height - 2], np.float64)
    if np.any(span > limit):  # too large for this image: shrink to fit
        scale = float(np.min(limit / span))
        diameter *= scale
        low, high = low * scale, high * scale
        outline = None if outline is None else outline * scale
    center = rng.uniform(1 - low, limit + 1 - high)
    return diameter, outline, center


def _has_hole(mask):
    _, hierarchy = cv2.findContours(mask.astype(np.uint8), cv2.RETR_CCOMP, cv2.CHAIN_APPROX_SIMPLE)
    return hierarchy is not None and bool(np.any(hierarchy[0][:, 3] >= 0))


def _mask_to_polygons(mask):
    """Pixel-edge outlines of ``mask``: pycocotools decodes them to the same pixels.

    Upsampling by 2 puts the contour of the upsampled mask on the outer half-pixels; mapping
    coordinate u to (u + 1) // 2 moves it onto the pixel edges of the original mask.
    """
    up = np.repeat(np.repeat(mask.astype(np.uint8), 2, 0), 2, 1)
    contours, _ = cv2.findContours(up, cv2.RETR_EXTERNAL, cv2.CHAIN_APPROX_SIMPLE)
    polygons = []
    for contour in contours:
        points = (contour.reshape(-1, 2) + 1) // 2
        points = points[(points != np.concatenate([points[-1:], points[:-1]])).any(1)]
        if len(points) >= 3:
            polygons.append([int(v) for v in points.ravel()])
    return polygons


def _decode(polygons, height, width):
    rles = mask_utils.frPyObjects(polygons, height, width)
    with warnings.catch_warnings():  # pycocotools' decode under numpy 2 ("copy keyword")
        warnings.simplefilter('ignore', DeprecationWarning)
        return mask_utils.decode(mask_utils.merge(rles)).astype(bool)


def _contrast_colour(rng, pixels):
    """A colour far from most of ``pixels`` (RGB distance to its 10th percentile)."""
    candidates = rng.uniform(0, 255, (_COLOUR_TRIES, 3)).astype(np.float32)
    step = max(1, len(pixels) // _CONTRAST_SAMPLES)  # an even subsample is enough
    pixels = pixels[::step]
    diff = candidates[:, None, :] - pixels[None, :, :].astype(np.float32)
    dist = np.sqrt(np.einsum('cpk,cpk->cp', diff, diff))
    k = (dist.shape[1] - 1) // 10
    score = np.partition(dist, k, axis=1)[:, k]  # the 10th percentile (lower)
    good = np.flatnonzero(score >= _MIN_CONTRAST)
    return candidates[good[0] if len(good) else int(np.argmax(score))]


# ----------------------------------------------------------------------------- one image
def _make_image(rng, height, width, max_shapes):
    """Returns the RGB uint8 image, the uint8 label map and the visible instances."""
    min_area = max(16, int(round(0.002 * height * width)))
    canvas = _background(rng, height, width)
    preview = canvas.copy()  # canvas with the whole shapes, for the contrast check
    shapes = []  # dict(label, full, visible, colour, fill)
    for _ in range(int(rng.integers(1, max_shapes + 1))):
        label = int(rng.integers(len(SYNTHETIC_CLASSES)))
        for _ in range(_PLACEMENT_TRIES):
            diameter, outline, center = _sample_shape(rng, label, height, width)
            full = _draw_shape(label, outline, center, diameter, height, width)
            if full.sum() < 4 * min_area:
                continue
            ok = True
            for shape in shapes:
                if not np.any(shape['visible'] & full):
                    continue
                rest = shape['visible'] & ~full
                if rest.sum() < _MIN_VISIBLE_FRACTION * shape['full'].sum() or _has_hole(rest):
                    ok = False
                    break
            if ok:
                break
        else:
            continue  # no room for this shape
        for shape in shapes:
            shape['visible'] = shape['visible'] & ~full
        colour = _contrast_colour(rng, preview[full])
        fill = _shape_fill(rng, colour, center, diameter, full)
        preview[full] = fill[full]
        shapes.append(dict(label=label, full=full, visible=full.copy(), fill=fill))

    labels = np.zeros((height, width), np.uint8)
    instances = []
    for shape in shapes:
        visible = shape['visible']
        num, comp, stats, _ = cv2.connectedComponentsWithStats(visible.astype(np.uint8), 8)
        for k in range(1, num):  # drop slivers cut off by occluders
            if stats[k, cv2.CC_STAT_AREA] < 8:
                visible = visible & (comp != k)
        polygons = _mask_to_polygons(visible) if visible.any() else []
        if not polygons:
            continue
        mask = _decode(polygons, height, width)  # == visible (no holes)
        area = int(mask.sum())
        if area < min_area:
            continue
        canvas[mask] = shape['fill'][mask]
        labels[mask] = shape['label'] + 1
        ys, xs = np.nonzero(mask)
        x0, y0 = int(xs.min()), int(ys.min())
        instances.append(
            dict(
                category_id=shape['label'] + 1,
                segmentation=polygons,
                area=area,
                bbox=[x0, y0, int(xs.max()) - x0 + 1,
                      int(ys.max()) - y0 + 1],
                iscrowd=0,
                occluded=bool(area < shape['full'].sum())))
    canvas += rng.normal(0, rng.uniform(2, 8), canvas.shape).astype(np.float32)
    image = np.clip(np.round(canvas), 0, 255).astype(np.uint8)
    return image, labels, instances


# ----------------------------------------------------------------------------- dataset
def _split_files(root, split, count):
    for index in range(count):
        name = f'{index:06d}'
        yield (osp.join(root, 'images', split,
                        name + '.jpg'), osp.join(root, 'seg_maps', split, name + '.png'))


def _is_complete(root, meta):
    if osp.exists(osp.join(root, _INCOMPLETE)):
        return False
    for split in _SPLITS:
        info = (meta.get('splits') or {}).get(split) or {}
        count = meta['args'][f'num_{split}']
        if info.get('images') != count or not osp.isfile(
                osp.join(root, f'annotations/instances_{split}.json')):
            return False
        for paths in _split_files(root, split, count):
            if not all(osp.isfile(p) for p in paths):
                return False
    return True


def _write(path, ok):
    if not ok:
        raise OSError(f'could not write {path}')


def _render_one(task):
    """Draw and write one image and its semantic map; returns its instances. ``task`` is
    ``(img_path, seg_path, seed, split_id, index, img_size, max_shapes)``; the result
    depends on nothing else, so images render in any order or process."""
    img_path, seg_path, seed, split_id, index, (height, width), max_shapes = task
    rng = np.random.default_rng([seed, split_id, index])
    image, labels, instances = _make_image(rng, height, width, max_shapes)
    _write(
        img_path,
        cv2.imwrite(img_path, cv2.cvtColor(image, cv2.COLOR_RGB2BGR),
                    [cv2.IMWRITE_JPEG_QUALITY, _JPEG_QUALITY]))
    _write(seg_path, cv2.imwrite(seg_path, labels))
    return instances


def _render_all(tasks, workers):
    """Every image's instances, in order; ``workers`` processes share the images, forked
    (spawned where this process runs other threads, whose locks a fork would copy; no fork
    on this platform, or one worker: all in this process)."""
    import multiprocessing as mp

    from ..utils.processes import pool_context
    if workers <= 1 or len(tasks) < 2 * _RENDER_CHUNK or 'fork' not in mp.get_all_start_methods():
        return [_render_one(t) for t in tasks]
    with pool_context().Pool(workers) as pool:
        return pool.map(_render_one, tasks, chunksize=_RENDER_CHUNK)


def _generate_split(root, split, split_id, args, workers=1):
    height, width = args['img_size']
    images, annotations = [], []
    per_class = {name: 0 for name in SYNTHETIC_CLASSES}
    occluded = 0
    tasks = [(img_path, seg_path, args['seed'], split_id, index, (height, width),
              args['max_shapes'])
             for index, (img_path,
                         seg_path) in enumerate(_split_files(root, split, args[f'num_{split}']))]
    for index, (task, instances) in enumerate(zip(tasks, _render_all(tasks, workers))):
        img_path, image_id = task[0], index + 1
        images.append(
            dict(id=image_id, file_name=osp.basename(img_path), height=height, width=width))
        for inst in instances:
            occluded += inst.pop('occluded')
            per_class[SYNTHETIC_CLASSES[inst['category_id'] - 1]] += 1
            annotations.append(dict(id=len(annotations) + 1, image_id=image_id, **inst))
    ann_file = f'annotations/instances_{split}.json'
    coco = dict(
        info=dict(
            description='polaformer_mm synthetic shapes', version=str(SYNTHETIC_GENERATOR_VERSION)),
        images=images,
        annotations=annotations,
        categories=[
            dict(id=i + 1, name=name, supercategory='shape')
            for i, name in enumerate(SYNTHETIC_CLASSES)
        ])
    with open(osp.join(root, ann_file), 'w') as f:
        f.write(json.dumps(coco, separators=(',', ':')))  # dumps: the C encoder
    return dict(
        images=len(images),
        instances=len(annotations),
        per_class=per_class,
        occluded=occluded,
        ann_file=ann_file,
        img_dir=f'images/{split}',
        seg_dir=f'seg_maps/{split}')


def _mismatch(meta, wanted):
    diffs = []
    if meta.get('generator') != _GENERATOR:
        diffs.append(f"generator {meta.get('generator')!r} (this is {_GENERATOR!r})")
    if meta.get('version') != SYNTHETIC_GENERATOR_VERSION:
        diffs.append(f"version {meta.get('version')!r} "
                     f'(this generator is version {SYNTHETIC_GENERATOR_VERSION})')
    have = meta.get('args') or {}
    for key, value in wanted.items():
        if have.get(key) != value:
            diffs.append(f'{key}={have.get(key)!r} (requested {value!r})')
    return diffs


def generate_synthetic_dataset(root,
                               num_train=SYNTHETIC_DEFAULTS['num_train'],
                               num_val=SYNTHETIC_DEFAULTS['num_val'],
                               img_size=SYNTHETIC_DEFAULTS['img_size'],
                               seed=SYNTHETIC_DEFAULTS['seed'],
                               max_shapes=SYNTHETIC_DEFAULTS['max_shapes'],
                               overwrite=False,
                               workers=1):
    """Write the synthetic dataset under ``root`` (see the module docstring) once.

    Args:
        root (str | os.PathLike): output folder, created if needed.
        num_train (int): training images. num_val (int): validation images.
        img_size (int | tuple[int, int]): ``(height, width)``, or one int for a square.
        seed (int): >= 0; the same arguments always give the same bytes.
        max_shapes (int): each image gets 1..max_shapes shapes (fewer when they do not fit).
        overwrite (bool): regenerate in any case, replacing a dataset generated with other
            arguments (or whatever occupies ``root/images``, ``root/annotations`` and
            ``root/seg_maps``; nothing else under ``root`` is touched).
        workers (int): processes that render the images, forked from this one where the
            platform forks (the files are the same bytes for any number). Default: 1.

    Returns:
        dict: the contents of ``meta.json`` (``generator``, ``version``, ``args``,
        ``classes``, ``seg_classes``, ``palette``, ``seg_palette``, ``splits`` with, per
        split, ``images``, ``instances``, ``per_class``, ``occluded``, ``ann_file``,
        ``img_dir``, ``seg_dir``), plus ``root`` (absolute), ``generated`` (False when a
        complete dataset with the same arguments was already there and nothing was written)
        and ``seconds``.

    Raises:
        FileExistsError: ``root`` holds a different dataset and ``overwrite`` is False.
        ValueError: invalid arguments.
    """
    start = time.perf_counter()
    args = _check_args(num_train, num_val, img_size, seed, max_shapes)
    if not isinstance(workers, (int, np.integer)) or isinstance(workers, bool) or workers < 1:
        raise ValueError(f'workers must be an int >= 1, got {workers!r}')
    root = osp.abspath(os.fspath(root))
    meta_path = osp.join(root, _META)
    if not overwrite:
        meta = _existing_dataset(root, args)
        if meta is not None:
            return dict(
                meta, root=root, generated=False, seconds=round(time.perf_counter() - start, 3))
    _clear(root)
    splits = {
        split: _generate_split(root, split, split_id, args, workers)
        for split_id, split in enumerate(_SPLITS)
    }
    meta = dict(
        generator=_GENERATOR,
        version=SYNTHETIC_GENERATOR_VERSION,
        args=args,
        classes=list(SYNTHETIC_CLASSES),
        seg_classes=list(SYNTHETIC_SEG_CLASSES),
        palette=[list(c) for c in SYNTHETIC_PALETTE],
        seg_palette=[list(c) for c in SYNTHETIC_SEG_PALETTE],
        splits=splits)
    tmp_path = meta_path + '.tmp'
    with open(tmp_path, 'w') as f:
        json.dump(meta, f, indent=2)
        f.write('\n')
    os.replace(tmp_path, meta_path)  # meta.json last: its presence marks completion
    os.remove(osp.join(root, _INCOMPLETE))
    return dict(meta, root=root, generated=True, seconds=round(time.perf_counter() - start, 3))


def _existing_dataset(root, args):
    """The meta of a complete dataset generated under ``root`` with ``args``; None when
    there is nothing of this generator there, its files are incomplete or it is from an
    older version of this generator with the same arguments (regenerate); FileExistsError
    when ``root`` holds another dataset or other files."""
    meta_path = osp.join(root, _META)
    if osp.isfile(meta_path):
        try:
            with open(meta_path) as f:
                meta = json.load(f)
        except ValueError:
            meta = {}
        diffs = _mismatch(meta, args)
        if meta.get('generator') == _GENERATOR and (meta.get('args') or {}) == args \
                and meta.get('version') != SYNTHETIC_GENERATOR_VERSION:
            # this generator's own output, from an older version with the same arguments:
            # nothing in it that the same call cannot write again
            warnings.warn(f'{root}: the synthetic dataset there is from generator version '
                          f"{meta.get('version')!r}; writing version "
                          f'{SYNTHETIC_GENERATOR_VERSION} in its place')
            return None
        if diffs:
            raise FileExistsError(
                f'{root} holds a synthetic dataset generated with different settings: '
                + '; '.join(diffs) + '. Pass overwrite=True (--overwrite) to replace it, '
                'or choose another root.')
        # ours, with the same arguments; when files are missing it is generated again
        return meta if _is_complete(root, meta) else None
    if not osp.exists(osp.join(root, _INCOMPLETE)) and any(
            osp.isdir(osp.join(root, sub)) and os.listdir(osp.join(root, sub)) for sub in _SUBDIRS):
        raise FileExistsError(
            f'{root} already holds files in {"/".join(_SUBDIRS)} but no {_META} of this '
            'generator. Pass overwrite=True (--overwrite) to replace them, or choose '
            'another root.')
    return None


def _clear(root):
    """Empty folders for a new generation under ``root``, marked incomplete until
    ``meta.json`` is written (nothing but the generator's folders is touched)."""
    os.makedirs(root, exist_ok=True)
    with open(osp.join(root, _INCOMPLETE), 'w') as f:
        f.write('generation in progress or interrupted\n')
    for sub in _SUBDIRS:  # leftovers of another or an interrupted generation
        if osp.isdir(osp.join(root, sub)):
            shutil.rmtree(osp.join(root, sub))
    meta_path = osp.join(root, _META)
    if osp.exists(meta_path):
        os.remove(meta_path)
    os.makedirs(osp.join(root, 'annotations'))
    for split in _SPLITS:
        os.makedirs(osp.join(root, 'images', split))
        os.makedirs(osp.join(root, 'seg_maps', split))


# ----------------------------------------------------------------------------- Cityscapes
_CITY = 'synthetic'  # the one "city" folder of each split


def write_cityscapes_layout(root):
    """Copy the synthetic dataset generated under ``root`` into Cityscapes' layout.

    Writes ``root/cityscapes/leftImg8bit/{train,val}/synthetic/<n>_leftImg8bit.png`` (the
    images, as PNG) and ``root/cityscapes/gtFine/{train,val}/synthetic/
    <n>_gtFine_labelTrainIds.png`` (the semantic maps in Cityscapes train ids:
    :data:`SYNTHETIC_CITYSCAPES_TRAIN_IDS`), what mmseg's ``CityscapesDataset`` reads with
    ``data_root=root/cityscapes``. Nothing is written when the tree already holds a copy of
    the same generation (its ``meta.json`` equals the dataset's).

    Args:
        root (str | os.PathLike): a folder :func:`generate_synthetic_dataset` completed.

    Returns:
        str: the Cityscapes tree (``root/cityscapes``).

    Raises:
        FileNotFoundError: ``root`` holds no complete synthetic dataset.
    """
    root = osp.abspath(os.fspath(root))
    meta_path = osp.join(root, _META)
    if not osp.isfile(meta_path) or osp.exists(osp.join(root, _INCOMPLETE)):
        raise FileNotFoundError(f'{root}: no complete synthetic dataset ({_META} missing or '
                                'generation unfinished); run generate_synthetic_dataset first')
    with open(meta_path) as f:
        meta = json.load(f)
    tree = osp.join(root, 'cityscapes')
    copy_meta = osp.join(tree, _META)
    if osp.isfile(copy_meta):
        with open(copy_meta) as f:
            if json.load(f) == meta:
                return tree
    if osp.isdir(tree):
        shutil.rmtree(tree)
    lut = np.full(256, 255, np.uint8)
    lut[:len(SYNTHETIC_CITYSCAPES_TRAIN_IDS)] = SYNTHETIC_CITYSCAPES_TRAIN_IDS
    for split in _SPLITS:
        img_dir = osp.join(tree, 'leftImg8bit', split, _CITY)
        seg_dir = osp.join(tree, 'gtFine', split, _CITY)
        os.makedirs(img_dir)
        os.makedirs(seg_dir)
        for img_path, seg_path in _split_files(root, split, meta['args'][f'num_{split}']):
            name = osp.splitext(osp.basename(img_path))[0]
            image = cv2.imread(img_path, cv2.IMREAD_COLOR)
            labels = cv2.imread(seg_path, cv2.IMREAD_UNCHANGED)
            if image is None or labels is None:
                raise FileNotFoundError(f'{img_path} or {seg_path} unreadable')
            out = osp.join(img_dir, f'{name}_leftImg8bit.png')
            _write(out, cv2.imwrite(out, image))
            out = osp.join(seg_dir, f'{name}_gtFine_labelTrainIds.png')
            _write(out, cv2.imwrite(out, lut[labels]))
    with open(copy_meta, 'w') as f:  # last: marks the copy complete
        json.dump(meta, f, indent=2)
    return tree
