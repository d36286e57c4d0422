"""Default config: the ``tiny`` model on the embedded synthetic corpus, on a laptop CPU.

Three passes over the default synthetic corpus (about 40k sentences) take roughly ten minutes
on two CPU cores.  Its vocabulary is far smaller than ``num_negatives``, so the training loop
switches to the full softmax automatically (and says so).
"""

from elmo_jax.train.config_loader import TrainConfig


def get_config() -> TrainConfig:
    return TrainConfig(
        model="tiny",
        data="synthetic",
        batch_size=32,  # global, split over the local devices
        unroll_steps=20,
        num_negatives=8192,
        learning_rate=0.2,
        initial_accumulator=1.0,
        clip_norm=10.0,
        dropout=0.1,
        epochs=3,
        compute_dtype="float32",
        checkpoint_every=500,
        keep_checkpoints=3,
        eval_every=0,
        log_every=50,
        parallel="pmap",
    )
