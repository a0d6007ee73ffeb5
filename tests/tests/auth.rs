//! The cluster token over real gRPC: a scheduler and a parameter server started
//! with one refuse every request without it (or with another) with
//! `UNAUTHENTICATED`, rogue registrations change nothing, the health service
//! stays open, and a client with the token trains as before. With the token, a
//! registration's heartbeats and `Leave` still need its own secret. With role
//! secrets, a worker's cannot register a server and a server's cannot take a
//! rank or push, while a job with both trains.

use bytes::Bytes;
use ps_client::ParamBytes;
use ps_client::placement::ParamInfo;
use ps_client::{ClientConfig, PsClient};
use ps_proto::auth::{ClusterToken, Role};
use ps_proto::codec::DType;
use ps_proto::ids::{Rank, Step, Version};
use ps_proto::transport::TransportConfig;
use ps_proto::v1;
use ps_proto::v1::parameter_server_client::ParameterServerClient;
use ps_proto::v1::scheduler_client::SchedulerClient;
use ps_scheduler::SchedulerConfig;
use ps_server::ServerConfig;
use ps_server::follower::SchedulerLink;
use tonic::Code;

/// Separate secrets for servers and workers.
const ROLE_SECRETS: &str = "server=the-servers-secret\nworker=the-workers-secret\n";

fn transport(token: Option<&str>) -> TransportConfig {
    transport_as(token, Role::Worker)
}

/// A transport with `token`, presenting the secret of `role`.
fn transport_as(token: Option<&str>, role: Role) -> TransportConfig {
    TransportConfig {
        token: token.map(|t| ClusterToken::new(t).unwrap().presenting(role).unwrap()),
        ..TransportConfig::default()
    }
}

/// A scheduler requiring `token`.
async fn scheduler(token: &str) -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let scheduler = listener.local_addr().unwrap().to_string();
    let config = SchedulerConfig {
        transport: transport(Some(token)),
        ..SchedulerConfig::default()
    };
    tokio::spawn(ps_scheduler::run(listener, config, std::future::pending()));
    scheduler
}

/// A scheduler and one server following it, both requiring `token`.
async fn cluster(token: &str) -> (String, String) {
    let scheduler = scheduler(token).await;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let server = listener.local_addr().unwrap().to_string();
    let config = ServerConfig {
        scheduler: Some(SchedulerLink {
            scheduler: scheduler.clone(),
            advertise: server.clone(),
            connect_timeout: std::time::Duration::from_secs(10),
        }),
        transport: transport_as(Some(token), Role::Server),
        ..ServerConfig::default()
    };
    tokio::spawn(ps_server::run(listener, config, std::future::pending()));
    (scheduler, server)
}

async fn channel(addr: &str, token: Option<&str>) -> ps_proto::auth::AuthChannel {
    channel_as(addr, token, Role::Worker).await
}

async fn channel_as(addr: &str, token: Option<&str>, role: Role) -> ps_proto::auth::AuthChannel {
    ps_tests::authed_channel(addr, &transport_as(token, role)).await
}

/// Asserts the scheduler's status lists one server, the real one at `addr`:
/// no rogue registration joined.
async fn assert_only_server(
    scheduler: &mut SchedulerClient<ps_proto::auth::AuthChannel>,
    addr: &str,
) {
    let status = scheduler
        .status(v1::StatusRequest {})
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        status.servers.len(),
        1,
        "no rogue server joined: {status:?}"
    );
    assert_eq!(status.servers[0].addr, addr);
}

fn assert_unauthenticated<T: std::fmt::Debug>(result: Result<T, tonic::Status>, what: &str) {
    let status = result.expect_err(what);
    assert_eq!(status.code(), Code::Unauthenticated, "{what}: {status:?}");
    assert!(status.message().contains("token"), "{what}: {status:?}");
}

