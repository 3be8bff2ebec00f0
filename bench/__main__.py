"""``python -m bench``: see :mod:`bench.run`; ``python -m bench models``: see :mod:`bench.models`."""

import sys

if sys.argv[1:2] == ["models"]:
    from bench.models import main as models_main

    sys.exit(models_main(sys.argv[2:]))

from bench.run import main

sys.exit(main())
