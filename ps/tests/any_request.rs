//! Requests decoded from arbitrary bytes, handed to the parameter service's
//! handlers in-process (no socket) by `ps_server::fuzzing::request`, which the
//! fuzzer drives too: every one is answered, none panics, the server's key is
//! kept, and what a request charged to the memory budget is given back; the
//! same for row requests (`ps_server::fuzzing::rows`).

use proptest::prelude::*;

proptest! {
    #![proptest_config(ProptestConfig::with_cases(300))]

    #[test]
    fn any_push_pull_register_join_or_stats_is_answered_without_panicking(
        kind in 0u8..5,
        bytes in proptest::collection::vec(any::<u8>(), 0..200),
    ) {
        let mut data = vec![kind];
        data.extend_from_slice(&bytes);
        // Panics (failing the case) when the request broke a promise.
        let _answered_ok = ps_server::fuzzing::request(&data);
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(300))]

    #[test]
    fn any_row_push_pull_or_declaration_is_answered_without_panicking(
        kind in 0u8..3,
        bytes in proptest::collection::vec(any::<u8>(), 0..200),
    ) {
        let mut data = vec![kind];
        data.extend_from_slice(&bytes);
        // Panics (failing the case) when the request broke a promise.
        let _answered_ok = ps_server::fuzzing::rows(&data);
    }
}
