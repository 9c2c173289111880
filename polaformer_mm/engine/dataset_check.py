"""Check a config's datasets before training: problems named with counts and file names.

mmdet and mmseg report broken datasets from deep inside: a COCO annotation with
``segmentation: []`` fails as ``KeyError: 'mask'`` in the middle of an epoch, a training
set without one annotated image as "need at least one array to concatenate", a missing
image as a ``FileNotFoundError`` after hours of training. :func:`check_datasets` reads
the train / val / test datasets of a config the way the libraries will and reports, per
dataset, with counts and the first few file names:

* COCO-style mmdet datasets (``CocoDataset`` and subclasses): images missing on disk,
  image entries without ``file_name`` / ``width`` / ``height``, annotations without
  ``bbox`` / ``area`` / ``category_id``, boxes that are not four numbers and areas that
  are not numbers, annotation ids used twice, empty segmentations where the pipeline
  loads masks (errors: each would crash mmdet); image ids listed twice (pycocotools
  keeps the last entry: one file trains with the other's boxes), boxes with NaN or
  infinite values, category ids missing from the file's ``categories`` (mmdet drops
  those objects silently) (errors: mmdet would mislabel); images without annotations,
  files listed under two ids, degenerate boxes and polygons (mmdet skips or ignores
  them), annotations of unknown images, classes never seen or missing from the file's
  categories (warnings); crowd annotations and annotations of categories the config's
  classes leave out (notes); a training set that mmdet's ``filter_cfg`` leaves empty, or
  whose images hold no annotation mmdet trains on (all crowd, ignored, degenerate or of
  other classes: the box and mask losses would be 0) (errors).
* COCO-panoptic datasets (``CocoPanopticDataset``): read as mmdet reads them, per image
  and per segment (:mod:`.dataset_panoptic`).
* mmseg image / segmentation-map datasets (``BaseSegDataset`` and subclasses): no
  images, images without a segmentation map (errors), images listed twice in the split
  file (warning); in a sample of the maps, maps that do not decode and labels outside
  the classes (errors), maps with only ignored pixels and classes never seen (warnings),
  a training set whose every decoded map holds only ignored pixels (error).
* other datasets (mmpretrain, ...): only that the annotation file / data folder exists.
* with ``deep=True`` (``tools/misc/check_dataset.py --deep``, config key
  ``deep_dataset_check = True`` for ``tools/train.py``) also, for every image (and
  segmentation map), that the file can be used and its size: zero-byte, unreadable, cut
  short, a size other than the annotation file's, a map of another size than its image
  (errors; :mod:`.dataset_deep`).

Cost, kept low enough for COCO (118k images, 860k annotations): the annotation JSON is
read once; files are never opened or stat'ed one by one: each image folder is listed once
and names are looked up in that listing. Of the segmentation maps only a sample is decoded
(``seg_sample`` maps evenly spread over the dataset, 64 by default; ``None``: all), so
"classes never seen" is about that sample for mmseg.

Errors in the train / val datasets stop ``tools/train.py`` before anything is built
(:class:`DatasetCheckError`, whose message is the report); ``--skip-dataset-check`` or
``skip_dataset_check = True`` in the config turns the check off.
"""
import gc
import json
import os
import os.path as osp
import re
import time
from collections import Counter
from typing import List, Optional, Sequence

from .dataset_report import NUMBER as _NUMBER
from .dataset_report import (DatasetReport, FolderListing, check_image_entries, check_image_files,
                             config_classes, is_hashable, is_remote, join_path)
from .dataset_report import short as _short

WRAPPERS = ('dataset', )  # RepeatDataset, ClassBalancedDataset, MultiImageMixDataset, ...


class DatasetCheckError(RuntimeError):
    """A dataset problem that would crash training; the message is the whole report."""


def _innermost(cfg: dict, name: str) -> List[tuple]:
    """(name, dataset config, wrapper pipelines) of the datasets inside wrappers."""
    if 'datasets' in cfg:  # ConcatDataset
        found = []
        for i, sub in enumerate(cfg['datasets']):
            found += _innermost(sub, f'{name}.datasets[{i}]')
        return found
    if 'dataset' in cfg:
        inner = _innermost(cfg['dataset'], f'{name}.dataset')
        outer = list(cfg.get('pipeline', []) or [])
        return [(n, c, outer + p) for n, c, p in inner]
    return [(name, cfg, [])]


def _loads_masks(pipelines: Sequence) -> bool:
    return any(
        isinstance(t, dict) and 'LoadAnnotations' in str(t.get('type'))
        and t.get('with_mask', False) for t in pipelines)


_MISSING = object()  # a field the annotation does not have
_POLYGON_RAW = re.compile(rb'\[([^\[\]]*)\]')


