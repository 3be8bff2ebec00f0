"""``python -m bench``: the config layer (:mod:`bench.run`); ``python -m bench train``: :mod:`bench.train`."""

import sys

if sys.argv[1:2] == ["train"]:
    from bench.train import main

    sys.exit(main(sys.argv[2:]))

from bench.run import main

sys.exit(main())
