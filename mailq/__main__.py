import sys

from mailq.entry import main

sys.exit(main())
