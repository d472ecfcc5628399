"""`python -m node.cli`: the `reame` command."""

import sys

from node.cli.main import main

if __name__ == "__main__":
    sys.exit(main())