class _AnnView:
    """Attribute access to an annotation dict (missing fields are ``_MISSING``)."""
    __slots__ = ('_d', )

    def __init__(self, d: dict) -> None:
        self._d = d if isinstance(d, dict) else {}

    def __getattr__(self, key):
        return self._d.get(key, _MISSING)


def _read_coco(path: str):
    """(images, annotations, categories, raw) of a COCO file.

    With msgspec installed the file is decoded against a schema that keeps each
    ``segmentation`` as raw JSON bytes (``raw`` is True), so the millions of polygon
    coordinates never become Python floats; the standard library's json is the fallback
    (several times slower on COCO train2017).
    """
    return _decode_coco(path)


def _decode_coco(path: str):
    with open(path, 'rb') as f:
        data = f.read()
    try:
        import msgspec
    except ImportError:
        return _decode_stdlib(data)
    from typing import Any, List

    class Annotation(msgspec.Struct, gc=False):
        id: Any = _MISSING
        image_id: Any = _MISSING
        category_id: Any = _MISSING
        bbox: Any = _MISSING
        area: Any = _MISSING
        ignore: Any = False
        iscrowd: Any = _MISSING
        segmentation: msgspec.Raw = _MISSING

    class Coco(msgspec.Struct):
        images: Any = []
        annotations: List[Annotation] = []
        categories: Any = []

    try:
        coco = msgspec.json.decode(data, type=Coco)
    except msgspec.DecodeError as err:
        if 'malformed' in str(err):
            # NaN or Infinity, which Python's json (and so pycocotools) reads, or no JSON
            # at all (json raises a ValueError)
            return _decode_stdlib(data)
        raise ValueError(str(err)) from None
    return coco.images or [], coco.annotations or [], coco.categories or [], True


def _decode_stdlib(data: bytes):
    coco = json.loads(data)
    if not isinstance(coco, dict):
        raise ValueError('the top level is not a JSON object')
    return (coco.get('images') or [], [_AnnView(a) for a in coco.get('annotations') or []],
            coco.get('categories') or [], False)


_EMPTY_RAW = {b'[]', b'{}', b'null', b'""', b'0', b'false'}


def _segmentation_state(seg, raw: bool) -> str:
    """'empty' (mmdet keeps no mask: KeyError 'mask'), 'invalid' (no polygon of 3 or more
    points: mmdet ignores the instance) or 'ok'. ``seg`` is raw JSON (``raw``) or the
    decoded object."""
    if seg is _MISSING:
        return 'empty'
    if raw:
        seg = bytes(seg)
        if len(seg) < 16 and re.sub(rb'\s', b'', seg) in _EMPTY_RAW:
            return 'empty'
        if not seg.startswith(b'['):
            return 'ok'  # RLE
        end = seg.find(b']')
        n = seg.count(b',', 0, end) + 1
        if seg.startswith(b'[[') and n >= 6 and n % 2 == 0:
            return 'ok'  # the first polygon is valid (the common case)
        for inner in _POLYGON_RAW.findall(seg):
            n = inner.count(b',') + 1 if inner.strip() else 0
            if n >= 6 and n % 2 == 0:
                return 'ok'
        return 'invalid'
    if not seg:
        return 'empty'
    if isinstance(seg, list):
        ok = any(isinstance(p, list) and len(p) >= 6 and len(p) % 2 == 0 for p in seg)
        return 'ok' if ok else 'invalid'
    return 'ok'


_BAD_SIZE = (None, None)  # an image whose width or height is not a number


def check_coco(report: DatasetReport,
               ds_cfg: dict,
               cls,
               pipelines: Sequence,
               training: bool,
               deep: bool = False) -> None:
    """Fill ``report`` for an mmdet COCO-style dataset (see the module notes; ``deep``:
    also open every image's header, :mod:`.dataset_deep`)."""
    loaded = _load_coco(report, ds_cfg)
    if loaded is None:
        return
    ann_file, images, anns, cats, raw = loaded
    cats = _CocoCategories(cats, config_classes(ds_cfg, cls))
    report.summary = (f'{ds_cfg.get("type")}, {ann_file}: {len(images)} images, '
                      f'{len(anns)} annotations, {len(cats.classes)} classes')
    if not images:
        report.add('error', 'the file lists no images')
        return
    if cats.bad:
        report.add(
            'error', 'category ids that are not numbers or strings (pycocotools indexes '
            'categories by id: TypeError)', cats.bad)

    images = check_image_entries(report, images)
    check_image_files(report, ds_cfg, images)
    if deep and not is_remote(ds_cfg):
        from .dataset_deep import check_coco_images
        prefix = (ds_cfg.get('data_prefix') or {}).get('img', '')
        check_coco_images(report, join_path(ds_cfg.get('data_root'), prefix), images)
    masks = _loads_masks(list(ds_cfg.get('pipeline', []) or []) + list(pipelines))
    scan = _CocoScan(images, cats, masks, raw)
    scan.scan(anns)
    scan.report_errors(report, unique_ids=getattr(cls, 'ANN_ID_UNIQUE', True))
    scan.report_warnings(report, images, training)
    if training:
        _check_training_set(report, ds_cfg, images, scan)


