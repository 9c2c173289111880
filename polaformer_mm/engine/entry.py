"""What ``tools/train.py`` and ``tools/test.py`` do, as functions (tests call them too).

Both take any config of the project (mmdet, mmseg or mmpretrain, told apart by the
config's ``default_scope``) and run it with :class:`~.runner.PolaRunner`.
"""
import argparse
import copy
import datetime
import json
import os
import os.path as osp
import re
import sys
from typing import Callable, Optional

import torch
from mmengine.config import Config, ConfigDict, DictAction

from ..utils.checkpoint_io import CheckpointError, require_checkpoint
from .checkpoint_fit import CheckpointMismatchError
from .dataset_check import DatasetCheckError
from .divergence import TrainingDivergedError
from .image_check import ImageError
from .model_check import ModelConfigError
from .panoptic_api import require_panopticapi
from .work_dir_lock import WorkDirLockedError

TASKS = ('mmdet', 'mmseg', 'mmpretrain')

#: Errors that name a problem of the user's input (a checkpoint that is no checkpoint or
#: does not fit, parts of a model config that do not fit together, a work dir in use by
#: another run, a training that diverged): the tools print their message and exit,
#: without a traceback.
USER_ERRORS = (CheckpointError, CheckpointMismatchError, ModelConfigError, WorkDirLockedError,
               TrainingDivergedError, ImageError)


def user_message(err: BaseException) -> str:
    """The message of a named error; for one raised in a DataLoader worker (which torch
    re-raises with the worker's traceback as its text) the worker's own message."""
    text = str(err)
    if 'Original Traceback' in text:
        last = text.strip().splitlines()[-1]
        prefix = f'{type(err).__name__}: '
        text = last[len(prefix):] if last.startswith(prefix) else last
    return text


def task_of(cfg: Config) -> str:
    """The config's ``default_scope`` (mmdet, mmseg or mmpretrain); a named error
    otherwise."""
    scope = cfg.get('default_scope')
    if scope not in TASKS:
        raise ValueError(f'config default_scope={scope!r}: expected one of {TASKS} '
                         '(inherit a mmdet::, mmseg:: or mmpretrain:: base config)')
    return scope


def load_config(path: str, cfg_options: Optional[dict] = None) -> Config:
    """Read a config file, apply ``--cfg-options`` and check its scope."""
    if not osp.isfile(path):
        raise FileNotFoundError(f'config file not found: {path}')
    cfg = Config.fromfile(path)
    if cfg_options:
        cfg.merge_from_dict(cfg_options)
    task_of(cfg)
    return cfg


def tool_parser(description: str) -> argparse.ArgumentParser:
    """The argument parser of a tool, with the ``config`` argument every tool takes first."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument('config', help='config file (mmdet, mmseg or mmpretrain)')
    return parser


def add_cfg_options(parser: argparse.ArgumentParser, help: str = 'override config keys') -> None:
    """``--cfg-options k=v ...``: keys of the config to override (:func:`load_config`)."""
    parser.add_argument('--cfg-options', nargs='+', action=DictAction, help=help)


def add_run_arguments(parser: argparse.ArgumentParser) -> None:
    """The options ``tools/train.py`` and ``tools/test.py`` share after their own:
    ``--allow-partial``, ``--launcher`` and ``--local-rank`` (older launchers)."""
    parser.add_argument(
        '--allow-partial',
        action='store_true',
        help='load a checkpoint that does not fit the model (only what fits; '
        'the log names the rest); default: such a checkpoint is an error. '
        'Config key: allow_partial_load')
    parser.add_argument('--launcher', choices=['none', 'pytorch', 'slurm', 'mpi'], default='none')
    parser.add_argument('--local_rank', '--local-rank', type=int, default=None)


def tool_config(args: argparse.Namespace) -> Config:
    """The config of a tool's command line (``config``, ``--cfg-options``), read after
    ``--local-rank`` is exported (:func:`setup_local_rank`)."""
    setup_local_rank(args.local_rank)
    return load_config(args.config, args.cfg_options)


def run(cfg: Config, action: Callable):
    """Build the runner of ``cfg``, return ``action(runner)`` and leave a distributed run
    cleanly (:func:`finish`), whether or not the action succeeded."""
    succeeded = False
    try:
        result = action(build_runner(cfg))
        succeeded = True
        return result
    finally:
        finish(succeeded)


#: set to 1 to see the traceback of the errors :func:`run_tool` prints as one message
TRACEBACK_ENV = 'POLAFORMER_MM_TRACEBACK'
_PROJECT_DIRS = tuple(
    osp.join(osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__)))), d) + os.sep
    for d in ('polaformer_mm', 'tools'))
# mmengine's registry re-raises an error of a class it builds as
# "class `Name` in package/module.py: message", once per level of nesting
_BUILD_ERROR = re.compile(r'class `(\w+)` in (polaformer_mm/[\w/]+)\.py: ')


def _frames(err: BaseException) -> list:
    """The frames of ``err``'s traceback, innermost first."""
    frames, tb = [], err.__traceback__
    while tb is not None:
        frames.append(tb.tb_frame)
        tb = tb.tb_next
    return frames[::-1]


