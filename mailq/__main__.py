import sys

from mailq import entry

sys.exit(entry())
