"""Pretrain ELMo: ``python train.py [--config configs/NAME.py] [--config.KEY=VALUE ...] [--workdir DIR]``.

With no arguments: the ``tiny`` preset on the embedded synthetic corpus (configs/tiny.py).
The logic lives in ``elmo_jax.train``; this file only forwards to ``elmo-jax train``.
"""

import sys

from elmo_jax.cli import main

if __name__ == "__main__":
    sys.exit(main(["train", *sys.argv[1:]]))
