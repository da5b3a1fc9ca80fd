import sys

from depthlab.cli import main

sys.exit(main())
