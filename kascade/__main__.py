"""``python -m kascade``: the same command line as the ``kascade`` script."""

import sys

from kascade.cli import main

sys.exit(main())
