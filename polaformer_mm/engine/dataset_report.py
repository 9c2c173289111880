"""What the dataset checks of :mod:`.dataset_check` and :mod:`.dataset_panoptic` share:
the report of one dataset, the paths and file listing of its folders, and the checks of
COCO-style image entries and image files. It imports neither of them (both import it).
"""
import os
import os.path as osp
from collections import Counter
from typing import Dict, List, Optional, Sequence

SHOWN = 5  # file names shown per finding


class DatasetReport:
    """What :func:`~.dataset_check.check_datasets` found in one dataset.

    Args:
        name (str): where the dataset sits in the config, e.g.
            ``'train_dataloader.dataset'``.
        summary (str): one line: type, files, counts.
    """

    def __init__(self, name: str, summary: str = '') -> None:
        self.name = name
        self.summary = summary
        self.findings: List[tuple] = []  # (level, text)
        self.seconds = 0.0

    def add(self, level: str, text: str, items: Sequence = (), total: Optional[int] = None):
        """Record a finding: ``level`` 'error' / 'warning' / 'note', with the count and
        the first few of ``items``."""
        if items or total:
            count = len(items) if total is None else total
            shown = ', '.join(str(i) for i in list(items)[:SHOWN])
            more = ', ...' if count > SHOWN else ''
            text = f'{text}: {count}' + (f' ({shown}{more})' if shown else '')
        self.findings.append((level, text))

    @property
    def errors(self) -> List[str]:
        """The findings that stop a run."""
        return [text for level, text in self.findings if level == 'error']

    def format(self) -> str:
        """The report as printed: a summary line, then one line per finding."""
        lines = [f'{self.name}: {self.summary} [{self.seconds:.1f} s]']
        for level, text in self.findings:
            lines.append(f'  {level.upper() if level == "error" else level}: {text}')
        if not self.findings:
            lines.append('  ok')
        return '\n'.join(lines)


def join_path(root: Optional[str], path: Optional[str]) -> str:
    """``path`` under a dataset's ``data_root`` (as mmengine joins them), unless absolute."""
    path = path or ''
    if root and not osp.isabs(path):
        return osp.join(root, path)
    return path


class FolderListing:
    """File names per folder, each folder listed once."""

    def __init__(self) -> None:
        self._cache: Dict[str, Optional[set]] = {}

    def exists(self, path: str) -> bool:
        """Whether ``path`` is a file of its folder's listing."""
        folder, name = osp.split(path)
        if folder not in self._cache:
            try:
                self._cache[folder] = set(os.listdir(folder or '.'))
            except OSError:
                self._cache[folder] = None
        names = self._cache[folder]
        return names is not None and name in names


def config_classes(ds_cfg: dict, cls) -> Optional[list]:
    """The classes a dataset config names in its metainfo, else its type's, or None."""
    metainfo = ds_cfg.get('metainfo') or {}
    classes = metainfo.get('classes') or getattr(cls, 'METAINFO', {}).get('classes')
    return list(classes) if classes is not None else None


def is_remote(ds_cfg: dict) -> bool:
    """Whether the dataset's files are read through a remote file backend."""
    backend = (ds_cfg.get('backend_args') or {}).get('backend', 'local')
    return backend not in ('local', 'disk')


NUMBER = (int, float)  # compared with type(): a bool in a box is no coordinate


def is_hashable(value) -> bool:
    """Whether ``value`` can be a dict key or a set member (an annotation's id)."""
    try:
        hash(value)
    except TypeError:
        return False
    return True


def short(value, limit: int = 40) -> str:
    """``repr(value)``, cut to ``limit`` characters."""
    text = repr(value)
    return text if len(text) <= limit else text[:limit - 3] + '...'


def check_image_entries(report: DatasetReport, images: list) -> list:
    """The image entries' own findings; returns the entries pycocotools can index (a
    dict with a hashable ``id``)."""
    images = [im for im in images if isinstance(im, dict)]
    bad_entries = [
        im.get('id', im.get('file_name')) for im in images
        if not all(k in im for k in ('id', 'file_name', 'width', 'height'))
    ]
    if bad_entries:
        report.add(
            'error', "image entries without 'id', 'file_name', 'width' or 'height' "
            '(mmdet stops with a KeyError), image ids', bad_entries)
    images = [im for im in images if 'id' in im]
    unhashable = [short(im['id']) for im in images if not is_hashable(im['id'])]
    if unhashable:
        report.add(
            'error', 'image ids that are not numbers or strings (pycocotools indexes '
            'images by id: TypeError)', unhashable)
        images = [im for im in images if is_hashable(im['id'])]
    bad_size = [
        f"{im.get('file_name')} (id {im['id']})" for im in images if any(
            key in im and type(im[key]) not in NUMBER for key in ('width', 'height'))
    ]
    if bad_size:
        report.add('error', 'images whose width or height is not a number (mmdet stops with a '
                   'TypeError)', bad_size)
    counts = Counter(im['id'] for im in images)
    if len(counts) < len(images):
        files: Dict = {}
        for im in images:
            if counts[im['id']] > 1:
                files.setdefault(im['id'], []).append(str(im.get('file_name')))
        report.add(
            'error', 'image ids listed more than once (pycocotools keeps the last entry '
            'of an id: mmdet trains that file with the boxes of all its entries and never '
            'sees the other files), ids', [f"{i} ({', '.join(f)})" for i, f in files.items()])
    names = Counter(im.get('file_name') for im in images if 'file_name' in im)
    twice = [name for name, count in names.items() if count > 1]
    if twice:
        report.add(
            'warning', 'files listed more than once under different image ids (mmdet '
            'uses each entry: the file is seen once per entry)', twice)
    return images


def check_image_files(report: DatasetReport, ds_cfg: dict, images: list) -> None:
    """The image files missing on disk (each folder listed once; remote storage is not
    looked at)."""
    if is_remote(ds_cfg):
        report.add('note', 'images on remote storage: not looked for')
        return
    img_prefix = join_path(
        ds_cfg.get('data_root'), (ds_cfg.get('data_prefix') or {}).get('img', ''))
    listing = FolderListing()
    missing = [
        im['file_name'] for im in images
        if 'file_name' in im and not listing.exists(osp.join(img_prefix, im['file_name']))
    ]
    if missing:
        report.add('error', f'images missing on disk (under {img_prefix})', missing)
