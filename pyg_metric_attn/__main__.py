import sys

from pyg_metric_attn.cli import main

sys.exit(main())