def _load_coco(report: DatasetReport, ds_cfg: dict) -> Optional[tuple]:
    """(annotation file, images, annotations, categories, raw) of the dataset, or None
    (the error in ``report``) when the file is missing or is not COCO JSON."""
    ann_file = join_path(ds_cfg.get('data_root'), ds_cfg.get('ann_file'))
    if not osp.isfile(ann_file):
        report.summary = f'{ds_cfg.get("type")}, {ann_file}'
        report.add('error', f'annotation file not found: {ann_file}')
        return None
    try:
        images, anns, cats, raw = _read_coco(ann_file)
    except (ValueError, UnicodeDecodeError) as err:
        report.summary = f'{ds_cfg.get("type")}, {ann_file}'
        report.add('error', f'annotation file is not valid COCO JSON ({err})')
        return None
    return ann_file, images, anns, cats, raw


class _CocoCategories:
    """The file's categories as pycocotools indexes them, beside the config's classes
    (None: the file's category names)."""

    def __init__(self, cats: list, classes: Optional[list]) -> None:
        cats = [c for c in cats if isinstance(c, dict)]
        self.bad = [
            _short(c.get('id', c.get('name'))) for c in cats if not is_hashable(c.get('id'))
        ]
        self.cats = [c for c in cats if is_hashable(c.get('id')) and is_hashable(c.get('name'))]
        self.name_to_id = {c.get('name'): c.get('id') for c in self.cats}
        self.classes = list(self.name_to_id) if classes is None else classes
        self.file_ids = {c.get('id') for c in self.cats}
        # pycocotools' get_cat_ids(cat_names=classes): the ids of the categories so named
        wanted = set(self.classes)
        self.ids = {c.get('id') for c in self.cats if c.get('name') in wanted}


def _where(img: dict, ann) -> str:
    return f"{img.get('file_name')} (annotation {_shown(ann.id)})"


