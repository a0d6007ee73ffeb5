//! `share_cores::yield_to_servers` lowers every thread of the process, those
//! made before the call and those made after, and never past the lowest
//! priority. (A test binary of its own: the call lowers the whole process.)

use std::sync::mpsc;

use ps_worker::share_cores::{current_nice, yield_to_servers};

#[test]
fn every_thread_before_and_after_is_lowered_and_never_past_19() {
    let before = current_nice().unwrap();
    let (go, wait) = mpsc::channel::<()>();
    let earlier = std::thread::spawn(move || {
        wait.recv().unwrap();
        current_nice().unwrap()
    });
    let lowered = yield_to_servers(3).unwrap();
    assert_eq!(lowered, (before + 3).min(19));
    go.send(()).unwrap();
    assert_eq!(
        earlier.join().unwrap(),
        lowered,
        "a thread made before the call"
    );
    let later = std::thread::spawn(|| current_nice().unwrap());
    assert_eq!(
        later.join().unwrap(),
        lowered,
        "a thread made after the call"
    );
    assert_eq!(
        yield_to_servers(19).unwrap(),
        19,
        "held at the lowest priority"
    );
}
