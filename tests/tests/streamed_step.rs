//! `PsClient::push_then_pull_streamed`, the exchange a segmented backward pass
//! feeds: a segment's keys are pushed, and complete their step, while later
//! segments have not been given yet; a parameter given in two segments of one
//! step is refused, as its second push would be taken as a repeat.

use std::collections::BTreeMap;
use std::time::Duration;

use bytes::Bytes;
use ps_client::placement::ParamInfo;
use ps_client::{ClientConfig, ClientError, ParamBytes, PsClient, optim};
use ps_cluster::test_cluster;
use ps_proto::codec::DType;
use ps_proto::ids::{Rank, Step, Version};
use tokio::sync::mpsc;
use tokio_stream::wrappers::UnboundedReceiverStream;

const LEN: usize = 4;

fn filled(name: &str, value: f32) -> ParamBytes {
    let bytes: Vec<u8> = std::iter::repeat_n(value.to_le_bytes(), LEN)
        .flatten()
        .collect();
    ParamBytes::new(name, Bytes::from(bytes))
}

/// A client that has placed `names` (each `LEN` values).
async fn client(addrs: Vec<String>, names: &[&str]) -> PsClient {
    let mut client = PsClient::connect(ClientConfig::new(addrs)).await.unwrap();
    let infos: Vec<ParamInfo> = names
        .iter()
        .map(|name| ParamInfo {
            name: (*name).into(),
            shape: vec![LEN],
            dtype: DType::F32,
        })
        .collect();
    client.place(&infos).await.unwrap();
    client
}

/// The one worker of a BSP group, with `a` and `b` registered at zero under SGD
/// with learning rate 1, and the cluster's addresses.
async fn worker_and_cluster() -> (PsClient, ps_cluster::servers::LocalServers) {
    let cluster = test_cluster(2, 1).await;
    let worker = client(cluster.addrs(), &["a", "b"]).await;
    let zeros = [filled("a", 0.0), filled("b", 0.0)];
    worker.register(&zeros, &optim::sgd(1.0)).await.unwrap();
    (worker, cluster)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_segment_is_pushed_before_the_next_is_given() {
    let (worker, cluster) = worker_and_cluster().await;
    // Another client that knows only `a`: its pull waits for `a`'s step alone.
    let observer = client(cluster.addrs(), &["a"]).await;
    let (segments, given) = mpsc::unbounded_channel();
    segments.send(vec![filled("a", 1.0)]).unwrap();
    let mut into = BTreeMap::new();
    let exchange = worker.push_then_pull_streamed(
        (Rank(0), Step(0)),
        UnboundedReceiverStream::new(given),
        Version(1),
        &mut into,
    );
    let observe = async {
        let pulled = tokio::time::timeout(Duration::from_secs(30), observer.pull(Version(1)))
            .await
            .expect("`a` completed its step while `b` was not given yet")
            .unwrap();
        segments.send(vec![filled("b", 2.0)]).unwrap();
        drop(segments);
        pulled
    };
    let (exchanged, observed) = tokio::join!(exchange, observe);
    let (taken, _) = exchanged.unwrap();
    assert_eq!(taken, 2, "both keys took their push");
    assert_eq!(observed["a"].values, [-1.0; LEN]);
    assert_eq!(into["a"].values, [-1.0; LEN]);
    assert_eq!(into["b"].values, [-2.0; LEN]);
    drop((worker, observer));
    cluster.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_parameter_in_two_segments_of_a_step_is_refused() {
    let (worker, cluster) = worker_and_cluster().await;
    let segments = vec![
        vec![filled("a", 1.0)],
        vec![filled("b", 1.0), filled("a", 1.0)],
    ];
    let mut into = BTreeMap::new();
    let refused = worker
        .push_then_pull_streamed(
            (Rank(0), Step(0)),
            futures::stream::iter(segments),
            Version(1),
            &mut into,
        )
        .await
        .unwrap_err();
    assert!(
        matches!(&refused, ClientError::Usage(m) if m.contains("a is in two segments")),
        "{refused}"
    );
    drop(worker);
    cluster.shutdown().await.unwrap();
}
