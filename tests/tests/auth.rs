//! The cluster token over real gRPC: a scheduler and a parameter server started
//! with one refuse every request without it (or with another) with
//! `UNAUTHENTICATED`, rogue registrations change nothing, the health service
//! stays open, and a client with the token trains as before. With the token, a
//! registration's heartbeats and `Leave` still need its own secret.

use ps_client::{ClientConfig, PsClient};
use ps_proto::auth::ClusterToken;
use ps_proto::transport::{TransportConfig, http_uri};
use ps_proto::v1;
use ps_proto::v1::parameter_server_client::ParameterServerClient;
use ps_proto::v1::scheduler_client::SchedulerClient;
use ps_scheduler::SchedulerConfig;
use ps_server::ServerConfig;
use ps_server::follower::SchedulerLink;
use tonic::Code;

fn transport(token: Option<&str>) -> TransportConfig {
    TransportConfig {
        token: token.map(|t| ClusterToken::new(t).unwrap()),
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
        transport: transport(Some(token)),
        ..ServerConfig::default()
    };
    tokio::spawn(ps_server::run(listener, config, std::future::pending()));
    (scheduler, server)
}

async fn channel(addr: &str, token: Option<&str>) -> ps_proto::auth::AuthChannel {
    let transport = transport(token);
    let channel = transport
        .endpoint(http_uri(addr))
        .unwrap()
        .connect()
        .await
        .unwrap();
    transport.authed(channel)
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
    let status = SchedulerClient::new(channel(&scheduler_addr, Some("job-secret")).await)
        .status(v1::StatusRequest {})
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        status.servers.len(),
        1,
        "no rogue server joined: {status:?}"
    );
    assert_eq!(status.servers[0].addr, server_addr);
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
