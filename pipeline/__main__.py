"""`python -m pipeline` is the `drydock` command."""

import sys

from pipeline.cli import main

sys.exit(main())