#[tokio::test]
async fn without_the_token_nothing_is_answered_and_nothing_changes() {
    let (scheduler_addr, server_addr) = cluster("job-secret").await;
    let mut client = PsClient::connect(ClientConfig {
        scheduler: Some(scheduler_addr.clone()),
        transport: transport(Some("job-secret")),
        ..ClientConfig::new(Vec::new())
    })
    .await
    .expect("a client with the token joins");

    for token in [None, Some("guess")] {
        let mut scheduler = SchedulerClient::new(channel(&scheduler_addr, token).await);
        let rogue = v1::RegisterServerRequest {
            addr: "127.0.0.1:1".into(),
        };
        assert_unauthenticated(scheduler.register_server(rogue).await, "a rogue server");
        let thief = v1::RegisterWorkerRequest::default();
        assert_unauthenticated(scheduler.register_worker(thief).await, "rank theft");
        let leave = v1::HeartbeatRequest::default();
        assert_unauthenticated(scheduler.leave(leave).await, "a foreign Leave");
        let junk = v1::DeclareParamsRequest {
            params: vec![v1::DeclaredParam {
                name: "junk".into(),
                elements: u64::MAX,
                dtype: 0,
            }],
        };
        assert_unauthenticated(scheduler.declare_params(junk).await, "junk DeclareParams");
        assert_unauthenticated(scheduler.status(v1::StatusRequest {}).await, "Status");

        let mut server = ParameterServerClient::new(channel(&server_addr, token).await);
        assert_unauthenticated(server.stats(v1::StatsRequest {}).await, "server Stats");
        let pull = v1::PullRequest::default();
        assert_unauthenticated(server.pull(pull).await, "server Pull");
    }
    let health = ps_common::health::check(
        &server_addr,
        "",
        &TransportConfig::default(),
        std::time::Duration::from_secs(5),
    )
    .await;
    assert!(health.is_ok(), "health checks need no token: {health:?}");

    // The job is unharmed: one server in the map, and the client trains on it.
    let group = client.join("worker-0").await.expect("join");
    assert_eq!(group.workers, 1);
    let mut scheduler = SchedulerClient::new(channel(&scheduler_addr, Some("job-secret")).await);
    assert_only_server(&mut scheduler, &server_addr).await;
}

#[tokio::test]
async fn with_the_token_only_a_registration_s_owner_may_heartbeat_or_leave_for_it() {
    let scheduler_addr = scheduler("job-secret").await;
    let mut owner = SchedulerClient::new(channel(&scheduler_addr, Some("job-secret")).await);
    let registered = owner
        .register_server(v1::RegisterServerRequest {
            addr: "127.0.0.1:7070".into(),
        })
        .await
        .unwrap()
        .into_inner();
    let server = Some(v1::heartbeat_request::Node::ServerId(registered.server_id));
    let beat = |secret: &str| v1::HeartbeatRequest {
        node: server,
        step: 0,
        secret: secret.into(),
        ..v1::HeartbeatRequest::default()
    };

    let mut intruder = SchedulerClient::new(channel(&scheduler_addr, Some("job-secret")).await);
    for secret in ["", "guess"] {
        let refused = intruder
            .leave(beat(secret))
            .await
            .expect_err("a foreign Leave");
        assert_eq!(refused.code(), Code::PermissionDenied, "{refused:?}");
        assert!(refused.message().contains("server 0"), "{refused:?}");
        let refused = intruder
            .heartbeat(beat(secret))
            .await
            .expect_err("a foreign Heartbeat");
        assert_eq!(refused.code(), Code::PermissionDenied, "{refused:?}");
    }
    owner
        .heartbeat(beat(&registered.secret))
        .await
        .expect("the owner's heartbeat");
    let status = owner
        .status(v1::StatusRequest {})
        .await
        .unwrap()
        .into_inner();
    assert!(
        status.servers.iter().all(|s| s.alive && !s.left),
        "the foreign Leave changed nothing: {status:?}"
    );
    owner
        .leave(beat(&registered.secret))
        .await
        .expect("the owner's Leave");
}

fn assert_permission_denied<T: std::fmt::Debug>(result: Result<T, tonic::Status>, what: &str) {
    let status = result.expect_err(what);
    assert_eq!(status.code(), Code::PermissionDenied, "{what}: {status:?}");
    assert!(
        status.message().contains("line of the cluster token"),
        "{what}: {status:?}"
    );
}

