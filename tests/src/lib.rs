//! `ps-tests`: end-to-end tests across crates (to come).
