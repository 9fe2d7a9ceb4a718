import sys

from consumers.cli import main

sys.exit(main())
