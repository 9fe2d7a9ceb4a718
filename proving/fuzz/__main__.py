import sys

from proving.fuzz import main

sys.exit(main(sys.argv[1:]))
