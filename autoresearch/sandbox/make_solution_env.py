"""``python -m wmrl.autoresearch.sandbox.make_solution_env create|check|path [PATH]``.

The command line of :mod:`.solution_env` (a module of its own, so that ``-m`` does not run a
module the package has already imported).
"""

import sys

from .solution_env import main

if __name__ == "__main__":
    sys.exit(main())
