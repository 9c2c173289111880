"""panopticapi, which mmdet's panoptic parts import, named before any work starts.

mmdet 3.3 imports the COCO panoptic API (``panopticapi``, not on PyPI) in three places
that the panoptic Mask2Former configs use:

* ``LoadPanopticAnnotations`` (the train / val / test pipelines) decodes the PNG segment
  maps with ``panopticapi.utils.rgb2id``; without panopticapi its constructor raises an
  ``ImportError`` when the dataset is built;
* ``CocoPanopticMetric`` (``val_evaluator`` / ``test_evaluator``) computes PQ with
  ``panopticapi.evaluation`` (``PQStat``, ``VOID``) and ``panopticapi.utils``;
* ``DetInferencer`` (``tools/demo/image_demo.py``) turns a panoptic prediction
  (``model.test_cfg.panoptic_on=True``) into a dict with ``panopticapi.evaluation.VOID``
  and ``panopticapi.utils.id2rgb``.

:func:`require_panopticapi` finds these in a config and, when panopticapi cannot be
imported, raises :class:`PanopticApiMissingError` naming the config keys and the command
that installs it (:data:`PANOPTICAPI_INSTALL`). ``tools/train.py`` (train and val),
``tools/test.py`` (test) and ``tools/demo/image_demo.py`` call it before building anything.
"""
import importlib
from typing import List, Sequence

#: the command that installs panopticapi (upstream's; the package is not on PyPI)
PANOPTICAPI_INSTALL = 'pip install git+https://github.com/cocodataset/panopticapi.git'

#: mmdet's registered types that import panopticapi, with what they use it for
PANOPTICAPI_TYPES = {
    'LoadPanopticAnnotations': 'panopticapi.utils.rgb2id, to decode the PNG segment maps',
    'CocoPanopticMetric': 'panopticapi.evaluation, to compute PQ',
}


class PanopticApiMissingError(RuntimeError):
    """A config needs panopticapi and it is not installed; the message names the config
    keys and the install command."""


def panopticapi_available() -> bool:
    """Whether mmdet's imports of panopticapi work (``panopticapi.utils`` and
    ``panopticapi.evaluation``)."""
    try:
        importlib.import_module('panopticapi.utils')
        importlib.import_module('panopticapi.evaluation')
    except ImportError:
        return False
    return True


def _type_name(value) -> str:
    name = getattr(value, '__name__', value)
    return str(name).rsplit('.', 1)[-1] if name is not None else ''


def _find(node, path: str, found: List[str]) -> None:
    """Append to ``found`` each ``path`` below ``node`` whose ``type`` imports panopticapi."""
    if isinstance(node, dict):
        name = _type_name(node.get('type'))
        if name in PANOPTICAPI_TYPES:
            found.append(f'{path} ({name}: {PANOPTICAPI_TYPES[name]})')
        for key, value in node.items():
            if isinstance(value, (dict, list, tuple)):
                _find(value, f'{path}.{key}', found)
    elif isinstance(node, (list, tuple)):
        for i, value in enumerate(node):
            _find(value, f'{path}[{i}]', found)


def panopticapi_keys(cfg,
                     splits: Sequence[str] = ('train', 'val', 'test'),
                     demo: bool = False) -> List[str]:
    """The config keys that need panopticapi: the pipeline steps and evaluators of the
    ``splits``' dataloaders and evaluators (val only where the config validates); with
    ``demo``, ``model.test_cfg.panoptic_on`` (mmdet's ``DetInferencer`` instead of the
    pipeline and evaluators, which the demo does not run)."""
    found: List[str] = []
    if demo:
        test_cfg = (cfg.get('model') or {}).get('test_cfg') or {}
        if isinstance(test_cfg, dict) and test_cfg.get('panoptic_on'):
            found.append('model.test_cfg.panoptic_on=True (mmdet DetInferencer: '
                         'panopticapi.utils.id2rgb and panopticapi.evaluation.VOID, to '
                         'return the panoptic prediction)')
        return found
    for split in splits:
        if split == 'val' and not cfg.get('val_cfg'):
            continue
        for key in (f'{split}_dataloader', f'{split}_evaluator'):
            node = cfg.get(key)
            if node:
                _find(node, key, found)
    return found


def require_panopticapi(cfg,
                        splits: Sequence[str] = ('train', 'val', 'test'),
                        demo: bool = False,
                        what: str = 'this config') -> None:
    """Raise :class:`PanopticApiMissingError` when ``cfg`` needs panopticapi (see
    :func:`panopticapi_keys`) and it cannot be imported; nothing otherwise."""
    keys = panopticapi_keys(cfg, splits, demo)
    if not keys or panopticapi_available():
        return
    raise PanopticApiMissingError(
        f'{what} needs panopticapi (the COCO panoptic API), which is not installed; '
        f'the config keys that need it: {"; ".join(keys)}. Install it with: '
        f'{PANOPTICAPI_INSTALL} (it is not on PyPI; see "Panoptic segmentation" in '
        'configs/pola_swin/README.md)')


__all__ = [
    'PANOPTICAPI_INSTALL', 'PANOPTICAPI_TYPES', 'PanopticApiMissingError', 'panopticapi_available',
    'panopticapi_keys', 'require_panopticapi'
]
