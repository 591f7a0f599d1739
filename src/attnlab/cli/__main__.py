"""``python -m attnlab.cli``: the same as the ``attnlab`` command (what ``torchrun -m attnlab.cli train`` runs)."""

import sys

from attnlab.cli import main

sys.exit(main())
