//! The checks a client start makes before Mooncake's `setup`, which holds the GIL and,
//! against an address that does not answer, retries for a long time and then blames the
//! master whatever was wrong.
//!
//! 1. Something accepts connections at `master_address` ([`check_reachable`]).
//! 2. An `http://` metadata server answers an HTTP request ([`check_metadata_answers`]):
//!    accepting connections is not enough, since a frozen `mooncake_master` (SIGSTOP) or a
//!    port held by something else accepts and never answers. Any HTTP answer will do (the
//!    master's metadata server answers a `GET` without a key with 400). Other kinds (etcd,
//!    `P2PHANDSHAKE`) are not checked.
//!
//! Each check waits at most [`REACH_TIMEOUT`] per address, the HTTP answer at most
//! `mooncake.rpc_timeout_ms` (capped at the same), and names the setting and its value.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream, ToSocketAddrs};
use std::time::{Duration, Instant};

use super::{MooncakeError, MooncakeSettings};
use crate::config::MooncakeConfig;

/// How long a reachability check waits per address.
pub(super) const REACH_TIMEOUT: Duration = Duration::from_secs(3);

/// Fails fast when nothing listens at `address` (`HOST:PORT`) of `setting`.
pub(super) fn check_reachable(setting: &'static str, address: &str) -> Result<(), MooncakeError> {
    connect(setting, address, REACH_TIMEOUT).map(drop)
}

/// Fails when the `http://` metadata server of `settings` does not accept connections
/// ([`MooncakeError::Unreachable`]) or gives no HTTP answer in time
/// ([`MooncakeError::MetadataSilent`]).
pub(super) fn check_metadata_answers(settings: &MooncakeSettings) -> Result<(), MooncakeError> {
    let url = &settings.metadata_server;
    let Some((host_port, path)) = http_host_port(url) else {
        return Ok(());
    };
    let timeout = Duration::from_millis(settings.rpc_timeout_ms.max(1)).min(REACH_TIMEOUT);
    let mut stream = connect("mooncake.metadata_server", host_port, REACH_TIMEOUT)?;
    let started = Instant::now();
    match http_answer(&mut stream, host_port, path, timeout) {
        Answer::Http => Ok(()),
        other => Err(MooncakeError::MetadataSilent {
            metadata_server: url.clone(),
            waited_ms: u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX),
            what: other.as_str(),
            suggested: MooncakeConfig {
                master_address: settings.master_address.clone(),
                metadata_server: String::new(),
                ..MooncakeConfig::default()
            }
            .effective_metadata_server(),
        }),
    }
}

/// A connection to `address` of `setting`, or why there is none.
fn connect(
    setting: &'static str,
    address: &str,
    timeout: Duration,
) -> Result<TcpStream, MooncakeError> {
    let unreachable = |source| MooncakeError::Unreachable {
        setting,
        address: address.to_string(),
        source,
    };
    let candidates: Vec<SocketAddr> = address.to_socket_addrs().map_err(unreachable)?.collect();
    let mut last_error = None;
    for candidate in candidates {
        match TcpStream::connect_timeout(&candidate, timeout) {
            Ok(stream) => return Ok(stream),
            Err(err) => last_error = Some(err),
        }
    }
    Err(unreachable(last_error.unwrap_or_else(|| {
        std::io::Error::new(std::io::ErrorKind::NotFound, "no address")
    })))
}

/// What came back to one HTTP request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Answer {
    /// An HTTP status line began.
    Http,
    /// Nothing before the deadline.
    Nothing,
    /// The connection closed, or failed, without an answer.
    Closed,
    /// Bytes that are not HTTP.
    NotHttp,
}

impl Answer {
    fn as_str(self) -> &'static str {
        match self {
            Self::Http => "an HTTP answer",
            Self::Nothing => "it sent nothing",
            Self::Closed => "it closed the connection",
            Self::NotHttp => "it answered something other than HTTP",
        }
    }
}

