"""``python -m coci``: the ``coci`` command line (``coci.cli``), for an environment whose scripts
folder is not on the ``PATH``."""

import sys

from coci.cli import main

if __name__ == "__main__":
    sys.exit(main())
