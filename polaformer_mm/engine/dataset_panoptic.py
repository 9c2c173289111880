"""The dataset check of COCO-panoptic datasets (mmdet's ``CocoPanopticDataset``).

A COCO-panoptic annotation file is not a COCO instances file: each entry of
``annotations`` is one image (``image_id``, ``file_name``, ``segments_info``), and the
segments inside ``segments_info`` carry ``id`` / ``category_id`` / ``bbox`` / ``area`` /
``iscrowd``; categories carry ``isthing``. mmdet's ``COCOPanoptic`` indexes the segments
and ``CocoPanopticDataset`` reads them as this module does, so :func:`check_coco_panoptic`
reports what would stop mmdet (a ``KeyError`` for a missing field or for a segment of a
category outside the dataset's classes, a missing PNG segment map), what it would
silently leave out (images without a segment, degenerate segments) and a training set
that ``filter_cfg`` leaves empty; in a sample of the PNG maps (``seg_sample``) also
segments that no pixel of the map carries. Segment ids are decoded as panopticapi's
``rgb2id`` does (``R + 256 G + 256^2 B``).
"""
import json
import os.path as osp
from collections import Counter
from typing import Optional, Sequence

from .dataset_report import (FolderListing, check_image_entries, check_image_files, config_classes,
                             is_hashable, is_remote, join_path)

_SEGMENT_KEYS = ('id', 'category_id', 'bbox', 'area')


def _seg_map_name(file_name: str) -> str:
    """The PNG that mmdet reads for an image (``CocoPanopticDataset.parse_data_info``)."""
    return file_name.replace('.jpg', '.png')


def _load(report, ds_cfg: dict) -> Optional[tuple]:
    """(annotation file, images, annotations, categories), or None (the error in
    ``report``)."""
    ann_file = join_path(ds_cfg.get('data_root'), ds_cfg.get('ann_file'))
    report.summary = f'{ds_cfg.get("type")}, {ann_file}'
    if not osp.isfile(ann_file):
        report.add('error', f'annotation file not found: {ann_file}')
        return None
    try:
        with open(ann_file, 'rb') as f:
            data = json.loads(f.read())
    except (ValueError, UnicodeDecodeError) as err:
        report.add('error', f'annotation file is not valid JSON ({err})')
        return None
    if not isinstance(data, dict):
        report.add(
            'error', 'annotation file is not a COCO-panoptic file (the top level is '
            'not a JSON object)')
        return None
    return (ann_file, data.get('images') or [], data.get('annotations')
            or [], [c for c in data.get('categories') or [] if isinstance(c, dict)])


def _categories(report, cats: list, classes: Optional[list]) -> tuple:
    """(category id -> category, ids of the config's classes)."""
    no_isthing = [c.get('name', c.get('id')) for c in cats if 'isthing' not in c]
    by_id = {c.get('id'): c for c in cats if is_hashable(c.get('id'))}
    if no_isthing:
        report.add(
            'error', "categories without 'isthing' (mmdet stops with KeyError: 'isthing'; "
            'is this a COCO instances file? CocoPanopticDataset reads panoptic_*.json)', no_isthing)
    names = list(c.get('name') for c in cats) if classes is None else classes
    wanted = set(names)
    return by_id, {c.get('id') for c in cats if c.get('name') in wanted}, names


