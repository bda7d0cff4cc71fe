import sys

from gpupool.sim.cli import main

sys.exit(main(sys.argv[1:]))
