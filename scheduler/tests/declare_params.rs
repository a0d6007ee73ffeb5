//! `DeclareParams` over real gRPC: declarations whose bytes overflow or pass the
//! scheduler's bound are refused with a message naming the parameter, and a
//! model within it is declared afterwards.

use ps_proto::codec::DType;
use ps_proto::transport::http_uri;
use ps_proto::v1;
use ps_proto::v1::scheduler_client::SchedulerClient;
use ps_scheduler::SchedulerConfig;
use tonic::Code;
use tonic::transport::Channel;

async fn scheduler() -> SchedulerClient<Channel> {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let config = SchedulerConfig {
        workers: 1.into(),
        ..SchedulerConfig::default()
    };
    tokio::spawn(ps_scheduler::run(listener, config, std::future::pending()));
    SchedulerClient::connect(http_uri(&addr)).await.unwrap()
}

/// A parameter as declared: name, elements, dtype.
type Declared = (&'static str, u64, DType);

fn declare(params: &[Declared]) -> v1::DeclareParamsRequest {
    v1::DeclareParamsRequest {
        params: params
            .iter()
            .map(|&(name, elements, dtype)| v1::DeclaredParam {
                name: name.into(),
                elements,
                dtype: dtype.to_proto(),
            })
            .collect(),
    }
}

#[tokio::test]
async fn declarations_past_the_bound_are_refused_by_name() {
    let client = scheduler().await;
    let cases: [(&str, &[Declared], &str); 3] = [
        (
            "elements that overflow",
            &[("huge", u64::MAX, DType::F32)],
            "huge",
        ),
        (
            "ten trillion floats",
            &[("w", 10_000_000_000_000, DType::F32)],
            "w",
        ),
        (
            "two parameters that pass it together",
            &[
                ("a", 150_000_000_000, DType::F32),
                ("b", 150_000_000_000, DType::F32),
            ],
            "b",
        ),
    ];
    for (what, params, named) in cases {
        let status = client
            .clone()
            .declare_params(declare(params))
            .await
            .expect_err(what);
        assert_eq!(status.code(), Code::InvalidArgument, "{what}: {status:?}");
        let message = status.message();
        assert!(
            message.contains(&format!("parameter {named} ")) && message.contains("1 TiB"),
            "{what}: {message}"
        );
    }
    client
        .clone()
        .declare_params(declare(&[("w", 1 << 20, DType::F32)]))
        .await
        .expect("a model within the bound is declared");
}
