//! Unit tests of [`Membership`] with a fake clock: registration and ranks,
//! expiry, elastic groups, leaving, maps and the state file.

use super::*;

const TIMEOUT: Duration = Duration::from_secs(5);

fn params() -> Vec<Param> {
    vec![
        Param {
            name: "w".into(),
            elements: 1000,
            elem_size: 4,
        },
        Param {
            name: "b".into(),
            elements: 10,
            elem_size: 4,
        },
    ]
}

/// The ranks of workers that left on purpose.
fn departed(m: &Membership) -> Vec<Rank> {
    m.workers()
        .into_iter()
        .filter(|w| w.left)
        .map(|w| w.id)
        .collect()
}

fn ranks(ranks: &[u32]) -> Vec<Rank> {
    ranks.iter().copied().map(Rank).collect()
}

fn cluster(t0: Instant) -> Membership {
    let mut m = Membership::new(TIMEOUT, 2, 2);
    m.register_server("s0:1", t0).unwrap();
    m.register_server("s1:1", t0).unwrap();
    m
}

/// [`cluster`] with the parameters declared and `workers` registered at `t0`,
/// ranked in order.
fn declared(t0: Instant, workers: &[&str]) -> Membership {
    let mut m = cluster(t0);
    m.declare_params(params()).unwrap();
    for worker in workers {
        m.register_worker(worker, t0).unwrap();
    }
    m
}

#[test]
fn no_map_until_params_and_servers_are_there() {
    let t0 = Instant::now();
    let mut m = Membership::new(TIMEOUT, 2, 2);
    assert!(m.map().is_none());
    m.register_server("s0:1", t0).unwrap();
    assert!(m.missing().contains("1 of 2 servers"), "{}", m.missing());
    assert!(m.missing().contains("declared the parameters"));
    m.declare_params(params()).unwrap();
    assert!(m.map().is_none());
    m.register_server("s1:1", t0).unwrap();
    let map = m.map().unwrap();
    assert_eq!((map.version, map.servers.len()), (MapVersion(1), 2));
    assert_eq!(m.missing(), "");
}

#[test]
fn ranks_are_stable_for_a_client_and_reused_after_death() {
    let t0 = Instant::now();
    let mut m = cluster(t0);
    assert_eq!(m.register_worker("a", t0), Ok(Rank(0)));
    assert_eq!(m.register_worker("b", t0), Ok(Rank(1)));
    assert_eq!(m.register_worker("a", t0), Ok(Rank(0)));
    assert_eq!(
        m.register_worker("c", t0),
        Err(MembershipError::GroupFull { workers: 2 })
    );
    for node in [
        Node::Worker(Rank(0)),
        Node::Server(ServerId(0)),
        Node::Server(ServerId(1)),
    ] {
        m.heartbeat(node, Step(3), t0 + TIMEOUT).unwrap();
    }
    let events = m.tick(t0 + TIMEOUT + Duration::from_millis(1));
    assert!(
        matches!(
            &events[..],
            [Event::Dead {
                node: Node::Worker(Rank(1)),
                ..
            }]
        ),
        "{events:?}"
    );
    assert_eq!(
        m.register_worker("c", t0 + TIMEOUT * 2),
        Ok(Rank(1)),
        "a dead worker's rank is free again"
    );
}

#[test]
fn expiry_follows_the_clock_exactly() {
    let t0 = Instant::now();
    let mut m = declared(t0, &["a"]);
    // (time since start, heartbeat from worker 0?, expect worker dead after tick?)
    let steps = [
        (4, true, false),
        (8, false, false),
        (9, false, false),
        (10, false, true),
    ];
    let mut dead = false;
    for (secs, beat, expect_dead) in steps {
        let now = t0 + Duration::from_secs(secs);
        if beat {
            m.heartbeat(Node::Worker(Rank(0)), Step(0), now).unwrap();
        }
        m.heartbeat(Node::Server(ServerId(0)), Step(0), now)
            .unwrap();
        m.heartbeat(Node::Server(ServerId(1)), Step(0), now)
            .unwrap();
        dead |= m.tick(now).iter().any(|e| {
            matches!(
                e,
                Event::Dead {
                    node: Node::Worker(Rank(0)),
                    ..
                }
            )
        });
        assert_eq!(dead, expect_dead, "at {secs}s");
    }
    assert_eq!(
        m.heartbeat(Node::Worker(Rank(0)), Step(0), t0),
        Err(MembershipError::UnknownNode {
            node: "worker 0".into()
        })
    );
}

