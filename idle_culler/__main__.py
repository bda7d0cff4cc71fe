import sys

from gpupool.idle_culler.service import main

sys.exit(main())
