"""``python -m bench``: the config layer (bench.run); models, train, data, gpu, lora, loss: bench.<name>."""

import sys

if sys.argv[1:2] == ["models"]:
    from bench.models import main as models_main

    sys.exit(models_main(sys.argv[2:]))
if sys.argv[1:2] == ["gpu"]:
    from bench.gpu import main as gpu_main

    sys.exit(gpu_main(sys.argv[2:]))
if sys.argv[1:2] == ["train"]:
    from bench.train import main as train_main

    sys.exit(train_main(sys.argv[2:]))

if sys.argv[1:2] == ["lora"]:
    from bench.lora import main as lora_main

    sys.exit(lora_main(sys.argv[2:]))

if sys.argv[1:2] == ["loss"]:
    from bench.loss import main as loss_main

    sys.exit(loss_main(sys.argv[2:]))

if sys.argv[1:2] == ["data"]:
    from bench.data import main as data_main

    sys.exit(data_main(sys.argv[2:]))

from bench.run import main

sys.exit(main())
