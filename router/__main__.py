import sys

from router._cli.main import main

sys.exit(main())
