"""``python -m app`` is the ``tandem`` command."""

import sys

from app.cli import main

if __name__ == "__main__":
    sys.exit(main())