def _project_class(frames: list) -> Optional[type]:
    """The class of the project whose construction raised: the innermost ``__init__`` of
    a project object, or the class mmengine's registry was calling when the call itself
    failed (a misspelt argument)."""

    def ours(cls):
        return isinstance(cls, type) and cls.__module__.startswith('polaformer_mm.')

    if frames and ours(frames[0].f_locals.get('obj_cls')):
        return frames[0].f_locals['obj_cls']
    for frame in frames:
        if frame.f_code.co_name == '__init__' and ours(type(frame.f_locals.get('self'))):
            return type(frame.f_locals['self'])
    return None


def named_error_message(err: BaseException) -> Optional[str]:
    """The one-line message of an error that names a problem of the input, None for
    any other error (which keeps its traceback): the :data:`USER_ERRORS`, the argument
    errors of the project's classes (backbones: prefixed with the class and config key),
    and the ``ValueError`` / ``TypeError`` / ``KeyError`` / ``RuntimeError`` /
    ``FileNotFoundError`` that the project's own code (package and tools) raises."""
    if isinstance(err, USER_ERRORS):
        return user_message(err)
    if not isinstance(err, (ValueError, TypeError, KeyError, RuntimeError, FileNotFoundError)):
        return None
    text = str(err.args[0]) if isinstance(err, KeyError) and err.args else str(err)
    found = list(_BUILD_ERROR.finditer(text))
    if found:  # mmengine's registry named the class: its own message after the prefixes
        text = text[found[-1].end():]
    frames = _frames(err)
    cls = _project_class(frames)
    if cls is not None:
        from ..models.backbones.base import PolaBackboneBase
        key = ' (model.backbone)' if issubclass(cls, PolaBackboneBase) else ''
        return f'{cls.__name__}{key}: {text}'
    if found or (frames and osp.abspath(frames[0].f_code.co_filename).startswith(_PROJECT_DIRS)):
        return text
    return None


def run_tool(main: Callable, prog: str) -> None:
    """Run a tool's ``main()`` as a command: a dataset-check report or an error that
    names a problem of the input (:func:`named_error_message`) ends it with that message
    (``prog: error: ...``) and no traceback; ``POLAFORMER_MM_TRACEBACK=1`` shows the
    traceback too."""
    try:
        main()
    except DatasetCheckError as err:  # the report, without a traceback
        sys.exit(str(err))
    except Exception as err:
        message = named_error_message(err)
        if message is None or os.environ.get(TRACEBACK_ENV) == '1':
            raise
        sys.exit(f'{prog}: error: {message}')