class _CocoScan:
    """One pass over a COCO file's annotations (:meth:`scan`), as pycocotools indexes
    them and mmdet trains on them; :meth:`report_errors` and :meth:`report_warnings`
    add what it found to a report.

    Args:
        images (list): the image entries pycocotools can index.
        cats (_CocoCategories): the file's categories and the config's classes.
        masks (bool): whether the pipeline loads masks.
        raw (bool): segmentations are raw JSON (see :func:`_read_coco`).
    """

    def __init__(self, images: list, cats: _CocoCategories, masks: bool, raw: bool) -> None:
        self.by_id = {im['id']: im for im in images}  # the last entry of an id, as pycocotools
        self.sizes = {
            im['id']: (im.get('width', 0), im.get('height', 0)) if all(
                type(im.get(key, 0)) in _NUMBER for key in ('width', 'height')) else _BAD_SIZE
            for im in images
        }
        self.cats, self.masks, self.raw = cats, masks, raw
        self.any_ann, self.cat_imgs, self.usable = set(), set(), Counter()
        self.seen, self.excluded = Counter(), Counter()
        self.no_key = {k: [] for k in ('id', 'image_id', 'category_id', 'bbox', 'area')}
        self.orphans, self.degenerate, self.bad_polygons, self.empty_seg = [], [], [], []
        self.bad_keys, self.not_numbers, self.not_finite, self.bad_area = [], [], [], []
        self.unknown_cat, self.crowd, self.ann_ids = [], [], []

    def scan(self, anns: Sequence) -> None:
        """Index every annotation by id, image and category (:meth:`_index`); check the
        box, area and segmentation of each one mmdet trains on (:meth:`_check_instances`)."""
        self._check_instances(self._index(anns))

    def _index(self, anns: Sequence) -> list:
        """Index the annotations as pycocotools does; returns (annotation, image id,
        category id, image size) of those mmdet trains on (not ignored, of an image with
        a usable size)."""
        by_id, sizes, no_key = self.by_id, self.sizes, self.no_key
        file_cat_ids, cat_ids = self.cats.file_ids, self.cats.ids
        ann_ids, orphans, unknown_cat = self.ann_ids, self.orphans, self.unknown_cat
        any_ann, cat_imgs, excluded = self.any_ann, self.cat_imgs, self.excluded
        trained = []
        for ann in anns:
            img_id, cat_id = ann.image_id, ann.category_id
            if ann.id is _MISSING or img_id is _MISSING or cat_id is _MISSING:
                # pycocotools indexes every annotation by these three
                for key in ('id', 'image_id', 'category_id'):
                    if getattr(ann, key) is _MISSING:
                        no_key[key].append(
                            _where(by_id.get(img_id, {}) if is_hashable(img_id) else {}, ann))
                continue
            try:
                size = sizes.get(img_id)
                known = cat_id in file_cat_ids
                hash(ann.id)
            except TypeError:  # a list or an object: no dict key
                self.bad_keys.append(_short(ann.id))
                continue
            ann_ids.append(ann.id)
            if size is None:
                orphans.append(ann.id)
                continue
            any_ann.add(img_id)
            if not known:
                unknown_cat.append(f'{ann.id} (category_id {cat_id!r})')
            elif cat_id in cat_ids:
                cat_imgs.add(img_id)
            else:
                excluded[cat_id] += 1
            if size is _BAD_SIZE or (ann.ignore and ann.ignore is not _MISSING):
                continue
            trained.append((ann, img_id, cat_id, size))
        return trained

    def _check_instances(self, trained: list) -> None:
        """Check the box, area and segmentation of the annotations mmdet trains on."""
        by_id, cat_ids, masks, raw = self.by_id, self.cats.ids, self.masks, self.raw
        seen, usable, no_key, degenerate = self.seen, self.usable, self.no_key, self.degenerate
        not_numbers, not_finite = self.not_numbers, self.not_finite
        for ann, img_id, cat_id, size in trained:
            if ann.bbox is _MISSING:
                no_key['bbox'].append(_where(by_id[img_id], ann))
                continue
            try:
                x1, y1, w, h = ann.bbox
            except (TypeError, ValueError):  # mmdet's own unpacking fails the same way
                not_numbers.append(f'{_where(by_id[img_id], ann)} {_short(ann.bbox)}')
                continue
            if not (type(x1) in _NUMBER and type(y1) in _NUMBER and type(w) in _NUMBER
                    and type(h) in _NUMBER):
                not_numbers.append(f'{_where(by_id[img_id], ann)} {_short(ann.bbox)}')
                continue
            total = x1 + y1 + w + h
            if total - total != 0:  # NaN or infinite
                not_finite.append(f'{_where(by_id[img_id], ann)} {_short(ann.bbox)}')
                continue
            inter_w = min(x1 + w, size[0]) - max(x1, 0)
            inter_h = min(y1 + h, size[1]) - max(y1, 0)
            if inter_w <= 0 or inter_h <= 0:
                degenerate.append(_where(by_id[img_id], ann))
                continue
            area = ann.area
            if area is _MISSING:
                no_key['area'].append(_where(by_id[img_id], ann))
                continue
            if type(area) not in _NUMBER:
                self.bad_area.append(f'{_where(by_id[img_id], ann)} {_short(area)}')
                continue
            if area <= 0 or w < 1 or h < 1:
                degenerate.append(_where(by_id[img_id], ann))
                continue
            if cat_id not in cat_ids:
                continue
            if masks:
                state = _segmentation_state(ann.segmentation, raw)
                if state == 'empty':
                    self.empty_seg.append(_where(by_id[img_id], ann))
                elif state == 'invalid':
                    self.bad_polygons.append(_where(by_id[img_id], ann))
            if ann.iscrowd and ann.iscrowd is not _MISSING:  # mmdet: ignore_flag = 1
                self.crowd.append(_where(by_id[img_id], ann))
                continue
            seen[cat_id] += 1
            usable[img_id] += 1

    def report_errors(self, report: DatasetReport, unique_ids: bool) -> None:
        """What would crash mmdet or mislabel objects (``unique_ids``: the dataset's
        ``ANN_ID_UNIQUE``)."""
        for key, where in self.no_key.items():
            if where:
                report.add('error', f"annotations without '{key}' (mmdet stops with KeyError: "
                           f"'{key}')", where)
        if self.bad_keys:
            report.add(
                'error', 'annotations whose id, image_id or category_id is not a number or '
                'string (pycocotools indexes annotations by them: TypeError), ids', self.bad_keys)
        id_counts = Counter(self.ann_ids)
        if len(id_counts) < len(self.ann_ids):
            twice = [i for i, count in id_counts.items() if count > 1]
            if unique_ids:
                report.add(
                    'error', 'annotation ids used more than once (mmdet stops with '
                    '"AssertionError: Annotation ids ... are not unique"), ids', twice)
            else:
                report.add(
                    'warning', 'annotation ids used more than once (pycocotools returns the '
                    'last annotation of an id for each of them), ids', twice)
        if self.not_numbers:
            report.add(
                'error', 'bboxes that are not 4 numbers [x, y, w, h] (mmdet stops with a '
                'TypeError or ValueError)', self.not_numbers)
        if self.not_finite:
            report.add(
                'error', 'bboxes with NaN or infinite values (mmdet drops NaN boxes silently '
                'and trains on infinite ones)', self.not_finite)
        if self.bad_area:
            report.add('error', "annotations whose 'area' is not a number (mmdet stops with a "
                       'TypeError)', self.bad_area)
        if self.unknown_cat:
            report.add(
                'error', "annotations whose category_id is not among the file's categories "
                '(mmdet drops them silently: those objects would train as background), '
                'annotation ids', self.unknown_cat)
        if self.empty_seg:
            report.add(
                'error', 'annotations with an empty or missing segmentation while the '
                "pipeline loads masks (mmdet stops with KeyError: 'mask'; give the "
                'polygon or RLE, or drop the annotation)', self.empty_seg)

    def report_warnings(self, report: DatasetReport, images: list, training: bool) -> None:
        """What mmdet skips, ignores or leaves out (warnings and notes)."""
        no_ann = [im.get('file_name') for im in images if im['id'] not in self.any_ann]
        if no_ann:
            report.add(
                'warning', 'images without annotations' +
                (' (left out of training by filter_empty_gt)' if training else ''), no_ann)
        if self.degenerate:
            report.add(
                'warning', 'degenerate boxes (w or h < 1, area <= 0, or outside the '
                'image; mmdet skips them)', self.degenerate)
        if self.bad_polygons:
            report.add(
                'warning', 'segmentations without a valid polygon (fewer than 3 points; '
                'mmdet ignores these instances)', self.bad_polygons)
        if self.orphans:
            report.add('warning', 'annotations of image ids the file does not list, ids',
                       self.orphans)
        classes, name_to_id = self.cats.classes, self.cats.name_to_id
        absent = [n for n in classes if n not in name_to_id]
        if absent:
            report.add('warning', "classes not among the file's categories", absent)
        never = [n for n in classes if n in name_to_id and not self.seen[name_to_id[n]]]
        if never:
            report.add('warning', 'classes never seen (no usable annotation)', never)
        if self.excluded:
            id_to_name = {c.get('id'): c.get('name') for c in self.cats.cats}
            report.add(
                'note', "annotations of categories outside the config's classes (mmdet "
                'leaves them out, as the classes say)',
                [f'{id_to_name.get(i)!s} ({count})' for i, count in self.excluded.most_common()],
                total=sum(self.excluded.values()))
        if self.crowd:
            report.add('note', 'crowd annotations (iscrowd; mmdet ignores them in training)',
                       self.crowd)


