"""The written documentation stays true: the Theorem 1 counterexample of docs/method.md
computed with the project's own attention op, and every repository path and relative link
in the docs pointing at something that exists."""
import glob
import math
import os.path as osp
import re

import pytest
import torch

from polaformer_mm.ops import pola_linear_attention
from polaformer_mm.ops.pola_attention_naive import pola_linear_attention_reference

ROOT = osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__))))
DOCS = ['README.md', 'docs/method.md', 'configs/README.md'] + sorted(
    osp.relpath(p, ROOT) for p in glob.glob(osp.join(ROOT, 'configs', '*', 'README.md'))) + sorted(
        osp.relpath(p, ROOT) for p in glob.glob(osp.join(ROOT, 'docs', 'notes', '*.md')))


def _stream_weights(op, exponent):
    """Attention weights of one query x = (1, 1, 1) over k1 = (10, 10, 10) and
    k2 = (15, 1, 1), read off the same-signed stream with one-hot values."""
    dt = torch.float64
    q = torch.ones(1, 1, 1, 3, dtype=dt)
    k = torch.tensor([[10., 10., 10.], [15., 1., 1.]], dtype=dt).view(1, 1, 2, 3)
    v = torch.tensor([[1., 0., 0.], [0., 1., 0.]], dtype=dt).view(1, 1, 2, 3)
    if exponent == 1:  # p = 1 + alpha * sigmoid(-inf) = 1
        power, alpha = torch.full((1, 1, 1, 3), -math.inf, dtype=dt), 4.0
    else:  # p = 1 + 2 * sigmoid(0) = 2
        power, alpha = torch.zeros(1, 1, 1, 3, dtype=dt), 2.0
    out = op(q, k, v, power, alpha=alpha, eps=1e-30)  # eps must be > 0; negligible here
    return out[0, 0, 0, :2]  # the first ceil(3/2) channels: the same-signed stream


def _entropy(weights):
    return float(-(weights * weights.log()).sum())


@pytest.mark.parametrize('op', [pola_linear_attention, pola_linear_attention_reference])
def test_theorem1_counterexample_numbers(op):
    before, after = _stream_weights(op, 1), _stream_weights(op, 2)
    torch.testing.assert_close(before, torch.tensor([30 / 47, 17 / 47], dtype=before.dtype))
    torch.testing.assert_close(after, torch.tensor([300 / 527, 227 / 527], dtype=after.dtype))
    assert round(_entropy(before), 3) == 0.654
    assert round(_entropy(after), 3) == 0.684  # higher: the power flattened this map
    with open(osp.join(ROOT, 'docs', 'method.md')) as f:
        text = f.read()
    assert '0.6544' in text and '0.6835' in text


REPO_PATH = re.compile(r'`((?:configs|tools|polaformer_mm|tests|docs|requirements)/[^`\s]*)`')
LINK = re.compile(r'\]\((?!https?://|#)([^)\s]+)\)')


@pytest.mark.parametrize('doc', DOCS)
def test_paths_and_links_exist(doc):
    with open(osp.join(ROOT, doc)) as f:
        text = f.read()
    missing = []
    for path in REPO_PATH.findall(text):
        if any(c in path for c in '{*<') or '.mim' in path:
            continue  # a pattern, or what an install creates (polaformer_mm/.mim)
        if not osp.exists(osp.join(ROOT, path.rstrip('/.,:'))):
            missing.append(path)
    for link in LINK.findall(text):
        target = osp.normpath(osp.join(ROOT, osp.dirname(doc), link.split('#')[0]))
        if not osp.exists(target):
            missing.append(link)
    assert not missing, f'{doc} refers to missing files: {missing}'


MD_NAME = re.compile(r'[\w.-]+\.md\b')
# an absolute file-system path (not a URL, a ratio such as H/4, ~/ or {a,b}/x)
ABS_PATH = re.compile(r'(?<![\w.)/:<~}])/(?:[\w.-]+/)+')
UP_PATH = re.compile(r'(?<!\.)(?:\.\./)+[\w./-]*')


def test_no_reference_outside_the_repository():
    """The docs name only files the repository has (or its tools write): no other Markdown
    file, no absolute path, no relative path that leaves the repository."""
    repo_md = {
        osp.basename(p)
        for p in glob.glob(osp.join(ROOT, '**', '*.md'), recursive=True) if '.venv' not in p
    }
    for tool in glob.glob(osp.join(ROOT, 'tools', '**', '*.py'), recursive=True):
        with open(tool) as f:  # reports the tools write, e.g. benchmark_backbone.md
            repo_md.update(MD_NAME.findall(f.read()))
    for doc in DOCS:
        with open(osp.join(ROOT, doc)) as f:
            text = f.read()
        foreign = sorted(set(MD_NAME.findall(text)) - repo_md)
        assert not foreign, f'{doc} names Markdown files the repository lacks: {foreign}'
        absolute = ABS_PATH.findall(text)
        assert not absolute, f'{doc} names absolute paths: {absolute}'
        for path in UP_PATH.findall(text):
            target = osp.normpath(osp.join(ROOT, osp.dirname(doc), path))
            assert target.startswith(ROOT + osp.sep), f'{doc} points outside the repository: {path}'
