"""The project's tests (``make test``: all of them; ``make test-fast``: those not marked
``slow``). Paths every test module shares are defined here once."""
import os.path as osp

#: the repository root
REPO = osp.dirname(osp.dirname(osp.abspath(__file__)))
