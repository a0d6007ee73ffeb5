//! [`MetricsPorts`]: the metrics listeners of an in-process cluster's parts
//! (`ps-local --metrics-listen`). Each part serves its own exposition on its
//! own port, as it would in its own process: from the given port up, the
//! scheduler first, then the servers, then the workers by rank; with port 0,
//! each part gets a free port of its own. Each listener is logged with the part
//! it serves.

use std::net::SocketAddr;

use tokio::net::TcpListener;

/// Hands out one metrics listener per part of the cluster.
#[derive(Debug)]
pub struct MetricsPorts {
    base: Option<SocketAddr>,
    handed_out: u16,
}

impl MetricsPorts {
    /// Listeners from `base` up; none at all without one.
    pub fn new(base: Option<SocketAddr>) -> Self {
        Self {
            base,
            handed_out: 0,
        }
    }

    /// The next part's listener, bound now, or `None` when metrics are off.
    ///
    /// # Errors
    /// When the port cannot be listened on (or the range passes 65535); the
    /// message names the part and the address.
    pub async fn next(&mut self, part: &str) -> std::io::Result<Option<TcpListener>> {
        let Some(base) = self.base else {
            return Ok(None);
        };
        let addr = match base.port() {
            0 => base,
            port => {
                let port = port.checked_add(self.handed_out).ok_or_else(|| {
                    std::io::Error::other(format!(
                        "--metrics-listen {base}: no port left for {part} past 65535"
                    ))
                })?;
                SocketAddr::new(base.ip(), port)
            }
        };
        self.handed_out += 1;
        let listener = TcpListener::bind(addr).await.map_err(|e| {
            std::io::Error::new(
                e.kind(),
                format!("cannot listen for {part}'s metrics on {addr}: {e}"),
            )
        })?;
        let bound = listener.local_addr()?;
        tracing::info!(part, addr = %bound, "part metrics listening");
        Ok(Some(listener))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn parts_get_consecutive_ports_from_the_base() {
        // A free port with room above it: bind one, free it, use it as the base.
        let probe = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let base = probe.local_addr().unwrap();
        drop(probe);
        let mut ports = MetricsPorts::new(Some(base));
        let Ok(Some(first)) = ports.next("scheduler").await else {
            // Another process took the port in between; nothing to check.
            return;
        };
        assert_eq!(first.local_addr().unwrap(), base);
        if let Ok(Some(second)) = ports.next("server 0").await {
            assert_eq!(second.local_addr().unwrap().port(), base.port() + 1);
        }
    }

    #[tokio::test]
    async fn port_zero_gives_each_part_a_free_port_and_none_gives_nothing() {
        let mut ports = MetricsPorts::new(Some("127.0.0.1:0".parse().unwrap()));
        let a = ports.next("server 0").await.unwrap().unwrap();
        let b = ports.next("server 1").await.unwrap().unwrap();
        assert_ne!(a.local_addr().unwrap(), b.local_addr().unwrap());
        let mut off = MetricsPorts::new(None);
        assert!(off.next("scheduler").await.unwrap().is_none());
    }

    #[tokio::test]
    async fn a_port_in_use_names_the_part_and_the_address() {
        let taken = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = taken.local_addr().unwrap();
        let error = MetricsPorts::new(Some(addr))
            .next("worker 1")
            .await
            .unwrap_err();
        let message = error.to_string();
        assert!(
            message.contains("worker 1") && message.contains(&addr.to_string()),
            "{message}"
        );
    }
}
