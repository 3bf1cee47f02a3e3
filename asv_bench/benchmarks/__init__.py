"""tcgnn_py's asv suite.

It measures the ``tcgnn_py`` that the Python running asv imports (asv's "existing" environment): the installed
package, else the checkout that holds this suite (``asv.conf.json``'s ``"repo"``), put on the path here because
asv starts each benchmark in a process without ``PYTHONPATH``; so a fresh machine needs no install step.
"""

import importlib.util
import pathlib
import sys

if importlib.util.find_spec("tcgnn_py") is None:
    sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2]))
