//! Which role may call each method, over real gRPC with role secrets: every
//! method of the parameter server and of the scheduler, called once with the
//! workers' secret and once with the servers'. A method a role may not call is
//! refused with `PERMISSION_DENIED` before its handler runs; one it may call
//! gets its handler's answer (often another refusal: the requests are empty).

use ps_proto::auth::{AuthChannel, ClusterToken, Role};
use ps_proto::transport::TransportConfig;
use ps_proto::v1;
use ps_proto::v1::parameter_server_client::ParameterServerClient;
use ps_proto::v1::scheduler_client::SchedulerClient;
use ps_scheduler::SchedulerConfig;
use ps_server::ServerConfig;
use tonic::{Code, Status};

const ROLE_SECRETS: &str = "server=the-servers-secret\nworker=the-workers-secret\n";

/// Who may call a method: the workers, the servers, or both.
#[derive(Debug, Clone, Copy)]
enum May {
    Workers,
    Servers,
    Both,
}

impl May {
    fn allows(self, role: Role) -> bool {
        matches!(
            (self, role),
            (May::Both, _) | (May::Workers, Role::Worker) | (May::Servers, Role::Server)
        )
    }
}

fn transport_as(role: Role) -> TransportConfig {
    TransportConfig {
        token: Some(
            ClusterToken::new(ROLE_SECRETS)
                .unwrap()
                .presenting(role)
                .unwrap(),
        ),
        ..TransportConfig::default()
    }
}

async fn channel_as(addr: &str, role: Role) -> AuthChannel {
    ps_tests::authed_channel(addr, &transport_as(role)).await
}

async fn listener() -> (tokio::net::TcpListener, String) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    (listener, addr)
}

/// The role refusal, told from a handler's own `PERMISSION_DENIED` (a
/// heartbeat for another's registration) by the line it names.
fn refused_for_role(answer: &Result<(), Status>) -> bool {
    answer.as_ref().is_err_and(|status| {
        status.code() == Code::PermissionDenied
            && status.message().contains("line of the cluster token")
    })
}

fn check(method: &str, may: May, role: Role, answer: Result<(), Status>) {
    assert_eq!(
        refused_for_role(&answer),
        !may.allows(role),
        "{method} as a {role:?}: {answer:?}"
    );
}

#[tokio::test]
async fn each_parameter_server_method_takes_only_its_roles() {
    let (listener, addr) = listener().await;
    let config = ServerConfig {
        transport: transport_as(Role::Server),
        ..ServerConfig::default()
    };
    tokio::spawn(ps_server::run(listener, config, std::future::pending()));
    for role in [Role::Worker, Role::Server] {
        let mut server = ParameterServerClient::new(channel_as(&addr, role).await);
        let pull = || v1::PullRequest {
            timeout_ms: 1,
            ..v1::PullRequest::default()
        };
        let calls = [
            (
                "JoinGroup",
                May::Workers,
                server
                    .join_group(v1::JoinGroupRequest::default())
                    .await
                    .map(drop),
            ),
            (
                "Register",
                May::Workers,
                server
                    .register(v1::RegisterRequest::default())
                    .await
                    .map(drop),
            ),
            (
                "RegisterStream",
                May::Workers,
                server
                    .register_stream(futures::stream::empty())
                    .await
                    .map(drop),
            ),
            (
                "Push",
                May::Workers,
                server.push(v1::PushRequest::default()).await.map(drop),
            ),
            (
                "PushStream",
                May::Workers,
                server.push_stream(futures::stream::empty()).await.map(drop),
            ),
            ("Pull", May::Workers, server.pull(pull()).await.map(drop)),
            (
                "PullStream",
                May::Workers,
                server.pull_stream(pull()).await.map(drop),
            ),
            (
                "DeclareTable",
                May::Workers,
                server
                    .declare_table(v1::DeclareTableRequest::default())
                    .await
                    .map(drop),
            ),
            (
                "PullRows",
                May::Workers,
                server
                    .pull_rows(v1::PullRowsRequest::default())
                    .await
                    .map(drop),
            ),
            (
                "PushRows",
                May::Workers,
                server
                    .push_rows(v1::PushRowsRequest::default())
                    .await
                    .map(drop),
            ),
            (
                "Session",
                May::Workers,
                server.session(futures::stream::empty()).await.map(drop),
            ),
            (
                "OfferSharedMemory",
                May::Workers,
                server
                    .offer_shared_memory(v1::SharedMemoryOfferRequest {})
                    .await
                    .map(drop),
            ),
            (
                "Stats",
                May::Both,
                server.stats(v1::StatsRequest {}).await.map(drop),
            ),
            (
                "Checkpoint",
                May::Servers,
                server.checkpoint(v1::CheckpointRequest {}).await.map(drop),
            ),
        ];
        let tested: Vec<&str> = calls.iter().map(|(method, ..)| *method).collect();
        let table: Vec<&str> = ps_server::methods::METHODS.iter().map(|m| m.name).collect();
        assert_eq!(tested, table, "every method in the table is called here");
        for (method, may, answer) in calls {
            check(method, may, role, answer);
        }
    }
}

#[tokio::test]
async fn each_scheduler_method_takes_only_its_roles() {
    let (listener, addr) = listener().await;
    let config = SchedulerConfig {
        transport: transport_as(Role::Server),
        ..SchedulerConfig::default()
    };
    tokio::spawn(ps_scheduler::run(listener, config, std::future::pending()));
    for role in [Role::Worker, Role::Server] {
        let mut scheduler = SchedulerClient::new(channel_as(&addr, role).await);
        let calls = [
            (
                "RegisterServer",
                May::Servers,
                scheduler
                    .register_server(v1::RegisterServerRequest::default())
                    .await
                    .map(drop),
            ),
            (
                "RegisterWorker",
                May::Workers,
                scheduler
                    .register_worker(v1::RegisterWorkerRequest::default())
                    .await
                    .map(drop),
            ),
            (
                "Heartbeat",
                May::Both,
                scheduler
                    .heartbeat(v1::HeartbeatRequest::default())
                    .await
                    .map(drop),
            ),
            (
                "Leave",
                May::Both,
                scheduler
                    .leave(v1::HeartbeatRequest::default())
                    .await
                    .map(drop),
            ),
            (
                "DeclareParams",
                May::Workers,
                scheduler
                    .declare_params(v1::DeclareParamsRequest::default())
                    .await
                    .map(drop),
            ),
            (
                "GetShardMap",
                May::Both,
                scheduler
                    .get_shard_map(v1::GetShardMapRequest {
                        timeout_ms: 1,
                        ..v1::GetShardMapRequest::default()
                    })
                    .await
                    .map(drop),
            ),
            (
                "Barrier",
                May::Workers,
                scheduler
                    .barrier(v1::BarrierRequest::default())
                    .await
                    .map(drop),
            ),
            (
                "Status",
                May::Both,
                scheduler.status(v1::StatusRequest {}).await.map(drop),
            ),
        ];
        for (method, may, answer) in calls {
            check(method, may, role, answer);
        }
    }
}
