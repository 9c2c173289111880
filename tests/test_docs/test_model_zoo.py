"""The front page keeps up with configs/: README.md's first paragraph names every backbone
family that has Pola configs, and the model-zoo table of README.md and docs/model_zoo.md
lists, family by family, exactly the methods of the Pola configs per dataset, in the folder
that holds them; every folder of configs/ is named beside the table and every path the
table names exists. A config of a new method, dataset, family or folder fails here until the
table lists it."""
import collections
import glob
import os.path as osp
import re

import pytest

from tests import REPO

ZOO_PAGES = ['README.md', 'docs/model_zoo.md']
#: the backbone token of a Pola config's name -> the family the docs name
FAMILIES = {'pvt': 'Pola-PVT', 'swin': 'Pola-Swin', 'pvtv2': 'Pola-PVTv2', 'deit': 'Pola-DeiT'}
FAMILY = re.compile(r'(?:^|_)pola-(pvtv2|pvt|swin|deit)(?:-|_)')
#: the first field of a detection / segmentation config's name -> the method the table names
METHODS = {
    'mask-rcnn': 'Mask R-CNN',
    'retinanet': 'RetinaNet',
    'cascade-mask-rcnn': 'Cascade Mask R-CNN',
    'mask2former': 'Mask2Former',
    'fpn': 'Semantic FPN',
    'upernet': 'UperNet',
}
#: the start of a config name's last field -> (column, what the method's name gains)
DATASETS = [('coco-panoptic', 'COCO', ' panoptic'), ('coco', 'COCO', ''), ('ade20k', 'ADE20K', ''),
            ('cityscapes', 'Cityscapes', ''), ('in1k', 'ImageNet-1k', '')]
COLUMNS = ['COCO', 'ADE20K', 'Cityscapes', 'ImageNet-1k']
CLASSIFIER_FOLDER = 'imagenet'
NUMBERS = {2: 'two', 3: 'three', 4: 'four', 5: 'five', 6: 'six', 7: 'seven', 8: 'eight'}


def _read(path):
    with open(osp.join(REPO, path)) as f:
        return f.read()


def _pola_configs():
    """(folder, file name) of every Pola config of configs/ but the quickstart's."""
    found = []
    for path in sorted(glob.glob(osp.join(REPO, 'configs', '*', '*.py'))):
        folder, name = osp.basename(osp.dirname(path)), osp.basename(path)
        if 'pola-' in name and folder != 'quickstart':
            found.append((folder, name))
    return found


def _entry(folder, name):
    """(family, column, method) a Pola config stands for in the table."""
    stem = name[:-len('.py')]
    family = FAMILY.search(stem)
    assert family, f'configs/{folder}/{name}: no family of {sorted(FAMILIES)} in its name'
    if folder == CLASSIFIER_FOLDER:
        method = 'fine-tuning' if '_ft-' in stem else 'training'
    else:
        kind = stem.split('_')[0]
        assert kind in METHODS, (f'configs/{folder}/{name}: method {kind!r} is new: add it to '
                                 'METHODS and to the model-zoo tables')
        method = METHODS[kind]
    last = stem.split('_')[-1]
    dataset = next((d for d in DATASETS if last.startswith(d[0])), None)
    assert dataset, f'configs/{folder}/{name}: dataset {last!r} is new: add it to the tables'
    return FAMILIES[family.group(1)], dataset[1], method + dataset[2]


def _expected():
    """{family: {column: methods}} and {family: folders} of the Pola configs."""
    grid = collections.defaultdict(lambda: {c: set() for c in COLUMNS})
    folders = collections.defaultdict(set)
    for folder, name in _pola_configs():
        family, column, method = _entry(folder, name)
        grid[family][column].add(method)
        if folder != CLASSIFIER_FOLDER:
            folders[family].add(folder)
    return grid, folders


def _zoo_section(page):
    text = _read(page)
    head = '## Model zoo\n' if page == 'README.md' else '# Model zoo\n'
    assert head in text, f'{page} has no "{head.strip()}" section'
    return text.split(head, 1)[1].split('\n#', 1)[0]


