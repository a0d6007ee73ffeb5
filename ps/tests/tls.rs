//! TLS: a server with a certificate from `ps_common::certs` serves pushes and
//! pulls over TLS, and refuses plain TCP, a client that trusts another CA, and,
//! with mutual TLS, a client without a certificate.

mod common;

use std::time::Duration;

use common::*;
use ps_common::certs::ClusterCerts;
use ps_common::health::{HealthError, check};
use ps_proto::tls::TlsConfig;
use ps_proto::transport::TransportConfig;
use ps_server::ServerConfig;

fn transport(tls: Option<TlsConfig>) -> TransportConfig {
    TransportConfig {
        tls,
        ..TransportConfig::default()
    }
}

async fn tls_server(tls: TlsConfig) -> TestServer {
    TestServer::start(ServerConfig {
        transport: transport(Some(tls)),
        ..ServerConfig::default()
    })
    .await
}

/// A health check of `server` over `tls`: what a client connecting that way gets.
async fn health(server: &TestServer, tls: Option<TlsConfig>) -> Result<(), HealthError> {
    let addr = server.addr.to_string();
    check(&addr, "", &transport(tls), Duration::from_secs(5)).await
}

fn certs() -> ClusterCerts {
    ClusterCerts::generate(&[], 1).expect("certificates")
}

#[tokio::test]
async fn pushes_and_pulls_go_over_tls() {
    let server = tls_server(certs().tls_config(false)).await;
    server
        .register(vec![param("w", &[1.0, 2.0], sgd(1.0))])
        .await;
    server
        .client
        .clone()
        .push(push(0, 0, vec![tensor("w", &[0.5, 0.5])]))
        .await
        .unwrap();
    assert_eq!(server.values("w").await, (vec![0.5, 1.5], 1));
    server.stop().await;
}

#[tokio::test]
async fn plain_tcp_to_a_tls_port_is_refused() {
    let server = tls_server(certs().tls_config(false)).await;
    let refused = health(&server, None).await;
    assert!(refused.is_err(), "plain TCP was answered: {refused:?}");
    server.stop().await;
}

#[tokio::test]
async fn a_client_that_trusts_another_ca_is_refused_by_its_own_check() {
    let server = tls_server(certs().tls_config(false)).await;
    let error = health(&server, Some(certs().tls_config(false)))
        .await
        .expect_err("a server signed by an unknown CA was trusted")
        .to_string();
    assert!(error.contains("invalid peer certificate"), "{error}");
    server.stop().await;
}

#[tokio::test]
async fn mutual_tls_refuses_a_client_without_a_certificate() {
    let cluster = certs();
    let server = tls_server(cluster.tls_config(true)).await;
    let anonymous = health(&server, Some(cluster.tls_config(false))).await;
    assert!(anonymous.is_err(), "a client without a certificate got in");
    let stranger = certs().tls_config(true);
    let foreign = TlsConfig {
        ca: cluster.ca_cert.clone().into_bytes(),
        ..stranger
    };
    let foreign = health(&server, Some(foreign)).await;
    assert!(
        foreign.is_err(),
        "a client certificate of another CA got in"
    );
    health(&server, Some(cluster.tls_config(true)))
        .await
        .expect("a member of the cluster");
    server.stop().await;
}

#[tokio::test]
async fn tls_to_a_plain_port_fails() {
    let server = TestServer::default().await;
    let result = health(&server, Some(certs().tls_config(false))).await;
    assert!(result.is_err(), "a plain server passed a TLS handshake");
    server.stop().await;
}

/// Over TLS too, a pull held for a BSP step past the idle limit keeps its
/// connection: the request is counted in flight through TLS's connection
/// information.
#[tokio::test]
async fn a_pull_held_over_tls_past_the_idle_limit_keeps_its_connection() {
    let mut transport = transport(Some(certs().tls_config(false)));
    transport.idle_connection_timeout = Some(Duration::from_millis(200));
    let server = TestServer::start(ServerConfig {
        transport,
        workers: 2,
        ..ServerConfig::default()
    })
    .await;
    a_held_pull_outlasts_the_idle_limit(&server, server.client.clone()).await;
    server.stop().await;
}
