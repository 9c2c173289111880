"""The written documentation stays true: the Theorem 1 counterexample of
docs/advanced_guides/method.md computed with the project's own attention op; every relative
link (with its #anchor) and every repository path or module the docs name pointing at
something that exists; every page of docs/ reachable from README.md or docs/index.md; the
docs paths the code names existing; and README.md short."""
import collections
import glob
import importlib
import math
import os.path as osp
import re

import pytest
import torch

from polaformer_mm.ops import pola_linear_attention
from polaformer_mm.ops.pola_attention.reference import pola_linear_attention_reference
from tests import REPO


def _rel(pattern):
    return sorted(osp.relpath(p, REPO) for p in glob.glob(osp.join(REPO, pattern), recursive=True))


DOC_PAGES = _rel('docs/**/*.md')
DOCS = ['README.md'] + DOC_PAGES + ['configs/README.md'] + _rel('configs/*/README.md')
README_MAX_LINES = 160


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
    with open(osp.join(REPO, 'docs', 'advanced_guides', 'method.md')) as f:
        text = f.read()
    assert '0.6544' in text and '0.6835' in text


FENCE = re.compile(r'^ *```[^\n]*\n(.*?)^ *```', re.M | re.S)
INLINE = re.compile(r'`([^`]+)`')
HEADING = re.compile(r'^(#{1,6}) +(.+?) *#* *$', re.M)
LINK = re.compile(r'\]\((?!https?://|mailto:)([^)\s]+)\)')
# a path into the repository's tracked folders, or one of its top-level files, as a token
REPO_PATH = re.compile(r'(?<![\w./~-])((?:configs|tools|polaformer_mm|tests|docs|requirements|'
                       r'\.ci|\.dev_scripts)/[^\s`\'"()\[\]]*)')
TOP_FILE = re.compile(r'(?<![\w./-])(setup\.py|setup\.cfg|Makefile|model-index\.yml|pytest\.ini|'
                      r'MANIFEST\.in|LICENSE|\.pre-commit-config\.yaml)(?![\w.-])')
MODULE = re.compile(r'(?<![\w.])polaformer_mm(?:\.\w+)+')
# paths of other projects that look like ours, per page that names them
FOREIGN_PATHS = {'docs/user_guides/deployment.md': {'tools/deploy.py'}}  # mmdeploy's


def _read(doc):
    with open(osp.join(REPO, doc), encoding='utf-8') as f:
        return f.read()


def _split_code(text):
    """(the code of a page: fenced blocks and inline spans, the prose without them)."""
    code = FENCE.findall(text)
    prose = FENCE.sub('', text)
    code += INLINE.findall(prose)
    return code, INLINE.sub('', prose)


def _slug(heading):
    """The anchor GitHub gives a heading: link texts kept, markup and punctuation
    dropped, lower case, spaces as hyphens."""
    text = re.sub(r'\[([^\]]*)\]\([^)]*\)', r'\1', heading)
    text = re.sub(r'[^\w\- ]', '', text.lower())
    return text.replace(' ', '-')


def _anchors(doc):
    """The anchors of a page's headings (outside code blocks), repeats numbered as GitHub
    numbers them."""
    seen = collections.Counter()
    anchors = set()
    for _, heading in HEADING.findall(FENCE.sub('', _read(doc))):
        slug = _slug(heading)
        anchors.add(f'{slug}-{seen[slug]}' if seen[slug] else slug)
        seen[slug] += 1
    return anchors


def _links(doc):
    """Relative links (images included) of a page outside its code, as (the link, the
    repository path it points at, the page itself for '#anchor' links, and its anchor or '')."""
    _, prose = _split_code(_read(doc))
    for link in LINK.findall(prose):
        path, _, anchor = link.partition('#')
        target = osp.relpath(osp.normpath(osp.join(REPO, osp.dirname(doc), path)),
                             REPO) if path else doc
        yield link, target, anchor


def _resolves(dotted):
    parts = dotted.split('.')
    for n in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module('.'.join(parts[:n]))
        except ImportError:
            continue
        for name in parts[n:]:
            if not hasattr(obj, name):
                return False
            obj = getattr(obj, name)
        return True
    return False


