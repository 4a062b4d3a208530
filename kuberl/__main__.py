import sys

from kuberl.cli import main

sys.exit(main())
