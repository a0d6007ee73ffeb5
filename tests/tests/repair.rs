//! Placement repair without sockets: a real `ps-server` service in this process,
//! reached over in-memory duplex streams, restarted empty behind the client's
//! back; the client classifies the failure and restores the keys from the
//! worker's copy, and a repair that cannot help ends within its budget.

use std::time::Duration;

use bytes::Bytes;
use ps_client::ParamBytes;
use ps_client::placement::ParamInfo;
use ps_client::retry::RetryPolicy;
use ps_client::{
    Action, ClientConfig, ClientError, LocalCopy, Outcome, PsClient, Recovering, Recovery, Repair,
    RepairBudget, sgd,
};
use ps_proto::codec::DType;
use ps_proto::consistency::Consistency;
use ps_proto::ids::{Rank, Step, Version};
use ps_server::config::ServerConfig;
use ps_tests::loopback::Loopback;

/// A server that applies every push at once.
fn asp() -> ServerConfig {
    ServerConfig {
        consistency: Consistency::Asp,
        workers: 1,
        ..ServerConfig::default()
    }
}

/// Little-endian `f32` bytes, as the wire carries them.
fn f32s(values: &[f32]) -> Bytes {
    values.iter().flat_map(|v| v.to_le_bytes()).collect()
}

async fn client(server: &Loopback) -> PsClient {
    let mut config = ClientConfig::new(vec!["loopback:1".into()]);
    config.retry = RetryPolicy {
        attempts: 3,
        initial_backoff: Duration::from_millis(1),
        max_backoff: Duration::from_millis(5),
        ..RetryPolicy::default()
    };
    let mut client = PsClient::over_channels(config, vec![("loopback:1".into(), server.channel())]);
    let info = ParamInfo {
        name: "w".into(),
        shape: vec![4],
        dtype: DType::F32,
    };
    client.place(&[info]).await.expect("place");
    client
}

fn copy(values: &[f32], version: u64) -> LocalCopy {
    LocalCopy {
        values: vec![ParamBytes::new("w", f32s(values))],
        version: Version(version),
        optimizer: sgd(1.0),
    }
}

/// A client of `server` with `w` registered at ones; the copy it registered.
async fn registered(server: &Loopback) -> (PsClient, LocalCopy) {
    let client = client(server).await;
    let initial = copy(&[1.0; 4], 0);
    let created = client
        .register(&initial.values, &initial.optimizer)
        .await
        .unwrap();
    assert!(created, "a fresh server takes the values");
    (client, initial)
}

async fn pull_w(client: &PsClient) -> (Vec<f32>, u64) {
    let pulled = client
        .pull(Version(0))
        .await
        .expect("pull")
        .remove("w")
        .unwrap();
    (pulled.values, pulled.version.get())
}

/// What a worker's recovery does after `error` failed step `step`, driving
/// `recovering` as the trainer does: `Ok` when placement was repaired and the
/// step can be repeated, otherwise the error it gives up with.
async fn recover(
    client: &mut PsClient,
    recovering: &mut Recovering,
    error: ClientError,
    step: Step,
    copy: &LocalCopy,
) -> Result<(), ClientError> {
    match recovering.step(Outcome::Failed(error.recovery(step))) {
        Some(Action::Repair(repair)) => client.recover(recovering, repair, error, step, copy).await,
        _ => Err(error),
    }
}

#[tokio::test]
async fn a_server_restarted_empty_gets_the_keys_back_from_the_workers_copy() {
    let server = Loopback::start(asp());
    let (mut client, _) = registered(&server).await;
    client
        .push(Rank(0), Step(0), &[ParamBytes::new("w", f32s(&[0.5; 4]))])
        .await
        .unwrap();
    let (values, version) = pull_w(&client).await;
    assert_eq!((values.as_slice(), version), (&[0.5; 4][..], 1));

    server.restart();
    let grads = [ParamBytes::new("w", f32s(&[0.25; 4]))];
    let error = client.push(Rank(0), Step(1), &grads).await.unwrap_err();
    assert_eq!(
        error.recovery(Step(1)),
        Recovery::Repair(Repair::KeysMissing),
        "{error}"
    );
    let mut recovering = Recovering::step_of_group(RepairBudget::default());
    let held = copy(&values, version);
    recover(&mut client, &mut recovering, error, Step(1), &held)
        .await
        .expect("repaired");
    assert_eq!(client.push(Rank(0), Step(1), &grads).await.unwrap(), 1);
    assert_eq!(
        pull_w(&client).await,
        (vec![0.25; 4], 2),
        "restored at version 1, then step 1"
    );
}

