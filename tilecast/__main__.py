import sys

from tilecast.cli import main

sys.exit(main())
