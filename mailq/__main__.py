import sys

from mailq.cli import main

sys.exit(main())
