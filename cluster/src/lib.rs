//! `ps-cluster`: a whole cluster in one process, ps-local (to come).