#[tokio::test]
async fn with_role_secrets_only_a_server_registers_as_one_and_only_a_worker_takes_a_rank() {
    // The server registered with the server's secret: otherwise no map forms.
    let (scheduler_addr, server_addr) = cluster(ROLE_SECRETS).await;
    let secrets = Some(ROLE_SECRETS);

    let mut as_worker =
        SchedulerClient::new(channel_as(&scheduler_addr, secrets, Role::Worker).await);
    let rogue = v1::RegisterServerRequest {
        addr: "127.0.0.1:1".into(),
    };
    assert_permission_denied(
        as_worker.register_server(rogue).await,
        "a worker registering a server",
    );

    let mut as_server =
        SchedulerClient::new(channel_as(&scheduler_addr, secrets, Role::Server).await);
    let thief = v1::RegisterWorkerRequest {
        client_id: "thief".into(),
    };
    assert_permission_denied(
        as_server.register_worker(thief).await,
        "a server taking a rank",
    );
    let junk = v1::DeclareParamsRequest {
        params: vec![v1::DeclaredParam {
            name: "junk".into(),
            elements: 4,
            dtype: 0,
        }],
    };
    assert_permission_denied(
        as_server.declare_params(junk).await,
        "a server declaring parameters",
    );
    let mut server_as_server =
        ParameterServerClient::new(channel_as(&server_addr, secrets, Role::Server).await);
    let push = v1::PushRequest::default();
    assert_permission_denied(
        server_as_server.push(push).await,
        "a server pushing gradients",
    );

    // The worker's secret does a worker's work: join, place, register, push, pull.
    let mut client = PsClient::connect(ClientConfig {
        scheduler: Some(scheduler_addr.clone()),
        transport: transport_as(secrets, Role::Worker),
        ..ClientConfig::new(Vec::new())
    })
    .await
    .expect("a worker with its secret connects");
    let group = client.join("worker-0").await.expect("join");
    assert_eq!((group.rank, group.workers), (Rank(0), 1));
    client
        .place(&[ParamInfo {
            name: "w".into(),
            shape: vec![4],
            dtype: DType::F32,
        }])
        .await
        .expect("place");
    let values = |v: f32| vec![ParamBytes::new("w", Bytes::from(v.to_le_bytes().repeat(4)))];
    client
        .register(&values(1.0), &ps_client::optim::sgd(0.5))
        .await
        .expect("register");
    client
        .push(group.rank, Step(0), &values(2.0))
        .await
        .expect("push");
    let pulled = client.pull(Version(1)).await.expect("pull");
    let w = &pulled["w"];
    assert_eq!(
        (w.version, w.values.as_slice()),
        (Version(1), &[0.0; 4][..])
    );
    assert_only_server(&mut as_server, &server_addr).await;
}

#[tokio::test]
async fn a_restarted_scheduler_still_knows_who_owns_each_registration() {
    let dir = tempfile::tempdir().unwrap();
    let config = SchedulerConfig {
        state_file: Some(dir.path().join("scheduler.json")),
        transport: transport(Some("job-secret")),
        ..SchedulerConfig::default()
    };
    let start = |config: SchedulerConfig| async move {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let running = tokio::spawn(ps_scheduler::run(listener, config, async {
            stopped.await.ok();
        }));
        (addr, stop, running)
    };
    let (first, stop, running) = start(config.clone()).await;
    let registered = SchedulerClient::new(channel(&first, Some("job-secret")).await)
        .register_server(v1::RegisterServerRequest {
            addr: "127.0.0.1:7070".into(),
        })
        .await
        .unwrap()
        .into_inner();
    stop.send(()).unwrap();
    running
        .await
        .unwrap()
        .expect("the first scheduler stops cleanly");

    let (second, _stop, _running) = start(config).await;
    let beat = |secret: &str| v1::HeartbeatRequest {
        node: Some(v1::heartbeat_request::Node::ServerId(registered.server_id)),
        step: 0,
        secret: secret.into(),
        ..v1::HeartbeatRequest::default()
    };
    let mut scheduler = SchedulerClient::new(channel(&second, Some("job-secret")).await);
    // The first secret presented after the restart is not simply trusted.
    let refused = scheduler
        .leave(beat("guess"))
        .await
        .expect_err("a foreign Leave");
    assert_eq!(refused.code(), Code::PermissionDenied, "{refused:?}");
    scheduler
        .heartbeat(beat(&registered.secret))
        .await
        .expect("the owner's heartbeat after the restart");
}
