"""`python -m minilin` is the `minilin` command."""
import sys

from .cli import main

sys.exit(main())
