//! The same-host data path end to end, over real servers on loopback: a
//! worker on the server's host pushes and pulls through shared memory, keys
//! larger than a gRPC message included, in `f32` and in bf16, with the
//! values gRPC gives; a
//! repeated push is applied once; `--data-path shm` against a server that
//! offers none fails naming why; the offer needs a worker's token; a server
//! that stops ends the region, and the client's next step reopens a session;
//! a session's rings are sized to the model placed.

use std::collections::BTreeMap;

use bytes::Bytes;
use ps_client::placement::ParamInfo;
use ps_client::{ClientConfig, ParamBytes, PsClient, optim};
use ps_cluster::LocalServers;
use ps_proto::auth::{ClusterToken, Role};
use ps_proto::codec::DType;
use ps_proto::ids::{Rank, Step, Version};
use ps_proto::transport::TransportConfig;
use ps_proto::v1;
use ps_proto::v1::parameter_server_client::ParameterServerClient;
use ps_server::ServerConfig;
use ps_server::config::SharedMemoryConfig;
use ps_shm::DataPathMode;
use tonic::Code;

/// 1.5 M values: 6 MiB, past the 4 MiB message limit.
const LARGE: usize = 3 << 19;

fn values(len: usize, f: impl Fn(usize) -> f32) -> Bytes {
    (0..len).flat_map(|i| f(i).to_le_bytes()).collect()
}

/// One BSP server for one worker offering shared memory as `mode` says.
async fn server(mode: DataPathMode, transport: TransportConfig) -> LocalServers {
    let config = ServerConfig {
        workers: 1,
        shared_memory: SharedMemoryConfig {
            mode,
            ring_bytes: 64 << 10,
        },
        transport,
        ..ServerConfig::default()
    };
    LocalServers::start(1, config).await.expect("a server")
}

/// A client taking `mode`, with `big` and `small` placed.
async fn client(addrs: Vec<String>, mode: DataPathMode) -> PsClient {
    client_placing(addrs, mode, &[("big", LARGE), ("small", 4)]).await
}

/// A client taking `mode`, with `keys` (names and lengths) placed.
async fn client_placing(
    addrs: Vec<String>,
    mode: DataPathMode,
    keys: &[(&str, usize)],
) -> PsClient {
    let config = ClientConfig {
        data_path: mode,
        ..ClientConfig::new(addrs)
    };
    let mut client = PsClient::connect(config).await.expect("connect");
    let infos: Vec<ParamInfo> = keys
        .iter()
        .map(|&(name, len)| ParamInfo {
            name: name.into(),
            shape: vec![len],
            dtype: DType::F32,
        })
        .collect();
    client.place(&infos).await.expect("place");
    client
}

/// The error of a step-0 push of `grads` that must be refused, as text.
async fn refusal(client: &PsClient, grads: &[ParamBytes]) -> String {
    client
        .push(Rank(0), Step(0), grads)
        .await
        .expect_err("the push is refused")
        .to_string()
}

/// Registers `big` (`i` at element `i`) and `small` (ones), with SGD at lr 0.5.
async fn register_big_and_small(client: &PsClient) {
    let initial = [
        ParamBytes::new("big", values(LARGE, |i| i as f32)),
        ParamBytes::new("small", values(4, |_| 1.0)),
    ];
    client
        .register(&initial, &optim::sgd(0.5))
        .await
        .expect("register");
}

