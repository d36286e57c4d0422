"""The released ``small`` architecture: 13.6M-parameter (LSTM 1024 -> 128, one highway layer),
trained with the original recipe on the 1B Word Benchmark (128 rows per device, 8192 sampled
negatives, Adagrad 0.2, clip 10, dropout 0.1, 10 epochs).

For a shorter run cap it on the command line, e.g. ``--config.max_steps=20000``.
"""

from elmo_jax.train.config_loader import TrainConfig


def get_config() -> TrainConfig:
    return TrainConfig(
        model="small",
        data="lm1b",
        batch_size_per_device=128,  # global batch = 128 x number of devices
        unroll_steps=20,
        num_negatives=8192,
        learning_rate=0.2,
        initial_accumulator=1.0,
        clip_norm=10.0,
        dropout=0.1,
        epochs=10,
        compute_dtype="float32",
        checkpoint_every=5000,
        keep_checkpoints=3,
        eval_every=50000,
        log_every=100,
        parallel="pmap",
    )
