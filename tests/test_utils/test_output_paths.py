"""polaformer_mm.utils.output_paths: an output folder is made and probed, an output file's
place is checked, nothing is left behind, and every refusal names the option and path."""
import os

import pytest

from polaformer_mm.utils.output_paths import (OutputPathError, check_distinct_outputs,
                                              check_output_dir, check_output_file)


def test_folder_is_made_and_left_empty(tmp_path):
    target = tmp_path / 'a' / 'b'
    assert check_output_dir('--out-dir', str(target)) == str(target)
    assert target.is_dir() and list(target.iterdir()) == []


def test_file_place_is_checked_without_leaving_a_file(tmp_path):
    assert check_output_file('--out-md', str(tmp_path / 't.md')) == str(tmp_path / 't.md')
    assert list(tmp_path.iterdir()) == []
    (tmp_path / 'old.md').write_text('kept')
    check_output_file('--out-md', str(tmp_path / 'old.md'))  # an existing file is overwritten
    assert (tmp_path / 'old.md').read_text() == 'kept'


@pytest.mark.skipif(os.name != 'posix' or os.geteuid() == 0, reason='root writes anywhere')
def test_read_only_folder_is_refused(tmp_path):
    folder = tmp_path / 'ro'
    folder.mkdir()
    folder.chmod(0o500)
    try:
        with pytest.raises(OutputPathError, match=r'--out-dir .*ro: cannot write there \(Perm'):
            check_output_dir('--out-dir', str(folder))
        with pytest.raises(OutputPathError, match=r'--out-json .*x.json: cannot write in'):
            check_output_file('--out-json', str(folder / 'x.json'))
    finally:
        folder.chmod(0o700)


def test_two_options_naming_one_path_are_refused(tmp_path):
    same = str(tmp_path / 'r.json')
    with pytest.raises(
            OutputPathError,
            match=rf'--json and --out-md both name {same}: one output would '
            'overwrite the other'):
        check_distinct_outputs({'--json': same, '--out-md': str(tmp_path / '.' / 'r.json')})
    check_distinct_outputs({'--json': same, '--out-md': str(tmp_path / 'r.md'), '--x': None})


def test_a_missing_folder_the_writer_makes_is_checked_where_it_would_be_made(tmp_path):
    deep = str(tmp_path / 'a' / 'b' / 'r.json')
    with pytest.raises(OutputPathError, match='the folder .* does not exist'):
        check_output_file('--json', deep)
    assert check_output_file('--json', deep, makes_folder=True) == deep
    assert list(tmp_path.iterdir()) == []  # nothing made
    (tmp_path / 'f').write_text('x')
    with pytest.raises(OutputPathError, match='f is a file, not a folder'):
        check_output_file('--json', str(tmp_path / 'f' / 'b' / 'r.json'), makes_folder=True)
