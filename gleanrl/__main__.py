import sys

from gleanrl.cli import main

sys.exit(main())
