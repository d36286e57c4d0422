"""Pretrain ELMo: ``python train.py [--config configs/NAME.py] [--config.KEY=VALUE ...] [--workdir DIR]``.

With no arguments: the ``tiny`` preset on the embedded synthetic corpus (configs/tiny.py).
The logic lives in ``elmo_jax.train``; this file only forwards to ``elmo-jax train``.
"""

import sys

from elmo_jax.train.stop import exit_process, stop_cleanly

if __name__ == "__main__":
    # First, before numpy and jax load: a signal from here on ends the run with one line and 130 / 143.
    stop_cleanly(lambda name: f"elmo-jax train: stopped by {name} before training started", at_once=True)
    from elmo_jax.cli import main

    exit_process(main(["train", *sys.argv[1:]]))  # 0 finished, 130 / 143 stopped and resumable
