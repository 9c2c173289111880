"""Workflows that run the project end to end, one module each, behind the command lines of
``tools/``: :mod:`~polaformer_mm.workflows.quickstart` (train, evaluate and draw on the
synthetic data), :mod:`~polaformer_mm.workflows.reproduce` (a Pola vs softmax comparison of
the paper, train to gain table) and :mod:`~polaformer_mm.workflows.gpu_check` (everything
the project does on CUDA, in one report).

The modules are imported by name (``from polaformer_mm.workflows import quickstart``), not
from here: each pulls in the OpenMMLab stack, and the quickstart's training jobs run its
module as ``python -m polaformer_mm.workflows.quickstart``.
"""
import os.path as osp

__all__ = ['project_root']


def project_root() -> str:
    """The folder holding the project's ``configs/`` and ``tools/``: the repository the
    package is imported from, or an installed package's ``.mim`` copy of them."""
    package = osp.dirname(osp.dirname(osp.abspath(__file__)))
    repo = osp.dirname(package)
    if osp.isdir(osp.join(repo, 'configs')) and osp.isdir(osp.join(repo, 'tools')):
        return repo
    return osp.join(package, '.mim')
