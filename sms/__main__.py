"""`python -m sms` runs the `sms` command."""

import sys

from sms.cli import main

sys.exit(main())