def _check_training_set(report: DatasetReport, ds_cfg: dict, images: list, scan: _CocoScan) -> None:
    """A training set that mmdet's ``filter_cfg`` leaves empty, or whose images hold no
    annotation mmdet trains on."""
    filter_cfg = ds_cfg.get('filter_cfg') or {}
    kept = [
        im for im in images
        if (not filter_cfg.get('filter_empty_gt', False) or im['id'] in scan.cat_imgs)
        and scan.sizes[im['id']] is not _BAD_SIZE
        and min(scan.sizes[im['id']]) >= filter_cfg.get('min_size', 0)
    ]
    if not kept:
        report.add(
            'error', 'no training image is left after filter_cfg '
            f'{dict(filter_cfg)} (no image has an annotation of the classes); '
            'mmdet would stop with "need at least one array to concatenate"')
    elif not any(scan.usable[im['id']] for im in kept):
        report.add(
            'error', 'no training image has an annotation mmdet trains on (every one '
            'is a crowd region (iscrowd), ignored, degenerate or of another class): '
            'the box and mask losses would be 0')


def _shown(value):
    return '?' if value is _MISSING else value


# the dataset arguments that decide which files and labels the check reads
_SEG_DATASET_KEYS = ('img_suffix', 'seg_map_suffix', 'reduce_zero_label', 'ignore_index')


def _seg_defaults(cls) -> dict:
    import inspect
    params = inspect.signature(cls.__init__).parameters
    return {
        k: p.default
        for k, p in params.items()
        if k in _SEG_DATASET_KEYS and p.default is not inspect.Parameter.empty
    }


class _SegLayout:
    """Where an mmseg dataset's files are and how its maps are read (the dataset
    arguments the config gives, else the class's defaults)."""

    def __init__(self, ds_cfg: dict, cls) -> None:
        given = {k: v for k, v in ds_cfg.items() if k in _SEG_DATASET_KEYS}
        opts = {**_seg_defaults(cls), **given}
        self.img_suffix = opts.get('img_suffix', '.jpg')
        self.seg_suffix = opts.get('seg_map_suffix', '.png')
        self.ignore = opts.get('ignore_index', 255)
        self.reduce_zero_label = opts.get('reduce_zero_label', False)
        root = ds_cfg.get('data_root')
        prefix = ds_cfg.get('data_prefix') or {}
        self.img_dir = join_path(root, prefix.get('img_path', ''))
        seg_dir = prefix.get('seg_map_path')
        self.seg_dir = join_path(root, seg_dir) if seg_dir is not None else None
        self.ann_file = join_path(root, ds_cfg.get('ann_file',
                                                   '')) if ds_cfg.get('ann_file') else ''
        self.classes = config_classes(ds_cfg, cls)
        self.cls = cls

    def label_map(self) -> Optional[dict]:
        """mmseg's map from the class's labels to those of the config's classes."""
        if self.classes is not None and getattr(self.cls, 'METAINFO',
                                                {}).get('classes') is not None:
            return self.cls.get_label_map(self.classes)
        return None


