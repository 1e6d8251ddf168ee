import sys

from rf_eval.cli import main

sys.exit(main())