#[tokio::test]
async fn a_server_gone_for_good_ends_the_repair_within_its_budget() {
    let server = Loopback::start(asp());
    let (mut client, initial) = registered(&server).await;
    server.stop();
    let grads = [ParamBytes::new("w", f32s(&[0.5; 4]))];
    let error = client.push(Rank(0), Step(0), &grads).await.unwrap_err();
    let lost = Recovery::Repair(Repair::ServerLost);
    assert_eq!(error.recovery(Step(0)), lost, "{error}");
    let mut recovering = Recovering::step_of_group(RepairBudget::default());
    let gave_up = recover(&mut client, &mut recovering, error, Step(0), &initial)
        .await
        .unwrap_err();
    assert_eq!(gave_up.recovery(Step(0)), lost, "{gave_up}");
    assert_eq!(
        recovering.ready(),
        None,
        "budget spent: the recovery gave up"
    );
}

#[tokio::test]
async fn a_request_error_is_not_repaired() {
    let server = Loopback::start(asp());
    let (client, _) = registered(&server).await;
    let wrong = [ParamBytes::new("w", f32s(&[f32::NAN; 4]))];
    let error = client.push(Rank(0), Step(0), &wrong).await.unwrap_err();
    assert!(matches!(error, ClientError::Rpc { .. }));
    assert_eq!(error.recovery(Step(0)), Recovery::Fatal, "{error}");
    let mut recovering = Recovering::step_of_group(RepairBudget::default());
    assert_eq!(
        recovering.step(Outcome::Failed(error.recovery(Step(0)))),
        None,
        "given up at once, with no repair"
    );
}

/// The chaos run that hung: one server holds a BSP pull for a push that will
/// not come until the worker repairs the other server, which answers the same
/// pull with an error at once. The pull must end with that error then, so the
/// repair can run, not wait out the first server's pull timeout.
#[tokio::test]
async fn a_pull_fails_at_the_first_servers_error_while_another_server_holds_it() {
    let bsp = ServerConfig {
        consistency: Consistency::Bsp,
        workers: 2,
        ..ServerConfig::default()
    };
    let (holding, failing) = (Loopback::start(bsp.clone()), Loopback::start(bsp));
    let mut config = ClientConfig::new(vec!["holding:1".into(), "failing:1".into()]);
    config.pull_timeout = Duration::from_secs(30);
    let servers = vec![
        ("holding:1".into(), holding.channel()),
        ("failing:1".into(), failing.channel()),
    ];
    let mut client = PsClient::over_channels(config, servers);
    let names = ["a", "b", "c", "d"];
    let params: Vec<ParamInfo> = names
        .iter()
        .map(|name| ParamInfo {
            name: (*name).into(),
            shape: vec![4],
            dtype: DType::F32,
        })
        .collect();
    client.place(&params).await.expect("place");
    let values: Vec<ParamBytes> = names
        .iter()
        .map(|name| ParamBytes::new(*name, f32s(&[1.0; 4])))
        .collect();
    client.register(&values, &sgd(1.0)).await.expect("register");
    // Restarted empty: it answers NOT_FOUND at once. The other holds the pull
    // of version 1 until both workers push step 0, which neither does.
    failing.restart();
    let started = std::time::Instant::now();
    let error = client.pull(Version(1)).await.unwrap_err();
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "the error waited {:?} behind the held pull",
        started.elapsed()
    );
    // Its connection was cut by the restart, or it answered that it lacks the
    // keys: either way a repair of that server follows.
    assert!(
        matches!(
            error.recovery(Step(0)),
            Recovery::Repair(Repair::ServerLost | Repair::KeysMissing)
        ),
        "{error}"
    );
    assert!(error.to_string().contains("failing:1"), "{error}");
}
