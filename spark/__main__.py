import sys

from spark.sweep import main

sys.exit(main())
