"""`python -m node` runs the `sms` command."""

import sys

from node.cli import main

sys.exit(main())
