"""The released ``medium`` architecture: 28.0M-parameter (LSTM 2048 -> 256, one highway layer),
trained with the original recipe of ``configs/original.py`` (lm1b, 128 rows per device,
8192 sampled negatives, Adagrad 0.2, clip 10, dropout 0.1, 10 epochs).

For a shorter run cap it on the command line, e.g. ``--config.max_steps=20000``.
"""

from pathlib import Path

from elmo_jax.train.config_loader import TrainConfig, load_config


def get_config() -> TrainConfig:
    return load_config(Path(__file__).with_name("original.py")).replace(model="medium")