/// Sends `GET path` and reads the first bytes of the answer within `timeout`.
fn http_answer(stream: &mut TcpStream, host_port: &str, path: &str, timeout: Duration) -> Answer {
    let request = format!("GET {path} HTTP/1.1\r\nHost: {host_port}\r\nConnection: close\r\n\r\n");
    let deadline = Instant::now() + timeout;
    if stream.set_write_timeout(Some(timeout)).is_err()
        || stream.write_all(request.as_bytes()).is_err()
    {
        return Answer::Closed;
    }
    let mut head = [0u8; 5];
    let mut read = 0;
    while read < head.len() {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() || stream.set_read_timeout(Some(left)).is_err() {
            return Answer::Nothing;
        }
        match stream.read(&mut head[read..]) {
            Ok(0) => return Answer::Closed,
            Ok(n) => read += n,
            Err(err) if err.kind() == std::io::ErrorKind::Interrupted => {}
            Err(err)
                if matches!(
                    err.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) =>
            {
                return Answer::Nothing;
            }
            Err(_) => return Answer::Closed,
        }
    }
    if &head == b"HTTP/" {
        Answer::Http
    } else {
        Answer::NotHttp
    }
}

/// `HOST:PORT` and path of an `http://HOST:PORT/...` metadata server; `None` for other
/// kinds (etcd, `P2PHANDSHAKE`), which are not checked.
pub(super) fn http_host_port(metadata_server: &str) -> Option<(&str, &str)> {
    let rest = metadata_server.strip_prefix("http://")?;
    Some(match rest.find('/') {
        Some(slash) => (&rest[..slash], &rest[slash..]),
        None => (rest, "/"),
    })
}

#[cfg(test)]
mod tests {
    use std::net::TcpListener;

    use super::*;

    #[test]
    fn metadata_host_port_and_path_are_read_from_http_urls_only() {
        assert_eq!(
            http_host_port("http://127.0.0.1:8080/metadata"),
            Some(("127.0.0.1:8080", "/metadata"))
        );
        assert_eq!(http_host_port("http://h:1"), Some(("h:1", "/")));
        assert_eq!(http_host_port("etcd://h:2379"), None);
        assert_eq!(http_host_port("P2PHANDSHAKE"), None);
    }

    #[test]
    fn an_unreachable_master_fails_fast_naming_the_setting() -> Result<(), std::io::Error> {
        let port = TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
        let err = check_reachable("mooncake.master_address", &format!("127.0.0.1:{port}"))
            .expect_err("nothing listens there");
        assert_eq!(err.kind(), "unreachable");
        assert!(err.to_string().contains("mooncake.master_address"), "{err}");
        Ok(())
    }

    /// A listener that answers every connection with `answer` once it read the request.
    fn answering(answer: &'static [u8]) -> Result<String, std::io::Error> {
        let listener = TcpListener::bind("127.0.0.1:0")?;
        let address = listener.local_addr()?.to_string();
        std::thread::spawn(move || {
            if let Ok((mut stream, _)) = listener.accept() {
                let mut request = [0u8; 256];
                let _ = stream.read(&mut request);
                let _ = stream.write_all(answer);
            }
        });
        Ok(address)
    }

    fn settings(metadata_server: String) -> MooncakeSettings {
        MooncakeSettings {
            metadata_server,
            master_address: "10.0.0.5:50051".into(),
            rpc_timeout_ms: 200,
            ..MooncakeSettings::default()
        }
    }

    #[test]
    fn any_http_answer_passes_and_other_bytes_name_the_setting() -> Result<(), std::io::Error> {
        let http = answering(b"HTTP/1.1 400 Bad Request\r\n\r\n")?;
        check_metadata_answers(&settings(format!("http://{http}/metadata")))
            .map_err(std::io::Error::other)?;
        let other = answering(b"\x00\x01binary")?;
        let url = format!("http://{other}/metadata");
        let err = check_metadata_answers(&settings(url.clone())).expect_err("not HTTP");
        assert_eq!(err.kind(), "metadata_silent");
        let message = err.to_string();
        assert!(message.contains(&url), "{message}");
        assert!(message.contains("something other than HTTP"), "{message}");
        assert!(
            message.contains("http://10.0.0.5:8080/metadata"),
            "a value that works: {message}"
        );
        Ok(())
    }

    #[test]
    fn a_metadata_server_that_accepts_and_never_answers_is_named() -> Result<(), std::io::Error> {
        let listener = TcpListener::bind("127.0.0.1:0")?;
        let url = format!("http://{}/metadata", listener.local_addr()?);
        let err = check_metadata_answers(&settings(url)).expect_err("never answers");
        assert_eq!(err.kind(), "metadata_silent");
        assert!(err.to_string().contains("it sent nothing"), "{err}");
        assert!(
            err.to_string().contains("mooncake.metadata_server"),
            "{err}"
        );
        drop(listener);
        Ok(())
    }

    #[test]
    fn other_metadata_kinds_are_not_checked() {
        assert!(check_metadata_answers(&settings("P2PHANDSHAKE".into())).is_ok());
    }
}
