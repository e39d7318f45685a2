"""``python -m ragen_turn.report ...``: see :mod:`ragen_turn.report`."""
import sys

from ragen_turn.report.cli import main

sys.exit(main())
