import sys

from training.longspec.train import main

sys.exit(main())