def check_segmentation(report: DatasetReport,
                       ds_cfg: dict,
                       cls,
                       seg_sample: Optional[int] = 64,
                       training: bool = False,
                       deep: bool = False) -> None:
    """Fill ``report`` for an mmseg image / segmentation-map dataset (``training``: the
    training set, which must hold a pixel to learn from; ``deep``: also open the header
    of every image and map, :mod:`.dataset_deep`)."""
    layout = _SegLayout(ds_cfg, cls)
    classes = layout.classes
    report.summary = f'{ds_cfg.get("type")}, {layout.img_dir}'
    if is_remote(ds_cfg):
        report.add('note', 'remote storage: not checked')
        return
    names = _seg_image_names(report, layout)
    if names is None:
        return
    report.summary += f': {len(names)} images' + (f', {len(classes)} classes' if classes else '')
    if not names:
        report.add('error', f'no images ending in {layout.img_suffix!r} found')
        return
    if layout.seg_dir is None:
        return
    seg_files = [n[:-len(layout.img_suffix)] + layout.seg_suffix for n in names]
    listing = FolderListing()
    no_map = [s for s in seg_files if not listing.exists(osp.join(layout.seg_dir, s))]
    if no_map:
        report.add(
            'error', f'images without a segmentation map (under {layout.seg_dir}, '
            f'suffix {layout.seg_suffix!r})', no_map)
    present = [s for s in seg_files if s not in set(no_map)]
    if deep:
        from .dataset_deep import check_seg_pairs
        pairs = [(n, m) for n, m in zip(names, seg_files)
                 if m in set(present) and osp.isfile(osp.join(layout.img_dir, n))]
        check_seg_pairs(report, layout.img_dir, layout.seg_dir, pairs)
    if not present:
        return
    if seg_sample is not None and len(present) > seg_sample:
        step = len(present) / seg_sample
        present = [present[int(i * step)] for i in range(seg_sample)]
    sampled = f' (in {len(present)} sampled maps)' if seg_sample is not None and len(
        seg_files) - len(no_map) > len(present) else ''
    _check_seg_maps(report, layout, present, sampled, training)


def _seg_image_names(report: DatasetReport, layout: _SegLayout) -> Optional[List[str]]:
    """The dataset's images (relative to the image folder): those of the split file, or
    every file of the folder with the image suffix; None (the error in ``report``) when
    the split file or the folder is missing."""
    if layout.ann_file and not osp.isdir(layout.ann_file):
        ann_file, img_dir = layout.ann_file, layout.img_dir
        if not osp.isfile(ann_file):
            report.add('error', f'split file not found: {ann_file}')
            return None
        with open(ann_file) as f:
            names = [line.strip() + layout.img_suffix for line in f if line.strip()]
        twice = [name for name, count in Counter(names).items() if count > 1]
        if twice:
            report.add(
                'warning', f'images listed more than once in {ann_file} (mmseg uses each '
                'line: the image is seen once per line)', twice)
        listing = FolderListing()
        missing = [n for n in names if not listing.exists(osp.join(img_dir, n))]
        if missing:
            report.add('error', f'images missing on disk (under {img_dir})', missing)
        return names
    if not osp.isdir(layout.img_dir):
        report.add('error', f'image folder not found: {layout.img_dir}')
        return None
    return sorted(
        osp.relpath(osp.join(d, f), layout.img_dir) for d, _, files in os.walk(layout.img_dir)
        for f in files if f.endswith(layout.img_suffix))


def _read_seg_labels(layout: _SegLayout, name: str, label_map: Optional[dict]):
    """The labels of the map ``name`` as mmseg trains on them (``label_map`` and
    reduce_zero_label applied), as int64; None when the file does not decode."""
    import cv2
    import numpy as np
    seg = cv2.imread(osp.join(layout.seg_dir, name), cv2.IMREAD_UNCHANGED)
    if seg is None or seg.ndim not in (2, 3):
        return None
    if seg.ndim == 3:
        seg = seg[..., 0]
    seg = seg.astype(np.int64)
    if label_map:
        mapped = seg.copy()
        for old, new in label_map.items():
            mapped[seg == old] = new
        seg = mapped
    if layout.reduce_zero_label:
        ignore = layout.ignore
        seg[seg == 0] = ignore + 1
        seg = seg - 1
        seg[seg == ignore] = ignore
    return seg


