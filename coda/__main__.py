import sys

from coda.cli import main

sys.exit(main())