class _PanopticScan:
    """One pass over the per-image annotations, as mmdet's ``COCOPanoptic`` indexes them
    and ``CocoPanopticDataset.parse_data_info`` reads them."""

    def __init__(self, images: list, by_id: dict, class_ids: set) -> None:
        self.images = {im['id']: im for im in images}
        self.by_id, self.class_ids = by_id, class_ids
        self.no_segments, self.no_image_id, self.orphans = [], [], []
        self.no_key = {k: [] for k in _SEGMENT_KEYS}
        self.bad_box, self.outside, self.degenerate, self.twice = [], [], [], []
        self.segments = {}  # image id -> [segment]
        self.things, self.seen = set(), Counter()

    def scan(self, anns: Sequence) -> None:
        """Index every annotation entry and check its segments."""
        for ann in anns:
            if not isinstance(ann, dict) or 'image_id' not in ann:
                self.no_image_id.append(_name(ann))
                continue
            if not isinstance(ann.get('segments_info'), list):
                self.no_segments.append(_name(ann))
                continue
            img_id = ann['image_id']
            try:
                img = self.images.get(img_id)
            except TypeError:
                img = None
            if img is None:
                self.orphans.append(img_id)
                continue
            self._segments(img, ann['segments_info'])

    def _segments(self, img: dict, segments: list) -> None:
        where = img.get('file_name')
        ids = Counter(s.get('id') for s in segments if isinstance(s, dict))
        self.twice += [f'{where} (segment {i})' for i, n in ids.items() if n > 1]
        kept = self.segments.setdefault(img['id'], [])
        for seg in segments:
            seg = seg if isinstance(seg, dict) else {}
            missing = [k for k in _SEGMENT_KEYS if k not in seg]
            if missing:
                self.no_key[missing[0]].append(f'{where} (segment {seg.get("id", "?")})')
                continue
            try:
                _, _, w, h = seg['bbox']
                degenerate = seg['area'] <= 0 or w < 1 or h < 1
            except (TypeError, ValueError):
                self.bad_box.append(f'{where} (segment {seg["id"]}) {seg["bbox"]!r}')
                continue
            if degenerate:  # mmdet skips the segment
                self.degenerate.append(f'{where} (segment {seg["id"]})')
                continue
            cat_id = seg['category_id']
            if cat_id not in self.class_ids:
                self.outside.append(f'{where} (segment {seg["id"]}, category_id {cat_id!r})')
                continue
            kept.append(seg)
            self.seen[cat_id] += 1
            if self.by_id.get(cat_id, {}).get('isthing') and not seg.get('iscrowd'):
                self.things.add(img['id'])

    def report(self, report, names: list) -> None:
        """Add the findings to ``report``."""
        if self.no_image_id:
            report.add(
                'error', "annotation entries without 'image_id' (mmdet stops with "
                "KeyError: 'image_id')", self.no_image_id)
        if self.no_segments:
            report.add(
                'error', "annotation entries without a 'segments_info' list (mmdet stops "
                "with KeyError: 'segments_info'; is this a COCO instances file? "
                'CocoPanopticDataset reads panoptic_*.json)', self.no_segments)
        for key, where in self.no_key.items():
            if where:
                report.add('error', f"segments without '{key}' (mmdet stops with KeyError: "
                           f"'{key}')", where)
        if self.bad_box:
            report.add(
                'error', 'segment bboxes that are not 4 numbers [x, y, w, h] (mmdet '
                'stops with a TypeError or ValueError)', self.bad_box)
        if self.outside:
            report.add(
                'error', "segments whose category is not among the config's classes or the "
                "file's categories (CocoPanopticDataset stops with a KeyError: it maps every "
                'segment to a class)', self.outside)
        if self.twice:
            report.add('warning', 'segment ids used twice in one image (their masks are the '
                       'same pixels)', self.twice)
        if self.degenerate:
            report.add('warning', 'degenerate segments (area <= 0 or bbox w or h < 1; mmdet '
                       'skips them)', self.degenerate)
        if self.orphans:
            report.add('warning', 'annotation entries of image ids the file does not list',
                       self.orphans)
        no_ann = [im.get('file_name') for i, im in self.images.items() if not self.segments.get(i)]
        if no_ann:
            report.add('warning', 'images without a segment', no_ann)
        name_to_id = {c.get('name'): i for i, c in self.by_id.items()}
        never = [n for n in names if not self.seen[name_to_id.get(n)]]
        if never:
            report.add('warning', 'classes never seen', never)


def _min_side(img: dict):
    sides = [img.get(k, 0) for k in ('width', 'height')]
    return min(sides) if all(type(v) in (int, float) for v in sides) else -1


def _name(ann) -> str:
    return str(ann.get('file_name', ann.get('image_id', '?'))) if isinstance(ann, dict) else '?'


