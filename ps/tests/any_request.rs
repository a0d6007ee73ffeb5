//! Requests decoded from arbitrary bytes, handed to the parameter service's
//! handlers in-process (no socket) by `ps_server::fuzzing::request`, which the
//! fuzzer drives too: every one is answered, none panics, the server's key is
//! kept, and what a request charged to the memory budget is given back; the
//! same for row requests (`ps_server::fuzzing::rows`), and for whatever a
//! worker writes onto a shared-memory session's request ring
//! (`ps_server::fuzzing::shared_memory_session`), whose session must also
//! end once the worker goes.

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

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn any_words_on_a_shared_memory_request_ring_leave_the_server_whole(
        bytes in proptest::collection::vec(any::<u8>(), 0..400),
    ) {
        let mut data = vec![0];
        data.extend_from_slice(&bytes);
        // Panics (failing the case) when the session broke a promise.
        let _answered = ps_server::fuzzing::shared_memory_session(&data);
    }

    #[test]
    fn a_well_formed_push_over_shared_memory_is_answered_and_any_request_that_decodes_is_served(
        grad in proptest::array::uniform4(any::<f32>()),
        bytes in proptest::collection::vec(any::<u8>(), 0..200),
    ) {
        // A push of any values (NaN included), answered with its outcome.
        let push = ps_server::fuzzing::shared_memory_push(grad);
        prop_assert_eq!(ps_server::fuzzing::shared_memory_session(&push), 1);
        // Any request that decodes: answered, or refused with the session
        // ended, never a panic or a session left running.
        let mut data = vec![1];
        data.extend_from_slice(&bytes);
        let _answered = ps_server::fuzzing::shared_memory_session(&data);
    }
}
