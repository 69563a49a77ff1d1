import sys

from tests.chaos.runner import main

sys.exit(main())