#[test]
fn a_dead_worker_leaves_the_map_and_bumps_the_version() {
    let t0 = Instant::now();
    let mut m = declared(t0, &["a", "b"]);
    let before = m.map().unwrap().clone();
    assert_eq!(before.workers, ranks(&[0, 1]));
    let later = t0 + TIMEOUT + Duration::from_secs(1);
    for node in [
        Node::Server(ServerId(0)),
        Node::Server(ServerId(1)),
        Node::Worker(Rank(0)),
    ] {
        m.heartbeat(node, Step(0), later).unwrap();
    }
    m.tick(later);
    let after = m.map().unwrap();
    assert_eq!(after.workers, ranks(&[0]));
    assert!(after.version > before.version);
    assert_eq!(
        after.assignments, before.assignments,
        "worker changes do not move keys"
    );
}

#[test]
fn a_dead_server_moves_its_keys_to_the_live_ones() {
    let t0 = Instant::now();
    let mut m = cluster(t0);
    m.declare_params(params()).unwrap();
    let later = t0 + TIMEOUT + Duration::from_secs(1);
    m.heartbeat(Node::Server(ServerId(0)), Step(0), later)
        .unwrap();
    let events = m.tick(later);
    assert!(
        matches!(&events[..], [Event::Dead { node: Node::Server(ServerId(1)), name, .. }] if name == "s1:1")
    );
    let map = m.map().unwrap();
    assert_eq!(map.servers, vec![(ServerId(0), "s0:1".to_string())]);
    assert!(map.assignments.iter().all(|a| a.server == 0));
}

#[test]
fn params_conflicts_are_refused_and_identical_declarations_accepted() {
    let t0 = Instant::now();
    let mut m = cluster(t0);
    m.declare_params(params()).unwrap();
    m.declare_params(params()).unwrap();
    let err = m.declare_params(vec![]).unwrap_err();
    assert!(err.to_string().contains("same model"), "{err}");
}

#[test]
fn ranks_not_registered_yet_are_still_waited_for() {
    let t0 = Instant::now();
    let m = declared(t0, &["a"]);
    assert_eq!(
        m.map().unwrap().workers,
        ranks(&[0, 1]),
        "worker 1 has not started yet, but the group waits for it"
    );
}

#[test]
fn a_clean_leave_is_immediate() {
    let t0 = Instant::now();
    let mut m = declared(t0, &["a", "b"]);
    m.leave(Node::Worker(Rank(1)), Step(0));
    assert_eq!(m.map().unwrap().workers, ranks(&[0]));
    assert_eq!(
        departed(&m),
        ranks(&[1]),
        "it left; it was not declared dead"
    );
}

fn elastic(t0: Instant) -> Membership {
    let group: GroupSize = "2:3".parse().unwrap();
    let mut m = Membership::new(TIMEOUT, group, 1).with_join_window(Duration::from_secs(2));
    m.register_server("s0:1", t0).unwrap();
    m.declare_params(params()).unwrap();
    m
}

#[test]
fn an_elastic_group_forms_after_the_join_window_with_whoever_registered() {
    let t0 = Instant::now();
    let mut m = elastic(t0);
    assert_eq!(m.register_worker("a", t0), Ok(Rank(0)));
    m.tick(t0 + Duration::from_secs(3));
    assert_eq!(m.group_size(), None, "one worker is below the minimum of 2");
    assert!(m.map().is_none());
    assert!(
        m.missing().contains("forming: 1 registered"),
        "{}",
        m.missing()
    );
    let t1 = t0 + Duration::from_secs(4);
    assert_eq!(m.register_worker("b", t1), Ok(Rank(1)));
    assert!(
        m.tick(t1 + Duration::from_secs(1)).is_empty(),
        "window still open"
    );
    // Waiting workers are not expired while the group forms, however long it takes.
    m.heartbeat(Node::Server(ServerId(0)), Step(0), t1).unwrap();
    let events = m.tick(t1 + Duration::from_secs(2));
    assert_eq!(events, vec![Event::GroupFormed { workers: 2 }]);
    assert_eq!(m.group_size(), Some(2));
    let map = m.map().unwrap();
    assert_eq!((map.group_size, map.workers.clone()), (2, ranks(&[0, 1])));
    assert_eq!(
        m.register_worker("late", t1 + Duration::from_secs(3)),
        Err(MembershipError::GroupFull { workers: 2 }),
        "a formed group does not grow"
    );
}

#[test]
fn an_elastic_group_forms_at_once_when_it_reaches_its_maximum() {
    let t0 = Instant::now();
    let mut m = elastic(t0);
    for (n, id) in ["a", "b", "c"].iter().enumerate() {
        assert_eq!(m.register_worker(id, t0), Ok(Rank(n as u32)));
    }
    assert_eq!(m.group_size(), Some(3));
    assert_eq!(m.map().unwrap().workers, ranks(&[0, 1, 2]));
}

