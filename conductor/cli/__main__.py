"""``python -m conductor.cli``: the ``conductor`` command, for where the console script is not on the path."""

import sys

from conductor.cli import main

sys.exit(main())
