//! `ps-worker`: candle workers: the PS client, the trainer, models and data sets (to come).
