"""``python -m tcgnn_py.distributed [options] program.py [args]``: one process per GPU."""

import sys

from ._launch import main

sys.exit(main())
