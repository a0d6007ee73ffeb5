//! [`Access`]: one tower service in front of a gRPC service that decides, per
//! method, which role may call it, and records every answer (method, status
//! code, time taken) in one place, so that no handler repeats either.
//!
//! It sits inside the token check (`TransportConfig::guarded`), which puts the
//! roles the caller's secret grants into the request's extensions; here a
//! method's [`Allowed`] is compared with them. Without a cluster token every
//! caller may call everything, as before. Methods not in the table (an unknown
//! path) pass through untouched, so the service answers `UNIMPLEMENTED` itself.

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use ps_proto::auth::{Granted, Role};
use tonic::body::Body;
use tonic::server::NamedService;
use tonic::{Code, Status};

/// Who may call a method.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Allowed {
    /// Only a holder of the given role's secret.
    Only(Role),
    /// Any holder of the cluster token, whatever its role.
    AnyRole,
}

/// One method of a service: its gRPC name and who may call it. Its request
/// path is the service's name and its own (`/ps.v1.ParameterServer/Push`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Method {
    /// The method's name as the path and metrics name it (`Push`).
    pub name: &'static str,
    /// Who may call it.
    pub allowed: Allowed,
}

/// The method a request path names, when the path is one of `service`'s
/// (`/ps.v1.ParameterServer/Push` → `Push`).
fn method_name<'p>(path: &'p str, service: &str) -> Option<&'p str> {
    path.strip_prefix('/')?
        .strip_prefix(service)?
        .strip_prefix('/')
}

/// Receives every answer of a method in the table.
pub trait Answers: Send + Sync + 'static {
    /// `method` answered with `code` after `took`.
    fn answered(&self, method: &'static str, code: Code, took: Duration);
}

/// `inner`, with each method's role checked and each answer recorded.
#[derive(Clone)]
pub struct Access<S> {
    inner: S,
    methods: &'static [Method],
    answers: Option<Arc<dyn Answers>>,
}

impl<S> std::fmt::Debug for Access<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Access")
            .field("methods", &self.methods.len())
            .field("answers", &self.answers.is_some())
            .finish_non_exhaustive()
    }
}

impl<S> Access<S> {
    /// `inner`, guarded by `methods`; answers go to `answers` when given.
    pub fn new(inner: S, methods: &'static [Method], answers: Option<Arc<dyn Answers>>) -> Self {
        Self {
            inner,
            methods,
            answers,
        }
    }
}

impl<S: NamedService> NamedService for Access<S> {
    const NAME: &'static str = S::NAME;
}

/// The refusal of a caller whose secret does not grant `role`.
pub fn refusal(method: &str, role: Role) -> Status {
    let role = role.name();
    Status::permission_denied(format!(
        "{method} is for a {role}, and this request carries another role's secret: give the {role} the `{role}=` line of the cluster token"
    ))
}

/// Whether a caller granted `granted` (none: no cluster token) may call `method`.
pub fn check(method: &Method, granted: Option<&Granted>) -> Result<(), Status> {
    match (method.allowed, granted) {
        (Allowed::Only(role), Some(granted)) if !granted.allows(role) => {
            Err(refusal(method.name, role))
        }
        _ => Ok(()),
    }
}

/// The status code of an answer: the `grpc-status` header of a refusal sent
/// without a body, otherwise OK (an answer with a body sends its status in
/// trailers, after the body; the services here refuse before any body).
fn code_of(response: &http::Response<Body>) -> Code {
    response
        .headers()
        .get("grpc-status")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<i32>().ok())
        .map_or(Code::Ok, Code::from_i32)
}

