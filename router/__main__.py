import sys

from router._cli import main

sys.exit(main())
