"""``python -m loaderx``: the command line; see :mod:`loaderx.cli`."""

import sys

from loaderx.cli import main

sys.exit(main())