def largest_seg_label(ds_cfg: dict, cls, seg_sample: Optional[int] = 64) -> Optional[tuple]:
    """For an mmseg dataset config: ``(label, map, maps read)``, the largest label (other
    than ``ignore_index``) in a sample of its segmentation maps (``seg_sample`` spread over
    the dataset; None: all), as mmseg trains on them, with a map that holds it; None when
    no map is found or decodes (the dataset check names why), or the files are remote."""
    import numpy as np
    layout = _SegLayout(ds_cfg, cls)
    if is_remote(ds_cfg) or layout.seg_dir is None:
        return None
    names = _seg_image_names(DatasetReport('unused'), layout)
    if not names:
        return None
    seg_files = [n[:-len(layout.img_suffix)] + layout.seg_suffix for n in names]
    if seg_sample is not None and len(seg_files) > seg_sample:
        step = len(seg_files) / seg_sample
        seg_files = [seg_files[int(i * step)] for i in range(seg_sample)]
    largest, read = None, 0
    label_map = layout.label_map()
    for name in seg_files:
        if not osp.isfile(osp.join(layout.seg_dir, name)):
            continue
        seg = _read_seg_labels(layout, name, label_map)
        if seg is None:
            continue
        read += 1
        valid = seg[seg != layout.ignore]
        if valid.size and (largest is None or int(np.max(valid)) > largest[0]):
            largest = (int(np.max(valid)), osp.join(layout.seg_dir, name))
    return None if largest is None else (*largest, read)


def _check_seg_maps(report: DatasetReport, layout: _SegLayout, present: Sequence[str], sampled: str,
                    training: bool) -> None:
    """Decode the maps ``present`` and report maps that do not decode, labels outside
    the classes, maps with only ignored pixels and classes never seen (``sampled``: the
    note that these are a sample)."""
    import numpy as np
    classes, ignore = layout.classes, layout.ignore
    label_map = layout.label_map()
    unreadable, out_of_range, only_ignored = [], [], []
    seen = Counter()
    for name in present:
        seg = _read_seg_labels(layout, name, label_map)
        if seg is None:
            unreadable.append(name)
            continue
        values, counts = np.unique(seg, return_counts=True)
        valid = values[values != ignore]
        if classes is not None and (valid.size and
                                    (valid.min() < 0 or valid.max() >= len(classes))):
            out_of_range.append(f'{name} {sorted(int(v) for v in valid)[-3:]}')
        if not valid.size:
            only_ignored.append(name)
        for v in valid:
            seen[int(v)] += 1
    if unreadable:
        report.add('error', f'segmentation maps that do not decode{sampled}', unreadable)
    if out_of_range:
        report.add(
            'error', f'labels outside 0..{len(classes) - 1} (and ignore {ignore})'
            f'{sampled}; wrong classes or reduce_zero_label?', out_of_range)
    decoded = len(present) - len(unreadable)
    if training and decoded and len(only_ignored) == decoded:
        report.add(
            'error', f'every decoded map{sampled} holds only ignored pixels (ignore_index '
            f'{ignore}): the training set has no pixel to learn from and the decode loss '
            'would be 0; wrong ignore_index or reduce_zero_label?', only_ignored)
    elif only_ignored:
        report.add('warning', f'maps with only ignored pixels{sampled}', only_ignored)
    if classes is not None:
        never = [c for i, c in enumerate(classes) if not seen[i]]
        if never:
            report.add('warning', f'classes never seen{sampled}', never)


def check_other(report: DatasetReport, ds_cfg: dict) -> None:
    """Datasets of other kinds (mmpretrain, ...): the files named in the config exist."""
    root = ds_cfg.get('data_root')
    report.summary = f'{ds_cfg.get("type")}: only the paths are checked'
    if is_remote(ds_cfg):
        return
    if root and not osp.isdir(root):
        report.add('error', f'data_root not found: {root}')
        return
    for key in ('ann_file', 'data_prefix'):
        value = ds_cfg.get(key)
        if isinstance(value, dict):
            value = next(iter(value.values()), None)
        if value and isinstance(value, str):
            path = join_path(root, value)
            if not osp.exists(path):
                report.add('error', f'{key} not found: {path}')


