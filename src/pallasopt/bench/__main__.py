"""`python -m pallasopt.bench ...`: the bench command on its own (same options as `pallasopt bench`)."""

import sys

from .runner import main

if __name__ == "__main__":
    sys.exit(main())
