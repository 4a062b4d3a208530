import sys

from kuberl.runtime.main import main

sys.exit(main())