def _common(cfg: Config,
            config_path: str,
            work_dir: Optional[str],
            launcher: str,
            allow_partial: bool = False) -> None:
    cfg.launcher = launcher
    if allow_partial:
        cfg.allow_partial_load = True
    if work_dir is not None:
        cfg.work_dir = work_dir
    elif cfg.get('work_dir') is None:
        cfg.work_dir = osp.join('./work_dirs', osp.splitext(osp.basename(config_path))[0])
    cfg.setdefault('runner_type', 'PolaRunner')


def prepare_train_config(cfg: Config,
                         config_path: str,
                         work_dir: Optional[str] = None,
                         resume=None,
                         amp: bool = False,
                         auto_scale_lr: bool = False,
                         launcher: str = 'none',
                         allow_partial: bool = False) -> Config:
    """Apply the command-line choices of ``tools/train.py`` to ``cfg``.

    ``resume``: None (no resume), 'auto' (latest checkpoint of the work dir, if any) or a
    checkpoint path. ``allow_partial``: ``load_from`` / ``--resume`` load only what fits
    (``allow_partial_load=True``) instead of stopping on a checkpoint that does not fit.
    """
    _common(cfg, config_path, work_dir, launcher, allow_partial)
    require_panopticapi(cfg, ('train', 'val'), what='training with this config')
    if amp:
        if not torch.cuda.is_available():
            raise RuntimeError('--amp needs a CUDA device (mmengine AmpOptimWrapper)')
        opt_type = cfg.optim_wrapper.get('type', 'OptimWrapper')
        if opt_type == 'OptimWrapper':
            cfg.optim_wrapper.type = 'AmpOptimWrapper'
            cfg.optim_wrapper.setdefault('loss_scale', 'dynamic')
        elif opt_type != 'AmpOptimWrapper':
            raise ValueError(f'--amp with optim_wrapper.type={opt_type!r}: only '
                             'OptimWrapper can be switched to AmpOptimWrapper')
    if auto_scale_lr:
        if 'auto_scale_lr' not in cfg or 'base_batch_size' not in cfg.auto_scale_lr:
            raise KeyError('--auto-scale-lr: the config has no auto_scale_lr.base_batch_size')
        cfg.auto_scale_lr.enable = True
    if resume == 'auto':
        cfg.resume = True
        cfg.load_from = None
    elif resume is not None:
        require_checkpoint(resume, '--resume checkpoint')
        cfg.resume = True
        cfg.load_from = resume
    return cfg


def prepare_test_config(cfg: Config,
                        config_path: str,
                        checkpoint: str,
                        work_dir: Optional[str] = None,
                        out: Optional[str] = None,
                        show: bool = False,
                        show_dir: Optional[str] = None,
                        wait_time: float = 2.,
                        launcher: str = 'none',
                        tta: bool = False,
                        allow_partial: bool = False) -> Config:
    """Apply the command-line choices of ``tools/test.py`` to ``cfg``.

    ``tta``: test with the config's ``tta_model`` / ``tta_pipeline`` (see
    :func:`enable_tta`). ``allow_partial``: load a checkpoint that does not fit the
    model (see :mod:`.checkpoint_fit`).
    """
    require_panopticapi(cfg, ('test', ), what='testing with this config')
    require_checkpoint(checkpoint, 'checkpoint file')
    _common(cfg, config_path, work_dir, launcher, allow_partial)
    cfg.load_from = checkpoint
    task = task_of(cfg)
    if tta:
        enable_tta(cfg, task)
    if show or show_dir:
        _enable_visualization(cfg, task, show, show_dir, wait_time)
    if out is not None:
        _dump_results(cfg, task, out)
    return cfg


def _enable_visualization(cfg, task, show, show_dir, wait_time):
    hooks = cfg.get('default_hooks', {})
    vis = hooks.get('visualization')
    if vis is None:
        raise KeyError('--show/--show-dir need default_hooks.visualization in the config')
    if task == 'mmdet':
        vis.update(draw=True, show=show, wait_time=wait_time)
        if show_dir:
            vis.test_out_dir = show_dir
    elif task == 'mmseg':  # its hook draws every `interval`-th image (50 by default)
        vis.update(draw=True, show=show, wait_time=wait_time, interval=1)
        if show_dir:
            cfg.visualizer.save_dir = show_dir
    else:
        vis.update(enable=True, show=show, wait_time=wait_time, interval=1)
        if show_dir:
            vis.out_dir = show_dir