/// Registers `big` and `small` and runs two SGD steps (lr 0.5) of gradients
/// `i`-dependent, the second pushed twice; the values pulled after each step.
async fn train(client: &PsClient) -> Vec<BTreeMap<String, Vec<f32>>> {
    register_big_and_small(client).await;
    let mut seen = Vec::new();
    for step in 0..2u64 {
        let grads = [
            ParamBytes::new("big", values(LARGE, |i| (i % 7) as f32 + step as f32)),
            ParamBytes::new("small", values(4, |i| i as f32)),
        ];
        let mut into = BTreeMap::new();
        let (taken, _) = client
            .push_then_pull_into((Rank(0), Step(step)), &grads, Version(step + 1), &mut into)
            .await
            .expect("a step");
        assert_eq!(taken, 2);
        if step == 1 {
            let again = client
                .push(Rank(0), Step(1), &grads)
                .await
                .expect("a repeat");
            assert_eq!(again, 0, "a repeated push is acknowledged, not applied");
        }
        let pulled = client.pull(Version(step + 1)).await.expect("pull");
        assert_eq!(pulled["big"].values, into["big"].values);
        seen.push(
            pulled
                .into_iter()
                .map(|(name, p)| (name, p.values))
                .collect(),
        );
    }
    seen
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shared_memory_trains_to_the_values_grpc_gives() {
    let shm = server(DataPathMode::Shm, TransportConfig::default()).await;
    let grpc = server(DataPathMode::Grpc, TransportConfig::default()).await;
    let through_shm = train(&client(shm.addrs(), DataPathMode::Shm).await).await;
    let through_grpc = train(&client(grpc.addrs(), DataPathMode::Grpc).await).await;
    assert_eq!(through_shm, through_grpc);
    // `auto` sends the 6 MiB key through shared memory too.
    let auto = server(DataPathMode::Auto, TransportConfig::default()).await;
    let through_auto = train(&client(auto.addrs(), DataPathMode::Auto).await).await;
    assert_eq!(through_auto, through_grpc);
    let big = &through_shm[1]["big"];
    let expected = |i: usize| i as f32 - 0.5 * ((i % 7) as f32) - 0.5 * ((i % 7) as f32 + 1.0);
    assert!(big.iter().enumerate().all(|(i, &v)| v == expected(i)));
}

/// A key that travels as bf16 is not kept as it travels: through shared
/// memory its payload is read off the ring into a buffer and widened, to the
/// values gRPC gives (an `f32` key's is read straight into the pulled buffer,
/// above).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bf16_key_pulled_through_shared_memory_widens_to_the_values_grpc_gives() {
    let mut pulled = Vec::new();
    for mode in [DataPathMode::Shm, DataPathMode::Grpc] {
        let servers = server(mode, TransportConfig::default()).await;
        let config = ClientConfig {
            data_path: mode,
            ..ClientConfig::new(servers.addrs())
        };
        let mut client = PsClient::connect(config).await.expect("connect");
        let info = ParamInfo {
            name: "half".into(),
            shape: vec![LARGE],
            dtype: DType::BF16,
        };
        client.place(&[info]).await.expect("place");
        // Whole numbers under 256 are exact in bf16: an f32's top half.
        let bf16: Bytes = (0..LARGE)
            .flat_map(|i| ((((i % 100) as f32).to_bits() >> 16) as u16).to_le_bytes())
            .collect();
        let initial = [ParamBytes::new("half", bf16)];
        client
            .register(&initial, &optim::sgd(0.5))
            .await
            .expect("register");
        let mut values = client.pull(Version(0)).await.expect("pull");
        pulled.push(values.remove("half").expect("pulled").values);
    }
    assert_eq!(pulled[0], pulled[1]);
    assert!(
        pulled[0]
            .iter()
            .enumerate()
            .all(|(i, &v)| v == (i % 100) as f32)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shm_against_a_server_offering_none_fails_naming_why() {
    let grpc = server(DataPathMode::Grpc, TransportConfig::default()).await;
    let client = client(grpc.addrs(), DataPathMode::Shm).await;
    // Registration is unary gRPC; the first push opens the session.
    client
        .register(
            &[ParamBytes::new("small", values(4, |_| 0.0))],
            &optim::sgd(1.0),
        )
        .await
        .expect("register");
    let grads = [ParamBytes::new("small", values(4, |_| 1.0))];
    let error = client.push(Rank(0), Step(0), &grads).await.unwrap_err();
    let text = error.to_string();
    assert!(
        text.contains("--data-path shm") && text.contains("offers none"),
        "{text}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_offer_needs_a_workers_token() {
    let secrets = "server=servers-secret\nworker=workers-secret\n";
    let transport_as = |role| TransportConfig {
        token: Some(
            ClusterToken::new(secrets)
                .unwrap()
                .presenting(role)
                .unwrap(),
        ),
        ..TransportConfig::default()
    };
    let servers = server(DataPathMode::Auto, transport_as(Role::Server)).await;
    let addr = &servers.addrs()[0];
    for (transport, expected) in [
        (TransportConfig::default(), Some(Code::Unauthenticated)),
        (transport_as(Role::Server), Some(Code::PermissionDenied)),
        (transport_as(Role::Worker), None),
    ] {
        let channel = ps_tests::authed_channel(addr, &transport).await;
        let offer = ParameterServerClient::new(channel)
            .offer_shared_memory(v1::SharedMemoryOfferRequest {})
            .await;
        match expected {
            Some(code) => assert_eq!(offer.unwrap_err().code(), code),
            None => assert_eq!(offer.unwrap().into_inner().nonce.len(), 32),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopped_server_ends_the_region_and_its_socket() {
    let servers = server(DataPathMode::Shm, TransportConfig::default()).await;
    let client = client(servers.addrs(), DataPathMode::Shm).await;
    client
        .register(
            &[ParamBytes::new("small", values(4, |_| 0.0))],
            &optim::sgd(1.0),
        )
        .await
        .expect("register");
    let grads = [ParamBytes::new("small", values(4, |_| 1.0))];
    assert_eq!(
        client.push(Rank(0), Step(0), &grads).await.expect("push"),
        1
    );
    let addr = servers.addrs()[0].clone();
    let channel = ps_tests::authed_channel(&addr, &TransportConfig::default()).await;
    let offer = ParameterServerClient::new(channel)
        .offer_shared_memory(v1::SharedMemoryOfferRequest {})
        .await
        .expect("an offer")
        .into_inner();
    servers.shutdown().await.expect("a clean stop");
    let error = client.push(Rank(0), Step(1), &grads).await.unwrap_err();
    assert!(error.to_string().contains(&addr), "{error}");
    // The socket went with the server: its last offer reaches nothing.
    let gone = ps_shm::connect(&offer).await.unwrap_err();
    assert!(
        matches!(gone, ps_shm::HandshakeError::NoSocket { .. }),
        "{gone}"
    );
}

/// The server's stats.
async fn stats(addr: &str) -> v1::StatsResponse {
    let channel = ps_tests::authed_channel(addr, &TransportConfig::default()).await;
    let stats = ParameterServerClient::new(channel)
        .stats(v1::StatsRequest {})
        .await
        .expect("stats");
    stats.into_inner()
}

/// Pushes the server applied so far.
async fn pushes(addr: &str) -> u64 {
    stats(addr).await.pushes
}

/// A large key a pull found in the server's values arena (its answer lent
/// from there) is read there again with no request, at each version it
/// reaches, with the values a request gives; a pull for a version the key
/// has not reached still goes to the server, and waits there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_large_key_pulled_once_is_read_again_from_the_arena_at_each_version() {
    read_again_from_the_arena_at_each_version(LARGE).await;
}

/// The same for a 4 KiB key, whose answers are copied through the ring:
/// the answer says where its values lie in the arena.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_small_key_pulled_once_is_read_again_from_the_arena_at_each_version() {
    read_again_from_the_arena_at_each_version(1024).await;
}

/// A key of `len` values pulled once, then read from the arena with no
/// request at each version it reaches (see the two tests above).
async fn read_again_from_the_arena_at_each_version(len: usize) {
    let servers = server(DataPathMode::Shm, TransportConfig::default()).await;
    let addr = servers.addrs()[0].clone();
    let client = client_placing(servers.addrs(), DataPathMode::Shm, &[("big", len)]).await;
    let initial = [ParamBytes::new("big", values(len, |i| i as f32))];
    let registered = client.register(&initial, &optim::sgd(0.5)).await;
    registered.expect("register");
    let pulls = async || stats(&addr).await.pulls;

    let first = client.pull(Version(0)).await.expect("a pull");
    let asked = pulls().await;
    let again = client.pull(Version(0)).await.expect("a pull");
    assert_eq!(again["big"].values, first["big"].values);
    assert_eq!(again["big"].version, Version(0));
    assert_eq!(pulls().await, asked, "read from the arena, not asked for");

    let grads = [ParamBytes::new("big", values(len, |i| (i % 5) as f32))];
    let mut into = BTreeMap::new();
    let (waiting, pushed) = tokio::join!(client.pull_into(Version(1), &mut into), async {
        // The pull of version 1 is at the server before the push that
        // brings it (or after: it then finds it there).
        client.push(Rank(0), Step(0), &grads).await.expect("a push")
    });
    waiting.expect("a pull that waited for version 1");
    assert_eq!(pushed, 1);
    let expected: Vec<f32> = (0..len).map(|i| i as f32 - 0.5 * (i % 5) as f32).collect();
    assert_eq!(into["big"].values, expected);
    assert_eq!(into["big"].version, Version(1));

    let asked = pulls().await;
    let read = client.pull(Version(1)).await.expect("a pull");
    assert_eq!(
        (read["big"].values.as_slice(), read["big"].version),
        (expected.as_slice(), Version(1))
    );
    assert_eq!(pulls().await, asked, "read from the arena again");
    let grpc = client_placing(servers.addrs(), DataPathMode::Grpc, &[("big", len)]).await;
    let requested = grpc.pull(Version(0)).await.expect("a pull over gRPC");
    assert_eq!(requested["big"].values, expected, "what a request gives");
}

/// The bytes of its memory budget that a server with 1 MiB rings
/// (`--shm-ring`) holds for the shared-memory session of a worker that has
/// one key of `len` values placed on it: what the session's first pull adds.
async fn session_bytes_for_a_key_of(len: usize) -> u64 {
    let config = ServerConfig {
        workers: 1,
        shared_memory: SharedMemoryConfig {
            mode: DataPathMode::Shm,
            ring_bytes: 1 << 20,
        },
        ..ServerConfig::default()
    };
    let servers = LocalServers::start(1, config).await.expect("a server");
    let config = ClientConfig {
        data_path: DataPathMode::Shm,
        ..ClientConfig::new(servers.addrs())
    };
    let mut client = PsClient::connect(config).await.expect("connect");
    let info = ParamInfo {
        name: "w".into(),
        shape: vec![len],
        dtype: DType::F32,
    };
    client.place(&[info]).await.expect("place");
    let initial = [ParamBytes::new("w", values(len, |_| 0.0))];
    client
        .register(&initial, &optim::sgd(1.0))
        .await
        .expect("register");
    let addr = &servers.addrs()[0];
    let before = stats(addr).await.memory_held_bytes;
    let pulled = client.pull(Version(0)).await.expect("a pull");
    assert_eq!(pulled["w"].values.len(), len);
    stats(addr).await.memory_held_bytes - before
}

/// A worker's rings are sized to what is placed on the server, within the
/// server's `--shm-ring`: a 4 KiB model's session holds the smallest region
/// (two rings of the smallest size), a 1 MiB model's the server's own (two 1 MiB rings),
/// and the memory budget is charged what each holds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sessions_rings_are_sized_to_the_model_placed() {
    let small = session_bytes_for_a_key_of(1 << 10).await;
    let smallest = ps_shm::ring::region_bytes(ps_shm::SMALLEST_RING_BYTES);
    assert!(
        (smallest..smallest + (64 << 10)).contains(&small),
        "a 4 KiB model's session holds {small} bytes, not about {smallest}"
    );
    let large = session_bytes_for_a_key_of(1 << 18).await;
    let own = ps_shm::ring::region_bytes(1 << 20);
    assert!(
        (own..own + (64 << 10)).contains(&large),
        "a 1 MiB model's session holds {large} bytes, not about {own}"
    );
}

/// `kill -9` of a worker process while it writes 16 MiB pushes through a
/// 64 KiB ring (so the kill lands inside one): no push is applied in part.
/// Every element moved by the same whole number of SGD steps, and the server
/// goes on serving a new worker through shared memory.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_killed_mid_write_leaves_no_torn_apply() {
    const SIZE: usize = 16 << 20;
    // Large enough that one push more or less shows in every element whose
    // gradient is not zero.
    const LR: f32 = 1000.0;
    let server = ps_tests::ServerProcess::start(&[
        "--consistency",
        "asp",
        "--max-tensor=64MiB",
        "--data-path",
        "shm",
        "--shm-ring",
        "64KiB",
    ])
    .await;
    let name = format!("kv-{SIZE}");
    let len = SIZE / 4;
    let grpc = ClientConfig {
        data_path: DataPathMode::Grpc,
        ..ClientConfig::new(vec![server.addr.clone()])
    };
    let mut client = PsClient::connect(grpc).await.expect("connect");
    let info = ParamInfo {
        name: name.clone(),
        shape: vec![len],
        dtype: DType::F32,
    };
    client.place(&[info]).await.expect("place");
    let initial = [ParamBytes::new(&name, values(len, |_| 0.5))];
    client
        .register(&initial, &optim::sgd(f64::from(LR)))
        .await
        .expect("register");

    let mut worker = tokio::process::Command::new(ps_tests::binary("ps-microbench"))
        .args(["kv-worker", "--servers", &server.addr, "--size", "16MiB"])
        .args([
            "--op",
            "push",
            "--window",
            "1",
            "--seconds",
            "60",
            "--index",
            "0",
        ])
        .args(["--data-path", "shm"])
        .env("RUST_LOG", "info")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("spawn a kv-worker");
    let _ = ps_tests::read_log_until(&mut worker, "go through shared memory").await;
    // Kill it during a push, a few pushes in.
    while pushes(&server.addr).await < 3 {
        tokio::task::yield_now().await;
    }
    worker.start_kill().expect("kill -9");
    worker.wait().await.expect("the worker ended");

    let pulled = client.pull(Version(0)).await.expect("pull");
    let got = &pulled[&name].values;
    // kv-worker's gradient: ((i % 97) - 48) * 1e-6; element 0 has the largest.
    let gradient = |i: usize| ((i % 97) as f32 - 48.0) * 1e-6;
    let steps = ((got[0] - 0.5) / (-LR * gradient(0))).round();
    assert!(steps >= 3.0, "{steps} pushes applied");
    for (i, &value) in got.iter().enumerate() {
        let expected = 0.5 - steps * LR * gradient(i);
        assert!(
            (value - expected).abs() < 2e-4,
            "element {i} is {value}, not {expected} as after {steps} whole pushes: a torn apply"
        );
    }
    let after = ClientConfig {
        data_path: DataPathMode::Shm,
        ..ClientConfig::new(vec![server.addr.clone()])
    };
    let mut again = PsClient::connect(after).await.expect("connect");
    let info = ParamInfo {
        name: name.clone(),
        shape: vec![len],
        dtype: DType::F32,
    };
    again.place(&[info]).await.expect("place");
    let grads = [ParamBytes::new(&name, values(len, gradient))];
    assert_eq!(
        again.push(Rank(7), Step(0), &grads).await.expect("a push"),
        1
    );
}

/// A push through shared memory past the server's memory budget is refused
/// with `RESOURCE_EXHAUSTED` naming the budget, and the session goes on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_push_past_the_budget_is_refused_and_the_session_goes_on() {
    let config = ServerConfig {
        workers: 1,
        memory_budget: 2 << 20,
        shared_memory: SharedMemoryConfig {
            mode: DataPathMode::Shm,
            ring_bytes: 64 << 10,
        },
        ..ServerConfig::default()
    };
    let servers = LocalServers::start(1, config).await.expect("a server");
    let config = ClientConfig {
        data_path: DataPathMode::Shm,
        ..ClientConfig::new(servers.addrs())
    };
    let mut client = PsClient::connect(config).await.expect("connect");
    let infos = [("small", 4), ("large", 1 << 20)].map(|(name, len)| ParamInfo {
        name: name.into(),
        shape: vec![len],
        dtype: DType::F32,
    });
    client.place(&infos).await.expect("place");
    client
        .register(
            &[ParamBytes::new("small", values(4, |_| 0.0))],
            &optim::sgd(1.0),
        )
        .await
        .expect("register");
    // 4 MiB of gradient for a key never registered: refused as it is read.
    let large = [ParamBytes::new("large", values(1 << 20, |_| 1.0))];
    let error = client.push(Rank(0), Step(0), &large).await.unwrap_err();
    let text = error.to_string();
    assert!(
        text.contains("ResourceExhausted") || text.contains("resource"),
        "{text}"
    );
    assert!(text.contains("memory-budget"), "{text}");
    let small = [ParamBytes::new("small", values(4, |_| 1.0))];
    assert_eq!(
        client.push(Rank(0), Step(0), &small).await.expect("a push"),
        1
    );
}

/// A push whose gradients hold NaN or infinity, through shared memory: the
/// server scans each piece of a large push as it copies it off the ring, and
/// a small one whole. The push is refused
/// naming the key and element, as over gRPC, whether the bad element is in
/// the first piece or far into a 6 MiB key; nothing of it is applied, and
/// the session goes on to take the same step's finite push. (A push the
/// client cuts into several requests is refused request by request.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_non_finite_gradient_through_shared_memory_is_refused_where_it_lies_and_changes_nothing()
{
    let shm = server(DataPathMode::Shm, TransportConfig::default()).await;
    let client = client(shm.addrs(), DataPathMode::Shm).await;
    register_big_and_small(&client).await;
    let finite = |i: usize| (i % 5) as f32;
    // The first piece and far into the 6 MiB key (scanned off the ring), and
    // a 16-byte key (under `SCAN_FROM_BYTES`: scanned by the store).
    let cases = [
        ("big", LARGE, 3, f32::NAN),
        ("big", LARGE, 1_234_567, f32::INFINITY),
        ("small", 4, 2, f32::NAN),
    ];
    for (name, len, bad, value) in cases {
        let grads = [ParamBytes::new(
            name,
            values(len, |i| if i == bad { value } else { finite(i) }),
        )];
        let text = refusal(&client, &grads).await;
        assert!(
            text.contains(name) && text.contains(&format!("at element {bad}")),
            "{text}"
        );
        assert!(
            text.contains("InvalidArgument") || text.contains("invalid"),
            "{text}"
        );
    }
    let unchanged = client.pull(Version(0)).await.expect("pull");
    assert!(
        unchanged["big"]
            .values
            .iter()
            .enumerate()
            .all(|(i, &v)| v == i as f32)
    );
    assert_eq!(unchanged["small"].values, [1.0; 4]);

    let grads = [
        ParamBytes::new("big", values(LARGE, finite)),
        ParamBytes::new("small", values(4, finite)),
    ];
    let taken = client.push(Rank(0), Step(0), &grads).await.expect("a push");
    assert_eq!(taken, 2, "the refused pushes took nothing of step 0");
    let pulled = client.pull(Version(1)).await.expect("pull");
    let big = &pulled["big"].values;
    assert!(
        big.iter()
            .enumerate()
            .all(|(i, &v)| v == i as f32 - 0.5 * finite(i))
    );
}

/// A server that allows non-finite values takes a large NaN through shared
/// memory (no test off the ring) and applies it, as over gRPC.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_allowing_non_finite_values_applies_a_large_nan_through_shared_memory() {
    let config = ServerConfig {
        workers: 1,
        reject_non_finite: false,
        shared_memory: SharedMemoryConfig {
            mode: DataPathMode::Shm,
            ring_bytes: 64 << 10,
        },
        ..ServerConfig::default()
    };
    let shm = LocalServers::start(1, config).await.expect("a server");
    let client = client(shm.addrs(), DataPathMode::Shm).await;
    register_big_and_small(&client).await;
    let bad = 1_234_567;
    let grads = [
        ParamBytes::new(
            "big",
            values(LARGE, |i| if i == bad { f32::NAN } else { 1.0 }),
        ),
        ParamBytes::new("small", values(4, |_| 1.0)),
    ];
    let taken = client.push(Rank(0), Step(0), &grads).await.expect("a push");
    assert_eq!(taken, 2);
    let pulled = client.pull(Version(1)).await.expect("pull");
    let big = &pulled["big"].values;
    assert!(big[bad].is_nan(), "{}", big[bad]);
    assert_eq!((big[0], big[bad + 1]), (-0.5, bad as f32 + 0.5));
}

