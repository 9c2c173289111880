"""Writes files in the official checkpoint format, yacs config included.

yacs is not installed in the test environment (the converter must not need it), so a
module ``yacs.config`` with a ``CfgNode`` shaped like yacs's own (a dict subclass with
``__immutable__``, ``__deprecated_keys__``, ``__renamed_keys__`` and ``__new_allowed__``
attributes) is put in ``sys.modules`` just while the file is pickled.
"""
import sys
import types

import torch


def _yacs_module():
    module = types.ModuleType('yacs.config')

    class CfgNode(dict):

        def __init__(self, init_dict=None, new_allowed=False):
            super().__init__(init_dict or {})
            self.__dict__['__immutable__'] = False
            self.__dict__['__deprecated_keys__'] = set()
            self.__dict__['__renamed_keys__'] = {}
            self.__dict__['__new_allowed__'] = new_allowed

    CfgNode.__module__ = 'yacs.config'
    CfgNode.__qualname__ = 'CfgNode'
    module.CfgNode = CfgNode
    return module


def save_official(path, state_dict, with_config=True):
    """Save like the official training code: {'model', 'optimizer', ...}."""
    config = module = None
    saved = {k: sys.modules.get(k) for k in ('yacs', 'yacs.config')}
    if with_config:
        module = _yacs_module()
        sys.modules['yacs'] = types.ModuleType('yacs')
        sys.modules['yacs.config'] = module
        cfg = module.CfgNode
        config = cfg({
            'MODEL': cfg({
                'TYPE': 'pola_pvt',
                'NAME': 'golden',
                'DROP_PATH_RATE': 0.1
            }),
            'TRAIN': cfg({
                'EPOCHS': 300,
                'BASE_LR': 5e-4
            }),
            'TAG': 'default'
        })
    try:
        torch.save(
            dict(
                model=state_dict,
                optimizer={
                    'state': {},
                    'param_groups': []
                },
                lr_scheduler={'last_epoch': 300},
                max_accuracy=81.9,
                epoch=299,
                config=config), path)
    finally:
        for k, v in saved.items():
            if v is None:
                sys.modules.pop(k, None)
            else:
                sys.modules[k] = v
    return path