def _dump_results(cfg, task, out):
    if task == 'mmseg':
        # mmseg writes one prediction PNG per image into a folder
        cfg.test_evaluator = dict(cfg.test_evaluator, output_dir=out, keep_results=True)
        return
    if not out.endswith(('.pkl', '.pickle')):
        raise ValueError(f'--out {out!r}: the results file must be a .pkl/.pickle')
    dump = dict(type='DumpDetResults' if task == 'mmdet' else 'DumpResults', out_file_path=out)
    evaluators = cfg.test_evaluator
    if isinstance(evaluators, (list, tuple)):
        cfg.test_evaluator = list(evaluators) + [dump]
    else:
        cfg.test_evaluator = [evaluators, dump]


def build_runner(cfg: Config):
    """Build the runner named by ``cfg.runner_type`` in the config's scope."""
    from mmengine.registry import RUNNERS
    return RUNNERS.build(cfg)


def finish(succeeded: bool = True) -> None:
    """Leave a distributed run cleanly: after a successful run every rank waits for the
    others (rank 0 may still be writing the last checkpoint) before the group is torn
    down, so no rank exits while a peer still talks to it."""
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        if succeeded:
            torch.distributed.barrier()
        torch.distributed.destroy_process_group()


def setup_local_rank(local_rank: Optional[int]) -> None:
    """Export ``--local-rank`` (older launchers) as ``LOCAL_RANK`` for mmengine."""
    if 'LOCAL_RANK' not in os.environ and local_rank is not None:
        os.environ['LOCAL_RANK'] = str(local_rank)


# mmdet's test tool uses these when a config defines no tta_model / tta_pipeline
_DET_TTA_MODEL = dict(
    type='DetTTAModel', tta_cfg=dict(nms=dict(type='nms', iou_threshold=0.5), max_per_img=100))
_DET_META_KEYS = ('img_id', 'img_path', 'ori_shape', 'img_shape', 'scale_factor', 'flip',
                  'flip_direction')


def _innermost_dataset(dataset):
    while 'dataset' in dataset:  # RepeatDataset, ClassBalancedDataset, ...
        dataset = dataset['dataset']
    return dataset


def enable_tta(cfg: Config, task: str) -> Config:
    """Switch a test config to test-time augmentation, as mmdet's and mmseg's own
    ``tools/test.py --tta`` do: the test dataset reads ``cfg.tta_pipeline`` and the model
    becomes ``cfg.tta_model`` wrapping ``cfg.model``.

    Segmentation configs must define both (mmseg's ``default_runtime.py`` and dataset
    configs do: multi-scale + flip). Detection configs without them get mmdet's test-tool
    defaults: ``DetTTAModel`` (NMS 0.5, 100 boxes) and a horizontal-flip pipeline built
    from the test pipeline. ``DetTTAModel`` merges boxes only and rejects masks, so
    detectors with a mask head (Mask R-CNN) raise ValueError.

    Args:
        cfg: the test config, changed in place.
        task: ``'mmdet'`` or ``'mmseg'`` (:func:`task_of`).

    Returns:
        The same config.
    """
    if task not in ('mmdet', 'mmseg'):
        raise ValueError(f'--tta: detection (mmdet) and segmentation (mmseg) configs only, '
                         f'not {task}')
    dataset = _innermost_dataset(cfg.test_dataloader.dataset)
    if task == 'mmseg':
        missing = [key for key in ('tta_model', 'tta_pipeline') if key not in cfg]
        if missing:
            raise KeyError(f'--tta: the config defines no {" and no ".join(missing)} '
                           "(mmseg's base configs do: tta_model in default_runtime.py, "
                           'tta_pipeline in the dataset config)')
    else:
        if 'tta_model' not in cfg:
            cfg.tta_model = copy.deepcopy(_DET_TTA_MODEL)
        if 'tta_pipeline' not in cfg:
            cfg.tta_pipeline = _det_flip_pipeline(dataset.pipeline)
        if str(cfg.tta_model.get('type', '')).split('.')[-1] == 'DetTTAModel':
            _check_boxes_only(cfg)
    dataset.pipeline = copy.deepcopy(cfg.tta_pipeline)
    cfg.model = ConfigDict(**cfg.tta_model, module=cfg.model)
    return cfg