@pytest.mark.parametrize('doc', DOCS)
def test_paths_and_links_exist(doc):
    """Every repository path and polaformer_mm module named in the page's code (inline
    spans and command blocks) exists, and every relative link resolves, anchor included."""
    code, _ = _split_code(_read(doc))
    missing = []
    for span in code:
        for path in REPO_PATH.findall(span) + TOP_FILE.findall(span):
            path = path.rstrip('/.,:;')
            if any(c in path for c in '{*<|') or '.mim' in path or \
                    path in FOREIGN_PATHS.get(doc, ()):
                continue  # a pattern, what an install creates (polaformer_mm/.mim), another's
            if not osp.exists(osp.join(REPO, path)):
                missing.append(path)
        missing += [m for m in MODULE.findall(span) if not _resolves(m)]
    for link, target, anchor in _links(doc):
        if not osp.exists(osp.join(REPO, target)):
            missing.append(link)
        elif anchor and target.endswith('.md') and anchor not in _anchors(target):
            missing.append(f'{link} (no such heading)')
    assert not missing, f'{doc} refers to what does not exist: {missing}'


def test_every_doc_page_is_linked():
    """Each page of docs/ is linked from README.md or docs/index.md."""
    linked = {target for doc in ('README.md', 'docs/index.md') for _, target, _ in _links(doc)}
    orphans = [
        page for page in DOC_PAGES if page != osp.join('docs', 'index.md') and page not in linked
    ]
    assert not orphans, f'pages linked from neither README.md nor docs/index.md: {orphans}'


def test_readme_is_short():
    """README.md is the entry point; the details live in docs/."""
    lines = _read('README.md').count('\n')
    assert lines <= README_MAX_LINES, f'README.md has {lines} lines (at most {README_MAX_LINES})'


CODE_DOC_PATH = re.compile(r'(?<![\w/.-])docs/[\w/.-]*\.(?:md|png|jpg)')


def test_doc_paths_named_by_the_code_exist():
    """Docstrings, comments and messages of the package, tools, tests, configs and build
    files point at documentation pages that exist."""
    sources = [
        p for pattern in ('polaformer_mm/**/*.py', 'tools/**/*.py', 'tools/**/*.sh',
                          'tests/**/*.py', 'configs/**/*.py')
        for p in _rel(pattern) if '.mim' not in p
    ] + ['Makefile', 'setup.py', osp.join('.ci', 'run')]
    missing = [(src, path) for src in sources for path in CODE_DOC_PATH.findall(_read(src))
               if not osp.exists(osp.join(REPO, path))]
    assert not missing, f'documentation paths that do not exist: {missing}'


MD_NAME = re.compile(r'[\w.-]+\.md\b')
# an absolute file-system path (not a URL, a ratio such as H/4, ~/ or {a,b}/x)
ABS_PATH = re.compile(r'(?<![\w.)/:<~}])/(?:[\w.-]+/)+')
UP_PATH = re.compile(r'(?<!\.)(?:\.\./)+[\w./-]*')


def test_no_reference_outside_the_repository():
    """The docs name only files the repository has (or its tools write): no other Markdown
    file, no absolute path, no relative path that leaves the repository."""
    repo_md = {
        osp.basename(p)
        for p in glob.glob(osp.join(REPO, '**', '*.md'), recursive=True) if '.venv' not in p
    }
    for tool in glob.glob(osp.join(REPO, 'tools', '**', '*.py'), recursive=True):
        with open(tool) as f:  # reports the tools write, e.g. benchmark_backbone.md
            repo_md.update(MD_NAME.findall(f.read()))
    for doc in DOCS:
        text = _read(doc)
        foreign = sorted(set(MD_NAME.findall(text)) - repo_md)
        assert not foreign, f'{doc} names Markdown files the repository lacks: {foreign}'
        absolute = ABS_PATH.findall(text)
        assert not absolute, f'{doc} names absolute paths: {absolute}'
        for path in UP_PATH.findall(text):
            target = osp.normpath(osp.join(REPO, osp.dirname(doc), path))
            assert target.startswith(REPO + osp.sep), f'{doc} points outside the repository: {path}'
