"""The original ELMo pretraining recipe (Peters et al. 2018) on the 1B Word Benchmark.

93.6M-parameter biLM (char-CNN with 2048 filters, 2 x LSTM 4096 -> 512), batch 128 rows
per device (3 GPUs in the original: 384 rows), 20 unrolled steps, sampled softmax with 8192
log-uniform negatives, Adagrad 0.2 (initial accumulator 1.0), gradients clipped to global
norm 10, dropout 0.1, 10 epochs over the 793,471-token vocabulary.
"""

from elmo_jax.train.config_loader import TrainConfig


def get_config() -> TrainConfig:
    return TrainConfig(
        model="original",
        data="lm1b",
        vocab_size=None,  # the full benchmark vocabulary
        batch_size_per_device=128,  # global batch = 128 x number of devices
        unroll_steps=20,
        data_workers=4,  # sentences read and encoded in 4 processes while the devices step
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
        # The first 250 batches of lm1b's test split (32 x 20 positions each, 160k), about
        # one of its 50 shards: the benchmark's usual test size, not the whole 8M tokens.
        eval_max_batches=250,
        log_every=100,
        parallel="pmap",
        # Fits a 16 GB chip (TPU v5e) at 128 rows without remat: 6.8 GiB per chip by the
        # compile-only check (elmo-jax compile --topology v5e:2x4), which found 384 rows to fit
        # too.  For still more rows per chip, --config.remat_steps=5 recomputes activations in
        # chunks of 5 steps (the same values, about 1/3 more FLOPs).
        # The sampled softmax touches ~2 x 8192 negatives + the targets of 793,471 rows per step:
        # gradient and Adagrad update on those rows only (the same numbers as the dense update
        # up to float summation order), not 1.6 GB x several passes over the whole softmax.
        softmax_update="sparse",
    )
