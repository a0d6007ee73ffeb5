//! `ps-microbench`: the gRPC tensor-transport benchmark suite (to come).
