"""The developer guide's map of the repository stays true: every file and folder its layout
section names exists where the section puts it, every module of the package is on the map,
and every command line of tools/ is as thin as the map says."""
import glob
import os.path as osp
import re

from tests import REPO

GUIDE = osp.join(REPO, 'docs', 'notes', 'developer_guide.md')
BULLET = re.compile(r'^( *)- (.*)$')
SPAN = re.compile(r'`([^`]+)`')
# a file or folder name: `name.py`, `dir/`, `dir/name.sh` (not `f()`, `Class`, `a b`)
ENTRY = re.compile(r'^[\w.-]+(?:/[\w.-]+)*(?:/|\.(?:py|sh|md|yml|txt|pt))$')
TOOL_MAX_LINES = 300


def _layout_bullets():
    """(indent, text) of each bullet of the layout section, continuation lines joined."""
    with open(GUIDE) as f:
        text = f.read()
    section = text.split('## Layout of the repository\n', 1)[1].split('\n## ', 1)[0]
    bullets = []
    for line in section.splitlines():
        match = BULLET.match(line)
        if match:
            bullets.append([len(match.group(1)), match.group(2)])
        elif bullets and line.strip():
            bullets[-1][1] += ' ' + line.strip()
    return bullets


def _head_and_rest(text):
    """The bullet's own entries (before the first ':' outside code spans) and the rest."""
    outside = SPAN.sub(lambda m: '_' * len(m.group(0)), text)
    cut = outside.find(':')
    return (text, '') if cut < 0 else (text[:cut], text[cut + 1:])


def _entries(text):
    return [s for s in SPAN.findall(text) if ENTRY.match(s)]


def named_paths():
    """Each entry the layout names, as a repository path: resolved in the folder of the
    bullet it is nested in (a bullet's description names what is inside its own folder
    when the bullet is one folder), or else from the repository root."""
    contexts = [(-1, '')]  # (indent, folder)
    named, missing = set(), []
    for indent, text in _layout_bullets():
        while contexts[-1][0] >= indent:
            contexts.pop()
        parent = contexts[-1][1]
        head, rest = _head_and_rest(text)
        heads = _entries(head)
        folder = osp.join(parent, heads[0]) if len(heads) == 1 and heads[0].endswith('/') \
            else None
        for entry, where in [(e, parent) for e in heads] + \
                [(e, folder if folder is not None else parent) for e in _entries(rest)]:
            path = osp.normpath(osp.join(where, entry))
            if not osp.exists(osp.join(REPO, path)):
                path = osp.normpath(entry)
                if not osp.exists(osp.join(REPO, path)):
                    missing.append(osp.join(where, entry))
                    continue
            named.add(path)
        contexts.append((indent, folder if folder is not None else parent))
    return named, missing


def test_every_entry_of_the_layout_exists():
    named, missing = named_paths()
    assert len(named) > 50, f'the layout section names only {sorted(named)}'
    assert not missing, f'docs/notes/developer_guide.md names what does not exist: {missing}'


def test_every_module_of_the_package_is_on_the_map():
    named, _ = named_paths()
    unlisted = []
    for path in sorted(glob.glob(osp.join(REPO, 'polaformer_mm', '**', '*.py'), recursive=True)):
        rel = osp.relpath(path, REPO)
        if '.mim' in rel:
            continue
        if osp.basename(rel) == '__init__.py':  # a package: its folder, or what is in it
            rel = osp.dirname(rel)
            if rel in named or any(p.startswith(rel + osp.sep) for p in named):
                continue
        if rel not in named:
            unlisted.append(rel)
    assert not unlisted, f'modules missing from the layout of docs/notes/developer_guide.md: ' \
        f'{unlisted}'


def test_command_lines_are_thin():
    """The tools parse arguments and call the package (the layout section says so)."""
    long = {}
    for path in glob.glob(osp.join(REPO, 'tools', '**', '*.py'), recursive=True):
        with open(path) as f:
            lines = sum(1 for _ in f)
        if lines > TOOL_MAX_LINES:
            long[osp.relpath(path, REPO)] = lines
    assert not long, f'tools over {TOOL_MAX_LINES} lines (move their logic into the package): ' \
        f'{long}'