/// One request carrying two gradients, the NaN in the second (past 1 MiB, so
/// scanned off the ring): refused naming that key, and neither applied.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_nan_in_a_requests_second_gradient_refuses_the_whole_request() {
    let shm = server(DataPathMode::Shm, TransportConfig::default()).await;
    let config = ClientConfig {
        data_path: DataPathMode::Shm,
        ..ClientConfig::new(shm.addrs())
    };
    let mut client = PsClient::connect(config).await.expect("connect");
    // `a` sorts first and is small, so it and `big` make one request.
    let infos = [("a", 4), ("big", LARGE)].map(|(name, len)| ParamInfo {
        name: name.into(),
        shape: vec![len],
        dtype: DType::F32,
    });
    client.place(&infos).await.expect("place");
    let initial = [
        ParamBytes::new("a", values(4, |_| 1.0)),
        ParamBytes::new("big", values(LARGE, |i| i as f32)),
    ];
    client
        .register(&initial, &optim::sgd(0.5))
        .await
        .expect("register");
    let grads = [
        ParamBytes::new("a", values(4, |_| 1.0)),
        ParamBytes::new(
            "big",
            values(LARGE, |i| if i == 77 { f32::NAN } else { 1.0 }),
        ),
    ];
    let text = refusal(&client, &grads).await;
    assert!(
        text.contains("big") && text.contains("at element 77"),
        "{text}"
    );
    let unchanged = client.pull(Version(0)).await.expect("pull");
    assert_eq!(
        unchanged["a"].values, [1.0; 4],
        "the request's first gradient is not applied either"
    );
    assert!(
        unchanged["big"]
            .values
            .iter()
            .enumerate()
            .all(|(i, &v)| v == i as f32)
    );
}
