"""Run a script in a fresh Python process of this interpreter (nothing imported yet, the
repository first on the path) and read back the JSON it prints on a tagged line."""
import json
import os
import subprocess
import sys

from tests import REPO


def fresh_python_json(script: str, tag: str, timeout: int = 300):
    """The JSON value that ``script`` prints after ``tag`` and a space on one line of its
    output; fails the test with the end of its stderr when the process fails."""
    env = dict(
        os.environ,
        PYTHONPATH=REPO + os.pathsep + os.environ.get('PYTHONPATH', ''),
        OMP_NUM_THREADS='1')
    proc = subprocess.run([sys.executable, '-c', script],
                          cwd=REPO,
                          env=env,
                          capture_output=True,
                          text=True,
                          timeout=timeout)
    assert proc.returncode == 0, proc.stderr[-3000:]
    line = [x for x in proc.stdout.splitlines() if x.startswith(tag + ' ')][0]
    return json.loads(line[len(tag) + 1:])