def check_datasets(
        cfg,
        seg_sample: Optional[int] = 64,
        splits: Sequence[str] = ('train', 'val', 'test'),
        deep: bool = False,
) -> List[DatasetReport]:
    """Check the datasets of ``cfg``'s dataloaders (see the module notes).

    Args:
        cfg (Config): a config with ``default_scope`` and ``{split}_dataloader`` entries.
        seg_sample (int, optional): segmentation maps decoded per dataset (evenly spread);
            None decodes all. Default: 64.
        splits (sequence of str): which dataloaders. Default: train, val and test.
        deep (bool): also open the header of every image (and segmentation map):
            empty, unreadable and cut-short files, sizes that differ from the annotation
            file or from the image (:mod:`.dataset_deep`). Default: False.

    Returns:
        list[DatasetReport]: one per dataset (a test set equal to the val set once).
    """
    import importlib

    from mmengine.registry import init_default_scope
    scope = cfg.get('default_scope')
    if scope:
        init_default_scope(scope)
    registry = importlib.import_module(f'{scope}.registry' if scope else 'mmengine.registry')
    registry = registry.DATASETS
    reports, done = [], []
    for split in splits:
        loader = cfg.get(f'{split}_dataloader')
        if not loader or not loader.get('dataset'):
            continue
        for name, ds_cfg, pipelines in _innermost(loader['dataset'], f'{split}_dataloader.dataset'):
            key = json.dumps(ds_cfg, sort_keys=True, default=str)
            if key in done:
                continue
            done.append(key)
            report = DatasetReport(name)
            ds_type = ds_cfg.get('type')
            cls = registry.get(ds_type) if isinstance(ds_type, str) else ds_type
            ds_cfg = _plain(ds_cfg)
            start = time.perf_counter()
            # millions of short-lived objects without cycles (a COCO file): the cyclic
            # garbage collector would spend most of the time walking them
            collecting = gc.isenabled()
            gc.disable()
            try:
                if scope == 'mmdet' and _is_coco_panoptic(cls):
                    from .dataset_panoptic import check_coco_panoptic
                    check_coco_panoptic(
                        report, ds_cfg, cls, split == 'train', seg_sample=seg_sample, deep=deep)
                elif scope == 'mmdet' and cls is not None and _is_coco(cls) and str(
                        ds_cfg.get('ann_file', '')).endswith('.json'):
                    check_coco(report, ds_cfg, cls, pipelines, training=split == 'train', deep=deep)
                elif scope == 'mmseg' and cls is not None and _is_seg(cls):
                    check_segmentation(
                        report, ds_cfg, cls, seg_sample, training=split == 'train', deep=deep)
                else:
                    check_other(report, ds_cfg)
            finally:
                if collecting:
                    gc.enable()
            report.seconds = time.perf_counter() - start
            reports.append(report)
    return reports


def _plain(node):
    """A config node as plain dicts and lists (ConfigDict lookups are slow)."""
    if isinstance(node, dict):
        return {k: _plain(v) for k, v in node.items()}
    if isinstance(node, (list, tuple)):
        return type(node)(_plain(v) for v in node) if isinstance(node, list) else tuple(
            _plain(v) for v in node)
    return node


def _is_coco(cls) -> bool:
    from mmdet.datasets import CocoDataset
    return isinstance(cls, type) and issubclass(cls, CocoDataset)


def _is_coco_panoptic(cls) -> bool:
    """Whether mmdet reads the dataset as COCO-panoptic (its ``COCOPanoptic`` API)."""
    from mmdet.datasets import CocoPanopticDataset
    from mmdet.datasets.api_wrappers import COCOPanoptic
    return isinstance(cls, type) and (issubclass(cls, CocoPanopticDataset) or isinstance(
        getattr(cls, 'COCOAPI', None), type) and issubclass(cls.COCOAPI, COCOPanoptic))


def _is_seg(cls) -> bool:
    from mmseg.datasets import BaseSegDataset
    return isinstance(cls, type) and issubclass(cls, BaseSegDataset)


def format_reports(reports: Sequence[DatasetReport], title: str = '') -> str:
    """The reports as text (a title line first when given)."""
    errors = sum(len(r.errors) for r in reports)
    head = [title] if title else []
    head.append(f'dataset check: {len(reports)} datasets, '
                f'{errors} problem{"s" if errors != 1 else ""} that would stop training')
    return '\n'.join(head + [r.format() for r in reports])


def check_before_training(cfg,
                          seg_sample: Optional[int] = 64,
                          verbose: bool = True,
                          deep: Optional[bool] = None) -> List[DatasetReport]:
    """Run :func:`check_datasets` on the datasets training uses (train and val) for
    ``tools/train.py``: print the report (on rank 0 of a distributed launch) and raise
    :class:`DatasetCheckError` on errors.

    Args:
        cfg (Config): the training config.
        seg_sample (int, optional): as for :func:`check_datasets`. Default: 64.
        verbose (bool): print the report when there is no error. Default: True.
        deep (bool, optional): as for :func:`check_datasets`. Default: None, which
            reads the config key ``deep_dataset_check`` (False when absent).

    Returns:
        list[DatasetReport]: the reports.
    """
    if deep is None:
        deep = bool(cfg.get('deep_dataset_check', False))
    reports = check_datasets(cfg, seg_sample=seg_sample, splits=('train', 'val'), deep=deep)
    text = format_reports(reports)
    if any(r.errors for r in reports):
        raise DatasetCheckError(
            f'{text}\nThe dataset problems above would stop training; fix them, or skip '
            'this check with --skip-dataset-check (config: skip_dataset_check = True).')
    if verbose and os.environ.get('RANK', '0') == '0':
        print(text, flush=True)
    return reports


__all__ = [
    'DatasetCheckError', 'DatasetReport', 'check_datasets', 'check_before_training', 'check_coco',
    'check_segmentation', 'format_reports'
]