impl<S, B> tower::Service<http::Request<B>> for Access<S>
where
    S: tower::Service<http::Request<B>, Response = http::Response<Body>, Error = Infallible>,
    S: NamedService,
    S::Future: Send + 'static,
{
    type Response = http::Response<Body>;
    type Error = Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, Infallible>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<B>) -> Self::Future {
        let name = method_name(request.uri().path(), S::NAME);
        let method = name.and_then(|name| self.methods.iter().find(|m| m.name == name));
        let Some(method) = method.copied() else {
            return Box::pin(self.inner.call(request));
        };
        let started = Instant::now();
        let answers = self.answers.clone();
        let record = move |code| {
            if let Some(answers) = &answers {
                answers.answered(method.name, code, started.elapsed());
            }
        };
        if let Err(status) = check(&method, request.extensions().get::<Granted>()) {
            record(status.code());
            return Box::pin(std::future::ready(Ok(status.into_http())));
        }
        let answer = self.inner.call(request);
        Box::pin(async move {
            let response = answer.await?;
            record(code_of(&response));
            Ok(response)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Mutex;
    use tower::{Service, ServiceExt};

    const METHODS: &[Method] = &[
        Method {
            name: "Push",
            allowed: Allowed::Only(Role::Worker),
        },
        Method {
            name: "Stats",
            allowed: Allowed::AnyRole,
        },
    ];

    #[derive(Default)]
    struct Recorded(Mutex<Vec<(&'static str, Code)>>);

    impl Answers for Recorded {
        fn answered(&self, method: &'static str, code: Code, _took: Duration) {
            self.0.lock().unwrap().push((method, code));
        }
    }

    /// A service `t.T` that answers every request OK, or NOT_FOUND on `/t.T/Stats`.
    #[derive(Clone)]
    struct Inner;

    impl NamedService for Inner {
        const NAME: &'static str = "t.T";
    }

    impl Service<http::Request<()>> for Inner {
        type Response = http::Response<Body>;
        type Error = Infallible;
        type Future = std::future::Ready<Result<http::Response<Body>, Infallible>>;

        fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
            Poll::Ready(Ok(()))
        }

        fn call(&mut self, request: http::Request<()>) -> Self::Future {
            std::future::ready(Ok(match request.uri().path() {
                "/t.T/Stats" => Status::not_found("no such thing").into_http(),
                _ => http::Response::new(Body::empty()),
            }))
        }
    }

    fn request(path: &str, granted: Option<Role>) -> http::Request<()> {
        let mut request = http::Request::builder().uri(path).body(()).unwrap();
        if let Some(role) = granted {
            request.extensions_mut().insert(Granted::only(role));
        }
        request
    }

    async fn call(path: &str, granted: Option<Role>, recorded: &Arc<Recorded>) -> Code {
        let answers: Arc<dyn Answers> = recorded.clone();
        let mut access = Access::new(Inner, METHODS, Some(answers));
        let response = access
            .ready()
            .await
            .unwrap()
            .call(request(path, granted))
            .await
            .unwrap();
        code_of(&response)
    }

    #[tokio::test]
    async fn each_method_takes_its_roles_and_every_answer_is_recorded() {
        let recorded = Arc::new(Recorded::default());
        let cases = [
            ("/t.T/Push", Some(Role::Worker), Code::Ok),
            ("/t.T/Push", Some(Role::Server), Code::PermissionDenied),
            ("/t.T/Push", None, Code::Ok),
            ("/t.T/Stats", Some(Role::Server), Code::NotFound),
            ("/t.T/Stats", Some(Role::Worker), Code::NotFound),
            ("/t.T/Other", Some(Role::Server), Code::Ok),
            ("/u.U/Push", Some(Role::Server), Code::Ok),
            ("/t.TPush", Some(Role::Server), Code::Ok),
        ];
        for (path, granted, code) in cases {
            assert_eq!(
                call(path, granted, &recorded).await,
                code,
                "{path} {granted:?}"
            );
        }
        assert_eq!(
            *recorded.0.lock().unwrap(),
            [
                ("Push", Code::Ok),
                ("Push", Code::PermissionDenied),
                ("Push", Code::Ok),
                ("Stats", Code::NotFound),
                ("Stats", Code::NotFound),
            ],
            "unknown paths and other services' paths are not recorded"
        );
    }

    #[test]
    fn the_refusal_names_the_method_and_the_line_to_use() {
        let push = &METHODS[0];
        let status = check(push, Some(&Granted::only(Role::Server))).unwrap_err();
        assert_eq!(status.code(), Code::PermissionDenied);
        assert!(status.message().contains("Push is for a worker"));
        assert!(status.message().contains("`worker=` line"));
    }
}