def _det_flip_pipeline(test_pipeline):
    """The test pipeline with its final PackDetInputs replaced by an original + flipped
    pair of views (mmdet's test-tool default)."""
    pipeline = copy.deepcopy(list(test_pipeline))
    pack = pipeline[-1] if pipeline else {}
    if str(pack.get('type', '')).split('.')[-1] != 'PackDetInputs':
        raise ValueError('--tta: the test pipeline must end with PackDetInputs to build a '
                         f'flip tta_pipeline (it ends with {pack.get("type")!r}); define '
                         'tta_pipeline in the config')
    keys = tuple(pack.get('meta_keys', _DET_META_KEYS))
    keys += tuple(k for k in ('flip', 'flip_direction') if k not in keys)
    pipeline[-1] = dict(
        type='TestTimeAug',
        transforms=[[dict(type='RandomFlip', prob=1.),
                     dict(type='RandomFlip', prob=0.)], [dict(pack, meta_keys=keys)]])
    return pipeline


def _check_boxes_only(cfg):
    """mmdet's DetTTAModel (3.3) merges boxes and asserts that no view carries masks."""
    if _has_key(cfg.model, 'mask_head'):
        raise ValueError(
            "--tta: mmdet's DetTTAModel merges boxes only and rejects instance masks, so "
            'a detector with a mask head (Mask R-CNN) cannot be tested with --tta; '
            'box detectors (RetinaNet) can')


def _has_key(node, key):
    if isinstance(node, dict):
        return any((k == key and v is not None) or _has_key(v, key) for k, v in node.items())
    if isinstance(node, (list, tuple)):
        return any(_has_key(v, key) for v in node)
    return False


TEST_METRICS_FILE = 'test_metrics.json'


def save_test_metrics(cfg: Config,
                      config_path: str,
                      checkpoint: str,
                      metrics: dict,
                      tta: bool = False,
                      cfg_options: Optional[dict] = None) -> Optional[str]:
    """Write what ``tools/test.py`` measured to ``<work_dir>/test_metrics.json``
    (main process only), the file ``tools/analysis_tools/gain_table.py`` reads.

    Args:
        cfg: the test config (its ``work_dir`` is used).
        config_path: the config file that was tested.
        checkpoint: the checkpoint that was tested.
        metrics: what ``runner.test()`` returned.
        tta: whether the test used test-time augmentation.
        cfg_options: the ``--cfg-options`` of the test, recorded as given.

    Returns:
        The path written, or None on the other processes.
    """
    from mmengine.dist import is_main_process
    if not is_main_process():
        return None
    record = dict(
        config=osp.abspath(config_path),
        checkpoint=osp.abspath(checkpoint) if osp.exists(checkpoint) else checkpoint,
        tta=bool(tta),
        cfg_options=cfg_options or {},
        time=datetime.datetime.now().isoformat(timespec='seconds'),
        metrics={
            k: (float(v) if isinstance(v, (int, float)) or hasattr(v, 'item') else v)
            for k, v in (metrics or {}).items()
        })
    os.makedirs(cfg.work_dir, exist_ok=True)
    path = osp.join(cfg.work_dir, TEST_METRICS_FILE)
    with open(path, 'w') as f:
        json.dump(record, f, indent=2, default=str)
    return path
