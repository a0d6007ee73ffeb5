//! `ps-scheduler`: membership, shard placement and barriers (to come).