def _table(page):
    """{family: {column: cell}} of the page's model-zoo table."""
    lines = [line for line in _zoo_section(page).splitlines() if line.startswith('|')]
    header = [c.strip() for c in lines[0].strip('|').split('|')]
    assert header == ['family', 'folder'] + COLUMNS, f'{page}: model-zoo header {header}'
    rows = {}
    for line in lines[2:]:
        cells = [c.strip() for c in line.strip('|').split('|')]
        assert cells[0] not in rows, f'{page}: {cells[0]} has two rows'
        rows[cells[0]] = dict(zip(header[1:], cells[1:]))
    return rows


def _methods(cell):
    return set() if cell == '-' else {m.strip() for m in cell.split(',')}


@pytest.mark.parametrize('page', ZOO_PAGES)
def test_model_zoo_table_lists_every_pola_config(page):
    """Row by family, column by dataset: the methods of the configs, no more, no fewer."""
    grid, folders = _expected()
    rows = _table(page)
    assert sorted(rows) == sorted(grid), f'{page}: families {sorted(rows)} != {sorted(grid)}'
    for family, columns in grid.items():
        for column, methods in columns.items():
            listed = _methods(rows[family][column])
            assert listed == methods, (f'{page}: {family} / {column} lists {sorted(listed)}; '
                                       f'the configs have {sorted(methods)}')
        named = set(re.findall(r'`configs/(\w+)/`', rows[family]['folder']))
        assert named == folders[family], f'{page}: {family} folder {named} != {folders[family]}'


@pytest.mark.parametrize('page', ZOO_PAGES)
def test_model_zoo_names_every_folder_and_only_real_paths(page):
    section = _zoo_section(page)
    for folder in sorted(glob.glob(osp.join(REPO, 'configs', '*', ''))):
        name = osp.basename(osp.dirname(folder))
        assert f'`configs/{name}/`' in section, f'{page}: the model zoo does not name {name}'
    for path in re.findall(r'`(configs/[\w/.-]+)`', section):
        assert osp.exists(osp.join(REPO, path)), f'{page}: {path} does not exist'
    for link in re.findall(r'\]\(([^)#]+)', section):
        if '://' not in link:
            target = osp.normpath(osp.join(REPO, osp.dirname(page), link))
            assert osp.exists(target), f'{page}: link {link} leads nowhere'


def test_readme_first_paragraph_names_every_family():
    """The opening paragraph names every family with Pola configs, in bold, and counts
    them right."""
    text = _read('README.md').split('\n## ', 1)[0]
    paragraph = text.split('\n\n', 1)[1]
    families = {FAMILIES[FAMILY.search(n).group(1)] for _, n in _pola_configs()}
    assert set(re.findall(r'\*\*(Pola-[\w-]+)\*\*', paragraph)) == families
    assert f' {NUMBERS[len(families)]} backbone families' in ' '.join(paragraph.split())


def test_config_names_are_read_as_the_table_means_them():
    """The name parsing on a few known configs (so that the tests above test something)."""
    assert _entry('pola_swin', 'mask2former_pola-swin-t-p4-w7-224_8xb2-lsj-50e_coco-panoptic'
                  '.py') == ('Pola-Swin', 'COCO', 'Mask2Former panoptic')
    assert _entry('pola_pvt',
                  'fpn_pola-pvt-l_4xb2-80k_cityscapes-512x1024.py') == ('Pola-PVT', 'Cityscapes',
                                                                        'Semantic FPN')
    assert _entry('pola_pvtv2',
                  'retinanet_pola-pvtv2-b0_fpn_1x_coco.py') == ('Pola-PVTv2', 'COCO', 'RetinaNet')
    assert _entry('imagenet',
                  'pola-deit-small_ft-4xb256-30e_in1k.py') == ('Pola-DeiT', 'ImageNet-1k',
                                                               'fine-tuning')
    with pytest.raises(AssertionError, match="method 'yolox' is new"):
        _entry('pola_pvt', 'yolox_pola-pvt-s_8xb8-300e_coco.py')
    with pytest.raises(AssertionError, match="dataset 'voc' is new"):
        _entry('pola_pvt', 'mask-rcnn_pola-pvt-s_fpn_1x_voc.py')
    assert len(_pola_configs()) > 50