def _check_seg_maps(report, ds_cfg: dict, scan: _PanopticScan, seg_sample: Optional[int]):
    """The PNG segment maps: missing ones (error); in a sample, segments no pixel carries
    (warning) and maps that do not decode (error)."""
    import cv2
    import numpy as np

    seg_dir = join_path(ds_cfg.get('data_root'), (ds_cfg.get('data_prefix') or {}).get('seg'))
    listing = FolderListing()
    files = [(i, _seg_map_name(str(im.get('file_name')))) for i, im in scan.images.items()]
    missing = [f for _, f in files if not listing.exists(osp.join(seg_dir, f))]
    if missing:
        report.add(
            'error', f'images without a PNG segment map (under {seg_dir}; mmdet stops '
            'with FileNotFoundError)', missing)
    present = [(i, f) for i, f in files if f not in set(missing)]
    if seg_sample is not None and len(present) > seg_sample:
        step = len(present) / seg_sample
        present = [present[int(k * step)] for k in range(seg_sample)]
    unreadable, absent = [], []
    for img_id, name in present:
        png = cv2.imread(osp.join(seg_dir, name), cv2.IMREAD_COLOR)
        if png is None:
            unreadable.append(name)
            continue
        rgb = png[..., ::-1].astype(np.int64)
        ids = set(np.unique(rgb[..., 0] + 256 * rgb[..., 1] + 65536 * rgb[..., 2]).tolist())
        absent += [
            f'{name} (segment {s["id"]})' for s in scan.segments.get(img_id, [])
            if s['id'] not in ids
        ]
    if unreadable:
        report.add('error', 'PNG segment maps that do not decode', unreadable)
    if absent:
        report.add('warning', 'segments that no pixel of the PNG map carries (empty masks)', absent)


def check_coco_panoptic(report,
                        ds_cfg: dict,
                        cls,
                        training: bool,
                        seg_sample: Optional[int] = 64,
                        deep: bool = False) -> None:
    """Fill ``report`` (a :class:`~.dataset_report.DatasetReport`) for a COCO-panoptic
    dataset (see the module notes; ``deep``: also open every image's header)."""
    loaded = _load(report, ds_cfg)
    if loaded is None:
        return
    ann_file, images, anns, cats = loaded
    by_id, class_ids, names = _categories(report, cats, config_classes(ds_cfg, cls))
    report.summary = (
        f'{ds_cfg.get("type")}, {ann_file}: {len(images)} images, '
        f'{sum(len(a.get("segments_info") or []) for a in anns if isinstance(a, dict))}'
        f' segments, {len(names)} classes')
    if not images:
        report.add('error', 'the file lists no images')
        return
    images = check_image_entries(report, images)
    check_image_files(report, ds_cfg, images)
    if deep and not is_remote(ds_cfg):
        from .dataset_deep import check_coco_images
        prefix = (ds_cfg.get('data_prefix') or {}).get('img', '')
        check_coco_images(report, join_path(ds_cfg.get('data_root'), prefix), images)
    scan = _PanopticScan(images, by_id, class_ids)
    scan.scan(anns)
    scan.report(report, names)
    if (ds_cfg.get('data_prefix') or {}).get('seg') and not is_remote(ds_cfg):
        _check_seg_maps(report, ds_cfg, scan, seg_sample)
    if training:
        _check_training_set(report, ds_cfg, scan)


def _check_training_set(report, ds_cfg: dict, scan: _PanopticScan) -> None:
    """A training set that ``filter_cfg`` leaves empty (mmdet keeps, with
    ``filter_empty_gt``, the images with a thing segment)."""
    filter_cfg = ds_cfg.get('filter_cfg') or {}
    min_size = filter_cfg.get('min_size', 0)
    kept = [
        i for i, im in scan.images.items()
        if (not filter_cfg.get('filter_empty_gt', False) or i in scan.things)
        and _min_side(im) >= min_size
    ]
    if not kept:
        report.add(
            'error', f'no training image is left after filter_cfg {dict(filter_cfg)} (no '
            'image has a thing segment of the classes, or every image is smaller than '
            'min_size); mmdet would stop with "need at least one array to concatenate"')


__all__ = ['check_coco_panoptic']