#[test]
fn a_formed_elastic_group_expires_silent_workers_from_the_moment_it_formed() {
    let t0 = Instant::now();
    let mut m = elastic(t0);
    m.register_worker("a", t0).unwrap();
    m.register_worker("b", t0).unwrap();
    let formed = t0 + Duration::from_secs(60);
    m.heartbeat(Node::Server(ServerId(0)), Step(0), formed)
        .unwrap();
    assert_eq!(m.tick(formed), vec![Event::GroupFormed { workers: 2 }]);
    let later = formed + TIMEOUT - Duration::from_millis(1);
    m.heartbeat(Node::Server(ServerId(0)), Step(0), later)
        .unwrap();
    assert!(
        m.tick(later).is_empty(),
        "their clocks started when it formed"
    );
    let dead = formed + TIMEOUT + Duration::from_millis(1);
    m.heartbeat(Node::Server(ServerId(0)), Step(0), dead)
        .unwrap();
    m.heartbeat(Node::Worker(Rank(0)), Step(5), dead).unwrap();
    assert!(matches!(
        &m.tick(dead)[..],
        [Event::Dead {
            node: Node::Worker(Rank(1)),
            ..
        }]
    ));
}

#[test]
fn the_job_is_done_when_every_worker_has_gone_and_one_left_on_purpose() {
    let t0 = Instant::now();
    let mut m = cluster(t0);
    m.register_worker("a", t0).unwrap();
    assert!(!m.job_done());
    m.leave(Node::Worker(Rank(0)), Step(0));
    assert!(!m.job_done(), "rank 1 has not even registered");
    m.register_worker("b", t0).unwrap();
    assert!(!m.job_done());
    m.leave(Node::Worker(Rank(1)), Step(0));
    assert!(m.job_done());
}

#[test]
fn members_that_leave_are_shown_as_left_at_the_step_they_left_with() {
    let t0 = Instant::now();
    let mut m = cluster(t0);
    m.register_worker("a", t0).unwrap();
    m.heartbeat(Node::Worker(Rank(0)), Step(100), t0).unwrap();
    m.leave(Node::Worker(Rank(0)), Step(659));
    m.leave(Node::Server(ServerId(1)), Step(0));
    let worker = &m.workers()[0];
    assert_eq!(
        (worker.alive, worker.left, worker.last_step),
        (false, true, Step(659))
    );
    let servers = m.servers();
    assert_eq!(
        servers
            .iter()
            .map(|s| (s.id, s.alive, s.left))
            .collect::<Vec<_>>(),
        vec![(ServerId(0), true, false), (ServerId(1), false, true)]
    );
}

#[test]
fn a_saved_membership_resumes_with_the_same_map_ids_and_ranks() {
    let t0 = Instant::now();
    let mut m = declared(t0, &["a", "b"]);
    m.leave(Node::Worker(Rank(1)), Step(0));
    let before = m.map().unwrap().clone();
    let later = t0 + Duration::from_secs(100);
    let mut resumed = Membership::from_saved(m.saved(), TIMEOUT, 2, later);
    assert_eq!(resumed.map(), Some(&before), "same version and placement");
    assert_eq!(
        resumed.register_server("s1:1", later),
        Ok(ServerId(1)),
        "same server id"
    );
    assert_eq!(
        resumed.register_worker("a", later),
        Ok(Rank(0)),
        "same rank"
    );
    assert_eq!(
        resumed.heartbeat(Node::Server(ServerId(0)), Step(0), later),
        Ok(before.version)
    );
    assert_eq!(departed(&resumed), ranks(&[1]));
    let silent = later + TIMEOUT + Duration::from_millis(1);
    resumed
        .heartbeat(Node::Server(ServerId(0)), Step(0), silent)
        .unwrap();
    resumed
        .heartbeat(Node::Server(ServerId(1)), Step(0), silent)
        .unwrap();
    let events = resumed.tick(silent);
    assert!(
        matches!(
            &events[..],
            [Event::Dead {
                node: Node::Worker(Rank(0)),
                ..
            }]
        ),
        "nodes not heard from after the restart are declared dead as usual: {events:?}"
    );
}

#[test]
fn server_addresses_are_bounded_and_a_known_one_is_always_taken_again() {
    let t0 = Instant::now();
    let mut m = Membership::new(TIMEOUT, 1, 1);
    for i in 0..MAX_SERVERS {
        m.register_server(&format!("s{i}:1"), t0).unwrap();
    }
    assert_eq!(
        m.register_server("one-more:1", t0),
        Err(MembershipError::TooManyServers { limit: MAX_SERVERS })
    );
    assert_eq!(m.register_server("s7:1", t0), Ok(ServerId(7)));
}
